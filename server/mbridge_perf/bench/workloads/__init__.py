"""Workloads the benchmark tools can launch without a GPU (tests, CI)."""
