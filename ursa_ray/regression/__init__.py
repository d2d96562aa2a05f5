"""The deep-regression benchmark's own pieces: the exact anchor model and shared training helpers."""

from ursa_ray.regression.anchor import anchor_for_dataset, anchor_predictive

__all__ = ["anchor_for_dataset", "anchor_predictive"]
