"""What the agent patches into torch, and what runs on the training thread: the hot path.

Every function here may run inside a training step, once per collective or per module call, so each does
the least it can: it takes a clock reading or two, reads plain attributes of the hot state (``state``) and
pushes one raw record's fields onto its bounded ring (``state.Ring``). Nothing here makes a record, takes a lock the recorder holds,
does I/O, or raises into training (an exception is counted in ``HotState.hook_errors`` and dropped).

- ``collectives``: the torch.distributed wrappers (sync and async, with the async Work's wait), and what each
  call pushes; ``issuers`` names the framework that issued a call, by its caller's file.
- ``ddp``: DDP's bucket all-reduces, through a communication hook (its C++ reducer bypasses the wrappers).
- ``phases``: forward, backward and optimizer boundaries, and the step's start and end.
- ``cuda``: CUDA events around a collective in the steps timed on the device, and the allocator's OOM
  observer; nothing of it runs without a GPU.
- ``state``: the hot state, its two queues (a ring of references in C, ``_ring.c``, where setup.py built it; a deque
  of tuples where not), the raw records' layout (``RAW_*``, ``AT_*``) and the clocks.

The recorder (zeromon_agent.recorder) takes the queues' records, as tuples, on its own thread; the memory samples
(zeromon_agent.memory) are taken at the phase ends these hooks mark.
"""
