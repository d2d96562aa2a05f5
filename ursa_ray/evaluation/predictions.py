"""Saved predictions: the table a classification trial writes for each evaluation set, and every
classification metric recomputed from those tables alone.

A table holds, per example: ``index``, ``label`` (−1 on OOD sets), the posterior-predictive class
probabilities ``p0 … p{K−1}`` and the three uncertainties the metrics use (``total_entropy`` H[p̄],
``expected_entropy`` (1/S) Σₛ H[pₛ] and ``mutual_information``), plus ``n_samples``.  The metrics read
exactly these float64 columns, so :func:`metrics_from_predictions` reproduces every reported
classification metric to the last bit, the ``@calibrated`` sets of temperature scaling included (from the
saved ``validation`` table, which a trial with ``calibrate: temperature`` writes beside the others).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ursa_ray import eval_sets
from ursa_ray.evaluation.metrics import (
    ClassificationSummary,
    TemperedPredictive,
    classification_metrics,
    fit_temperature,
    ood_metrics,
)
from ursa_ray.evaluation.predictive import ClassificationPredictive


def prediction_table(pred: ClassificationPredictive, labels: np.ndarray | None) -> pd.DataFrame:
    """The saved form of an accumulated predictive (``labels`` None for an OOD set)."""
    probs = pred.mean_probs
    table = pd.DataFrame(probs, columns=[f"p{k}" for k in range(probs.shape[1])])
    table.insert(0, "label", -1 if labels is None else np.asarray(labels))
    table.insert(0, "index", np.arange(len(table)))
    table["total_entropy"] = pred.total_entropy
    table["expected_entropy"] = pred.expected_entropy
    table["mutual_information"] = pred.mutual_information
    table["n_samples"] = pred.n_samples
    return table


class SavedPredictive:
    """A prediction table read back, with the attributes the metrics read from an accumulator."""

    def __init__(self, table: pd.DataFrame) -> None:
        classes = [c for c in table.columns if c.startswith("p") and c[1:].isdigit()]
        self.mean_probs = table[sorted(classes, key=lambda c: int(c[1:]))].to_numpy(np.float64)
        self.total_entropy = table["total_entropy"].to_numpy(np.float64)
        self.expected_entropy = table["expected_entropy"].to_numpy(np.float64)
        self.mutual_information = table["mutual_information"].to_numpy(np.float64)
        self.labels = table["label"].to_numpy(np.int64)
        self.n_samples = int(table["n_samples"].iloc[0])


def validation_temperature(validation: ClassificationSummary, labels: np.ndarray) -> float:
    """Temperature scaling's T, fitted on the validation split's predictive
    (:func:`~ursa_ray.evaluation.metrics.fit_temperature`)."""
    return fit_temperature(validation.mean_probs, labels)


def calibrated_metrics(
    test: ClassificationSummary,
    labels: np.ndarray,
    ood: Mapping[str, ClassificationSummary],
    temperature: float,
    cost_matrix: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """``test@calibrated``: the in-domain metrics of the test predictive tempered by ``temperature``
    (:class:`~ursa_ray.evaluation.metrics.TemperedPredictive`), with ``validation_temperature`` = T; and
    ``OOD@calibrated`` for each OOD set: detection with the test and the OOD predictive both tempered by T."""
    tempered = TemperedPredictive(test, temperature)
    out = {
        eval_sets.calibrated(eval_sets.TEST): {
            **classification_metrics(tempered, labels, cost_matrix),
            "validation_temperature": temperature,
        }
    }
    for name, pred in ood.items():
        out[eval_sets.calibrated(name)] = ood_metrics(tempered, TemperedPredictive(pred, temperature))
    return out


def metrics_from_predictions(
    test: pd.DataFrame,
    ood: Mapping[str, pd.DataFrame] | None = None,
    cost_matrix: np.ndarray | None = None,
    validation: pd.DataFrame | None = None,
) -> dict[str, dict[str, float]]:
    """Every classification metric of one trial from its saved tables: ``{"test": {...}, ood_set: {...}}``,
    and, given the ``validation`` table, the temperature fitted on it and the ``@calibrated`` sets
    (:func:`calibrated_metrics`)."""
    in_domain = SavedPredictive(test)
    out = {"test": classification_metrics(in_domain, in_domain.labels, cost_matrix)}
    saved_ood = {name: SavedPredictive(table) for name, table in (ood or {}).items()}
    for name, pred in saved_ood.items():
        out[name] = ood_metrics(in_domain, pred)
    if validation is not None:
        held_out = SavedPredictive(validation)
        temperature = validation_temperature(held_out, held_out.labels)
        out.update(calibrated_metrics(in_domain, in_domain.labels, saved_ood, temperature, cost_matrix))
    return out
