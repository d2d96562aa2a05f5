"""The calibration probe: post-hoc temperature scaling (Guo et al. 2017) of a final classification trial whose
method entry says ``calibrate: temperature`` (docs/metrics.md, "Temperature scaling").

The probe accumulates the posterior predictive on the held-out validation split like any other set
(:func:`ursa_ray.prepare.split_sets` makes it; memory does not grow with the samples) and reports nothing of
its own.  Once every probe has computed, the trial fits one temperature T on it
(:func:`~ursa_ray.evaluation.predictions.validation_temperature`: the NLL of the tempered log predictive,
Ashukha et al. 2020's form) and :func:`calibrated_sets` scores every set again under the predictive tempered
by T, as ``SET@calibrated``: a post-step over the probes' prediction tables, the very tables
:func:`~ursa_ray.evaluation.predictions.metrics_from_predictions` reads back, so saved predictions reproduce
the calibrated metrics bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ursa_ray import eval_sets
from ursa_ray.evaluation.adversarial import metrics_from_adversarial_tables
from ursa_ray.evaluation.metrics import TemperedPredictive, classification_metrics
from ursa_ray.evaluation.predictions import SavedPredictive, calibrated_metrics
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, SetsProbe

VALIDATION = eval_sets.VALIDATION


class ValidationProbe(SetsProbe):
    """Accumulates the predictive on the validation split; its table (:meth:`rows`) is what T is fitted on,
    and its ``seconds`` (the eval clock) hold the split's forward passes and, added by the trial, the fit."""


def calibrated_sets(
    tables: Mapping[str, pd.DataFrame], temperature: float, cost_matrix: np.ndarray | None
) -> dict[str, dict[str, float]]:
    """``SET@calibrated`` metrics of every test, OOD, corruption and attack set in ``tables`` (prediction tables
    by set name, the probes' :meth:`~ursa_ray.evaluation.probes.base.Probe.rows`) under the predictive
    tempered by ``temperature``: the test and OOD sets as
    :func:`~ursa_ray.evaluation.predictions.calibrated_metrics` (the test set's with the temperature, as
    ``validation_temperature``), each corruption set's in-domain metrics, each
    attack's sets as :func:`~ursa_ray.evaluation.adversarial.metrics_from_adversarial_tables`.  Sets at a
    lower bit depth have no calibrated twin."""
    kinds = {name: eval_sets.eval_kind(name) for name in tables}
    test = SavedPredictive(tables[eval_sets.TEST])
    ood = {name: SavedPredictive(table) for name, table in tables.items() if kinds[name] == "ood"}
    out = calibrated_metrics(test, test.labels, ood, temperature, cost_matrix)
    for name in (n for n, kind in kinds.items() if kind == "corruption"):
        corrupted = SavedPredictive(tables[name])
        tempered = TemperedPredictive(corrupted, temperature)
        out[eval_sets.calibrated(name)] = classification_metrics(tempered, corrupted.labels, cost_matrix)
    for kind, named in (("adversarial", eval_sets.adversarial), ("transfer", eval_sets.transfer)):
        attacked = {eval_sets.crafted_set(n): t for n, t in tables.items() if kinds[n] == kind}
        if attacked:
            for crafted, table in metrics_from_adversarial_tables(attacked, temperature).items():
                out[eval_sets.calibrated(named(crafted))] = table
    return out


def probes(context: ProbeContext) -> list[Probe]:
    """The validation split's probe in a final trial that calibrates, else none."""
    trial = context.trial
    wanted = trial.spec.phase == "final" and trial.spec.calibrate is not None and VALIDATION in trial.eval_sets
    return [ValidationProbe(context, [VALIDATION])] if wanted else []
