"""Benchmark workloads and the ``silbo bench`` commands."""
