"""The in-domain probe: the posterior predictive's metrics on the labelled set a phase evaluates on (the test
set, or the search phase's validation split): :func:`~ursa_ray.evaluation.metrics.classification_metrics` or
:func:`~ursa_ray.evaluation.metrics.regression_metrics` (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ursa_ray.data.base import Dataset
from ursa_ray.evaluation.metrics import classification_metrics, regression_metrics
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, SetsProbe


def in_domain_metrics(ds: Dataset, pred: Any, targets: Tensor, eval_set: str) -> dict[str, float]:
    """In-domain metrics of the accumulated posterior predictive against labels, or for regression against
    the noise-free truth (the test set's targets: epistemic metrics) or noisy observations (the validation
    split's targets: predictive metrics), see :func:`~ursa_ray.evaluation.metrics.regression_metrics`."""
    if ds.task == "classification":
        cost = None if ds.cost_matrix is None else ds.cost_matrix.numpy()
        return classification_metrics(pred, targets.numpy(), cost)
    # A regression Dataset's test_y is the noise-free truth; the validation split holds noisy training targets.
    if eval_set == "test" and not ds.test_y_observed:  # else observed targets (data from files)
        return regression_metrics(pred, float(ds.noise_std), truth=targets.numpy())
    return regression_metrics(pred, float(ds.noise_std), observed=targets.numpy())


class LabelledSetsProbe(SetsProbe):
    """In-domain metrics (:func:`in_domain_metrics`) of each named set that has targets."""

    def compute(self) -> dict[str, dict[str, float]]:
        trial, predictives = self.context.trial, self.context.predictives
        return {
            name: in_domain_metrics(trial.ds, predictives[name], y, name)
            for name in self.names
            for y in [trial.eval_sets[name][1]]
            if y is not None
        }


def probes(context: ProbeContext) -> list[Probe]:
    """The test set's probe, or the validation split's in the search phase (a final trial's validation split,
    temperature scaling's, is the calibration probe's: :mod:`~ursa_ray.evaluation.probes.calibration`)."""
    scored = "validation" if context.trial.spec.phase == "search" else "test"
    return [LabelledSetsProbe(context, [n for n in context.trial.eval_sets if n == scored])]
