"""Examples run from the repository root (`python -m examples.deepresearch.evaluate ...`); not installed."""
