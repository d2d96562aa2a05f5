"""A trial spec made by hand, for the tests of code that only reads a few of its fields (the driver's rows and
progress lines, a regression trial's points): every field has a plain value, ``changes`` replace some.  A real
spec comes from a grid (:meth:`ursa_ray.grid.Grid.spec_for`)."""

from __future__ import annotations

from typing import Any

from ursa_ray.spec import TrialSpec

DEFAULTS: dict[str, Any] = {
    "phase": "final",
    "method": "sgd",
    "label": "sgd",
    "model": "mlp",
    "model_options": {},
    "dataset": "digits",
    "task": "classification",
    "decision_task": False,
    "dataset_options": {},
    "dataset_file": None,
    "complexity": None,
    "ood": (),
    "seed": 0,
    "config": {},
    "save_predictions": False,
    "bit_depths": (),
    "precision": None,
    "corruptions": {},
    "adversarial": {},
    "data_root": None,
    "download": False,
    "resources": {"cpu": 1, "gpu": 0, "custom": {}},
    "cell": "sgd/mlp/digits",
    "trial_id": "t0",
}


def hand_spec(**changes: Any) -> TrialSpec:
    """A :class:`TrialSpec` of :data:`DEFAULTS` with ``changes``."""
    return TrialSpec(**{**DEFAULTS, **changes})
