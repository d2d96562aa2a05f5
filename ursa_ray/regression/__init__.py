"""The deep-regression benchmark's own pieces: the exact anchor model and the test-point table."""

from ursa_ray.regression.anchor import anchor_for_dataset, anchor_predictive

__all__ = ["anchor_for_dataset", "anchor_predictive"]
