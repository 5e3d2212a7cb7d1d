"""What the recorder publishes for live readers, and the one consistent copy a reader takes of it.

The recorder publishes a pass's records, totals and newest samples in one hold of a lock (``published``:
LiveViews; ``totals``: the running counts behind the metrics; ``recent``: the newest records, kept as the
compact columns the recorder made them in). A reader (the endpoint's threads, a trainer's logger on the
training thread) copies them under that lock in tens of microseconds and derives the rest outside it
(``view``: LiveData and View; ``figures``: the newest step's figures as one immutable value).
"""
