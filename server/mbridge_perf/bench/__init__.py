"""Benchmark runs: measurement contract, log parser, results and A/B, launch and run registry."""
