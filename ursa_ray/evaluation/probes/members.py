"""The ensemble-members probe: an ensemble's test metrics after each member, the curve the deep-ensemble
equivalent reads (Ashukha, Lyzhov, Molchanov & Vetrov 2020, "Pitfalls of in-domain uncertainty estimation and
ensembling in deep learning", §4: DEE of a method is the number of deep-ensemble members whose calibrated
log-likelihood equals the method's, ``analysis.dee``).

In a final classification trial of a method whose samples are ensemble members
(:attr:`~ursa_ray.methods.base.Method.member_curve`: ``deep_ensemble``), after the m-th member the test
predictive accumulated so far is the ensemble of the first m members; its in-domain metrics
(:func:`~ursa_ray.evaluation.probes.in_domain.in_domain_metrics`, ``nll_calibrated`` among them) become the
set ``members:m``.  It reads the test accumulator the in-domain probe fills (registered after it), so it keeps
nothing per member but the metric table, and, where the trial saves predictions, the m-member prediction table
(M tables of the test set's size: what recomputing the curve from saved tables needs).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ursa_ray import eval_sets
from ursa_ray.evaluation.predictions import prediction_table
from ursa_ray.evaluation.probes.base import Probe, ProbeContext
from ursa_ray.evaluation.probes.in_domain import in_domain_metrics


class MemberCurveProbe(Probe):
    """``members:m`` metrics (and prediction tables when saved) of the first m members, m = 1 … M."""

    def __init__(self, context: ProbeContext) -> None:
        super().__init__()
        self.context = context
        self.curve: dict[str, dict[str, float]] = {}
        self.tables: dict[str, pd.DataFrame] = {}

    def observe(self, predictor: Any) -> None:
        trial = self.context.trial
        test, labels = self.context.predictives[eval_sets.TEST], trial.eval_sets[eval_sets.TEST][1]
        name = eval_sets.members(test.n_samples)
        self.curve[name] = in_domain_metrics(trial.ds, test, labels, eval_sets.TEST)
        if trial.spec.save_predictions:
            self.tables[name] = prediction_table(test, labels.numpy())

    def compute(self) -> dict[str, dict[str, float]]:
        return self.curve

    def rows(self) -> dict[str, pd.DataFrame]:
        return self.tables


def probes(context: ProbeContext) -> list[Probe]:
    """The curve's probe in final classification trials of an ensemble method; none elsewhere."""
    trial = context.trial
    applies = trial.spec.phase == "final" and trial.ds.task == "classification" and trial.method.member_curve
    return [MemberCurveProbe(context)] if applies and eval_sets.TEST in context.predictives else []
