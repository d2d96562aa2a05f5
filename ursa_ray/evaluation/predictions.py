"""Saved predictions: the table a classification trial writes for each evaluation set, and every
classification metric recomputed from those tables alone.

A table holds, per example: ``index``, ``label`` (−1 on OOD sets), the posterior-predictive class
probabilities ``p0 … p{K−1}`` and the three uncertainties the metrics use (``total_entropy`` H[p̄],
``expected_entropy`` (1/S) Σₛ H[pₛ] and ``mutual_information``), plus ``n_samples``.  The metrics read
exactly these float64 columns, so :func:`metrics_from_predictions` reproduces every reported
classification metric to the last bit, the ``@calibrated`` sets of temperature scaling included (from the
saved ``validation`` table, which a trial with ``calibrate: temperature`` writes beside the others).

A reference trial (docs/fidelity.md) saves its pooled predictive on each set it covers in the same layout
(:func:`reference_prediction_table`), with the reference's checks on that set as constant columns, so that
the ``fidelity:SET`` rows of every method trial of its cell are recomputable from the two trials' tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.special import entr

from ursa_ray import eval_sets
from ursa_ray.evaluation.fidelity import classification_fidelity
from ursa_ray.evaluation.metrics import (
    ClassificationSummary,
    TemperedPredictive,
    classification_metrics,
    fit_temperature,
    ood_metrics,
)

if TYPE_CHECKING:
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


REFERENCE_CHECKS = ("noise_agreement", "noise_total_variation", "noise_kl", "rhat_max", "ess_bulk_min", "converged")
"""The reference's checks on a set, the constant columns of its saved table (:meth:`ursa_ray.reference.Reference.metrics`)."""


def reference_prediction_table(
    probs: np.ndarray, labels: np.ndarray | None, n_samples: int, checks: Mapping[str, float]
) -> pd.DataFrame:
    """The saved form of a reference's pooled predictive ``probs`` (n, K) on one set: the layout of
    :func:`prediction_table` with ``total_entropy`` H[p̄] from ``probs`` and ``expected_entropy`` and
    ``mutual_information`` NaN (a stored reference keeps its pooled probabilities, not its draws), plus
    ``checks`` (its noise floor and convergence on that set, :data:`REFERENCE_CHECKS`) as constant columns."""
    probs = np.asarray(probs, dtype=np.float64)
    table = pd.DataFrame(probs, columns=[f"p{k}" for k in range(probs.shape[1])])
    table.insert(0, "label", -1 if labels is None else np.asarray(labels))
    table.insert(0, "index", np.arange(len(table)))
    table["total_entropy"] = entr(probs).sum(1)
    table["expected_entropy"] = np.nan
    table["mutual_information"] = np.nan
    table["n_samples"] = int(n_samples)
    for name in REFERENCE_CHECKS:
        if name in checks:
            table[name] = float(checks[name])
    return table


def fidelity_from_predictions(method: pd.DataFrame, reference: pd.DataFrame) -> dict[str, float]:
    """A method's ``fidelity:SET`` row from its saved table and its reference's on the same set: agreement,
    total variation and KL (:func:`~ursa_ray.evaluation.fidelity.classification_fidelity`) and the
    reference's checks, where its table has them."""
    scores = classification_fidelity(SavedPredictive(reference).mean_probs, SavedPredictive(method).mean_probs)
    return {**scores, **{name: float(reference[name].iloc[0]) for name in REFERENCE_CHECKS if name in reference}}


def metrics_from_predictions(
    test: pd.DataFrame,
    ood: Mapping[str, pd.DataFrame] | None = None,
    cost_matrix: np.ndarray | None = None,
    validation: pd.DataFrame | None = None,
    reference: Mapping[str, pd.DataFrame] | None = None,
) -> dict[str, dict[str, float]]:
    """Every classification metric of one trial from its saved tables: ``{"test": {...}, ood_set: {...}}``;
    given the ``validation`` table, the temperature fitted on it and the ``@calibrated`` sets
    (:func:`calibrated_metrics`); given ``reference`` (its cell's reference trial's saved tables by set name),
    ``fidelity:SET`` (:func:`fidelity_from_predictions`) on every set both have."""
    in_domain = SavedPredictive(test)
    out = {"test": classification_metrics(in_domain, in_domain.labels, cost_matrix)}
    saved_ood = {name: SavedPredictive(table) for name, table in (ood or {}).items()}
    for name, pred in saved_ood.items():
        out[name] = ood_metrics(in_domain, pred)
    if validation is not None:
        held_out = SavedPredictive(validation)
        temperature = validation_temperature(held_out, held_out.labels)
        out.update(calibrated_metrics(in_domain, in_domain.labels, saved_ood, temperature, cost_matrix))
    own = {eval_sets.TEST: test, **(ood or {})}
    for name, table in (reference or {}).items():
        if name in own:
            out[eval_sets.fidelity(name)] = fidelity_from_predictions(own[name], table)
    return out
