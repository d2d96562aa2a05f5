"""The OOD probe: detection of each OOD set against the test set by the posterior predictive's uncertainty
(:func:`~ursa_ray.evaluation.metrics.ood_metrics`, final classification trials; docs/metrics.md).  Other
trials that evaluate OOD sets (regression, the reference) accumulate them for the fidelity probe only."""

from __future__ import annotations

from ursa_ray.evaluation.metrics import ood_metrics
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, SetsProbe


class OODProbe(SetsProbe):
    """OOD detection metrics of each named OOD set, the test set's predictive as in-distribution."""

    def compute(self) -> dict[str, dict[str, float]]:
        trial, predictives = self.context.trial, self.context.predictives
        if trial.spec.phase != "final" or trial.ds.task != "classification":
            return {}
        return {name: ood_metrics(predictives["test"], predictives[name]) for name in self.names}


def probes(context: ProbeContext) -> list[Probe]:
    """One probe over the dataset's OOD sets the trial evaluates (none in the search phase)."""
    names = [n for n in context.trial.ds.ood if n in context.trial.eval_sets]
    return [OODProbe(context, names)] if names else []
