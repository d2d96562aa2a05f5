"""The in-domain probe: the posterior predictive's metrics on the labelled set a phase evaluates on (the test
set, or the search phase's validation split): :func:`~ursa_ray.evaluation.metrics.classification_metrics` or
:func:`~ursa_ray.evaluation.metrics.regression_metrics` (docs/metrics.md)."""

from __future__ import annotations

from ursa_ray.evaluation.probes.base import Probe, ProbeContext, SetsProbe


class LabelledSetsProbe(SetsProbe):
    """In-domain metrics (``context.evaluate``) of each named set that has targets."""

    def compute(self) -> dict[str, dict[str, float]]:
        trial, predictives = self.context.trial, self.context.predictives
        return {
            name: self.context.evaluate(trial.ds, predictives[name], y, name)
            for name in self.names
            for y in [trial.eval_sets[name][1]]
            if y is not None
        }


def probes(context: ProbeContext) -> list[Probe]:
    """The test set's probe, or the validation split's in the search phase."""
    return [LabelledSetsProbe(context, [n for n in context.trial.eval_sets if n in ("test", "validation")])]
