"""The shape every evaluation probe has, and the forward passes they share: one posterior sample's outputs
on an evaluation set, in batches, under the evaluation's autocast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import Tensor

from ursa_ray.evaluation.predictions import prediction_table

if TYPE_CHECKING:
    from ursa_ray.prepare import PreparedTrial

EVAL_BATCH = 2048


def predict(predictor: Any, x: Tensor, precision: torch.dtype | None = None) -> Tensor:
    """Outputs of one posterior sample on ``x`` in batches, as float32, under autocast to ``precision``."""
    with (
        torch.no_grad(),
        torch.autocast(x.device.type, dtype=precision or torch.float32, enabled=precision is not None),
    ):
        out = torch.cat([predictor(x[i : i + EVAL_BATCH]).float() for i in range(0, x.shape[0], EVAL_BATCH)])
    if not torch.isfinite(out).all():
        raise FloatingPointError("the network produced non-finite outputs")
    return out


def predict_expected_entropy(predictor: Any, x: Tensor, precision: torch.dtype | None = None) -> Tensor | None:
    """A predictor's own estimate of the expected entropy on ``x`` (shape n, float32), in batches under
    autocast to ``precision``, when it has a ``distilled_expected_entropy(x)`` method (GPED's head), else None:
    the accumulator then computes H[p_s] from the sample's logits (see ``ClassificationPredictive``)."""
    head = getattr(predictor, "distilled_expected_entropy", None)
    if head is None:
        return None
    return predict(head, x, precision)


def accumulate(accumulator: Any, predictor: Any, x: Tensor, precision: torch.dtype | None) -> None:
    """Add ``predictor``'s outputs on ``x`` to ``accumulator``, with its distilled expected entropy where it
    has one (classification only; see :func:`predict_expected_entropy`)."""
    outputs = predict(predictor, x, precision)
    entropy = predict_expected_entropy(predictor, x, precision)
    if entropy is None:
        accumulator.update(outputs)
    else:
        accumulator.update(outputs, expected_entropy=entropy)


class Probe:
    """One family of a trial's metrics.  The trial calls :meth:`observe` with each posterior sample (in the
    order of registration, :data:`ursa_ray.evaluation.probes.PROBES`), then :meth:`compute` once for the
    metric tables by evaluation-set name, and :meth:`rows` for the per-example prediction tables by set
    name when it saves predictions.  ``seconds``: the probe's time (its observations, timed by the trial,
    and any work of its own it adds, such as an attack), charged to the trial-row column ``clock``."""

    clock = "eval_s"

    def __init__(self) -> None:
        self.seconds = 0.0

    def observe(self, predictor: Any) -> None:
        """Add one posterior sample."""

    def compute(self) -> dict[str, dict[str, float]]:
        """Metric tables by evaluation-set name."""
        return {}

    def rows(self) -> dict[str, pd.DataFrame]:
        """Prediction tables (:func:`prediction_table`) by evaluation-set name."""
        return {}


@dataclass
class ProbeContext:
    """What a probe is built from: the prepared trial, the posterior predictive accumulated on each of its
    float32 evaluation sets (shared: the probe that observes a set fills it, others read it), and the
    method's sample plan ``sample_plan() -> (samples per chain, chains, chains run in turn)``, which says
    where in the stream the attacker's kept samples fall."""

    trial: PreparedTrial
    predictives: dict[str, Any]
    sample_plan: Callable[[], tuple[int, int, bool]]


class SetsProbe(Probe):
    """Accumulates the posterior predictive on the named evaluation sets (into the shared predictives)."""

    def __init__(self, context: ProbeContext, names: list[str]) -> None:
        super().__init__()
        self.context, self.names = context, names

    def observe(self, predictor: Any) -> None:
        trial = self.context.trial
        for name in self.names:
            accumulate(self.context.predictives[name], predictor, trial.eval_sets[name][0], trial.precision)

    def rows(self) -> dict[str, pd.DataFrame]:
        sets = self.context.trial.eval_sets
        return {
            name: prediction_table(self.context.predictives[name], None if y is None else y.numpy())
            for name in self.names
            for y in [sets[name][1]]
        }
