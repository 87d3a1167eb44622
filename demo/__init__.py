"""Demo data for the notebooks, tests and benchmarks (not part of the runtime)."""
