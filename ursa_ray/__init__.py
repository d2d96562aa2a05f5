"""ursa-ray: benchmarking approximate Bayesian inference for deep networks on Ray Tune."""

__version__ = "0.1.0"
