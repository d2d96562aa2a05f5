"""The bit-depth probe: each posterior sample evaluated with its weights stored at lower bit depths
(``SET@SCHEME`` for the test and OOD sets, :func:`~ursa_ray.evaluation.test_time_cost.evaluate_at_bit_depths`;
final classification trials; docs/test-time-cost.md)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ursa_ray import eval_sets
from ursa_ray.evaluation.metrics import ood_metrics
from ursa_ray.evaluation.predictions import prediction_table
from ursa_ray.evaluation.predictive import ClassificationPredictive
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, accumulate
from ursa_ray.evaluation.probes.in_domain import in_domain_metrics
from ursa_ray.evaluation.test_time_cost import evaluate_at_bit_depths


class BitDepthProbe(Probe):
    """The posterior predictive on each full-precision set at each scheme: in-domain metrics of the test set,
    OOD detection of each OOD set against the test set at the same scheme.  Registered first: each scheme
    sees the sample's dropout masks, and the random generators are restored for the float32 probes."""

    clock = "bit_depth_eval_s"

    def __init__(self, context: ProbeContext, schemes: tuple[str, ...]) -> None:
        super().__init__()
        trial = self.trial = context.trial
        self.context, self.schemes = context, schemes
        self.predictives = {  # by (set, scheme); named SET@SCHEME (eval_sets.bit_depth) only in the tables
            (name, scheme): ClassificationPredictive(
                trial.eval_sets[name][0].shape[0], trial.ds.n_outputs, trial.device
            )
            for scheme in schemes
            for name in trial.full_precision_sets
        }

    def observe(self, predictor: Any) -> None:
        def evaluate_stored(scheme: str) -> None:
            for name in self.trial.full_precision_sets:
                x = self.trial.eval_sets[name][0]
                accumulate(self.predictives[name, scheme], predictor, x, self.trial.precision)

        evaluate_at_bit_depths(predictor, evaluate_stored, self.schemes)

    def compute(self) -> dict[str, dict[str, float]]:
        ds, test_y = self.trial.ds, self.trial.eval_sets["test"][1]
        values = {}
        for scheme in self.schemes:
            test = self.predictives["test", scheme]
            values[eval_sets.bit_depth("test", scheme)] = in_domain_metrics(ds, test, test_y, "test")
            for name in ds.ood:
                values[eval_sets.bit_depth(name, scheme)] = ood_metrics(test, self.predictives[name, scheme])
        return values

    def rows(self) -> dict[str, pd.DataFrame]:
        return {
            eval_sets.bit_depth(name, scheme): prediction_table(acc, None if y is None else y.numpy())
            for (name, scheme), acc in self.predictives.items()
            for y in [self.trial.eval_sets[name][1]]
        }


def probes(context: ProbeContext) -> list[Probe]:
    """The grid's ``bit_depths`` in final classification trials, else none."""
    trial = context.trial
    final_classification = trial.spec.phase == "final" and trial.ds.task == "classification"
    schemes = trial.spec.bit_depths if final_classification else ()
    return [BitDepthProbe(context, schemes)] if schemes else []
