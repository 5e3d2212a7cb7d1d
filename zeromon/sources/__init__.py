"""Sources: readers of external data (profiler traces, configuration files)."""
