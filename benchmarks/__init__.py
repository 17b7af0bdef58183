"""Benchmarks, run as `python -m benchmarks.<name>` from the repository root (see README.md)."""
