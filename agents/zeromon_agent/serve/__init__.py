"""The agent's endpoint: one HTTP port per rank, rendered from the live views (zeromon_agent.live).

- ``endpoint``: the routes (/metrics, /api/v1/snapshot, /api/v1/stacks, /healthz) and the registry entry
  that lets ``zeromon targets`` find the rank.
- ``httpserver``: a small HTTP/1.0 server with bounded threads and deadlines; slow or hostile clients cannot
  stall it, and the training thread never waits on it.
- ``metrics``: the Prometheus collector (prometheus_client's custom-collector pattern, on a private registry).
- ``snapshot``: the /api/v1/snapshot JSON (schema zeromon.snapshot/1, docs/snapshot.md).
"""
