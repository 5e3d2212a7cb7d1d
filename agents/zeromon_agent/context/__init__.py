"""What the agent knows of the run around it: its settings, what is trained and how, where it runs.

- ``config``: the settings (attach()'s keywords, else the ZEROMON_* variables), each checked.
- ``runinfo``: the framework and its configuration (DeepSpeed, FSDP2, FSDP1, DDP).
- ``attempts``: a torchelastic restart keeps its earlier attempt's recording.
- ``device``: the GPU's readings through NVML, each degrading to None without one.
- ``version``: the agent's version.

Nothing here imports the rest of the agent.
"""
