"""The agent's background thread: raw tuples in; records, step summaries and the rank's file out.

Everything that costs (dtype names, group sizes, ZeRO meanings, clock conversions, encoding, file I/O) runs
here, off the training thread, in passes over what the hooks pushed since the last pass:

- ``loop``: the thread (``Recorder``): a drain pass every few milliseconds, a flush every interval, the stop.
- ``collective_records``: a collective's raw tuple, its wait and its completion into a CollectiveEvent;
  ``step_book`` and ``step_acc``: phase spans, and each step's accumulator and summary.
- ``outbox``: where a pass's records go, the rank's file as it makes them and the live views at the pass's
  end; ``detail``: which steps keep their per-collective detail under ZEROMON_MAX_DISK.
- ``progress``: where the rank is in its collectives, its stalls and its stacks, read off the training thread.

It publishes to zeromon_agent.live and reads nothing above it; the endpoint (zeromon_agent.serve) reads the
live views, never the recorder's own state.
"""
