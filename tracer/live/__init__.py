"""Live mode: the replay app on a running engine (pause, step, add, abort) or on a trace still being written."""
