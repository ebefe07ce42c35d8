"""Lamina load generator and benchmarks."""
