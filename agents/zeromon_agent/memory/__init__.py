"""Memory: what the agent reads of it, when, and the allocator's observers.

- ``readings``: allocator totals, capacity, the process's RSS, and bytes per category from the model and
  optimizer (torch's FSDPMemTracker names), each storage counted once.
- ``watch``: the samples, one at each phase's end (on the training thread, pushed as raw tuples like the
  collectives'), and in the steps that walk the categories, the categories and the peaks.
- ``peaks``: the moments inside the forward and the backward where a walk step looks at memory.
- ``activations``: what autograd saves for the backward, through saved-tensor hooks.

It sits above zeromon_agent.hooks (it pushes to the hot state, and on a GPU uses its CUDA helpers) and knows
nothing of the recorder that turns its samples into records.
"""
