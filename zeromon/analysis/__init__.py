"""Pure analysis: data in, dataclasses out (overlap, bandwidth, OOM risk, stragglers, planner)."""
