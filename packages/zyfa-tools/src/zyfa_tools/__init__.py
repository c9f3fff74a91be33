"""ZYFA tools: inputs that behave like real activations, accuracy evaluation, benchmarks."""

__version__ = "0.1.0"
