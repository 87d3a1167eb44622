"""One script per measured job; run each with ``python bench/run.py NAME``."""
