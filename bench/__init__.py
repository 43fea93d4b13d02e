"""GPU benchmarks: the reference notebook's stock recipe against the workflow's train stage (BENCHMARKS.md)."""
