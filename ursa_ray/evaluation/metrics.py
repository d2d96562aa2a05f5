"""Metrics of a posterior predictive, as defined by URSABench (Vadera et al. 2020).

Conventions: ``probs`` is an n×K array of predictive class probabilities (rows sum to 1), ``labels`` an
array of n integer class indices.  Arrays go in (numpy, or CPU/GPU torch tensors which are copied to
numpy), python floats come out.  Logarithms are natural.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from scipy.special import entr
from sklearn.metrics import average_precision_score, roc_auc_score
from torch import Tensor

from ursa_ray.evaluation.predictive import RegressionPredictive

ArrayLike = np.ndarray | Tensor


class ClassificationSummary(Protocol):
    """What the classification metrics read of a posterior predictive: an accumulator
    (:class:`~ursa_ray.evaluation.predictive.ClassificationPredictive`) or a saved prediction table
    (:class:`~ursa_ray.evaluation.predictions.SavedPredictive`)."""

    mean_probs: np.ndarray
    total_entropy: np.ndarray
    mutual_information: np.ndarray


def _to_numpy(values: ArrayLike) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _checked(probs: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = np.ascontiguousarray(_to_numpy(probs), dtype=np.float64)  # one summation order, whatever the layout
    y = _to_numpy(labels).astype(np.int64, copy=False)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise ValueError(f"expected probs n×K and labels (n,), got {p.shape} and {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"labels must lie in [0, {p.shape[1]}), got range [{y.min()}, {y.max()}]")
    return p, y


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """(1/n) Σ_i 1[argmax_k p_ik = y_i]."""
    p, y = _checked(probs, labels)
    return float(np.mean(p.argmax(axis=1) == y))


def nll(probs: ArrayLike, labels: ArrayLike, smoothing: float = 1e-4) -> float:
    """Smoothed negative log-likelihood, URSABench's form.

    p'_ik = (1 − ε) p_ik + ε / K,  NLL = −(1/n) Σ_i log p'_{i, y_i}  with ε = ``smoothing``.
    ε = 0 gives the plain NLL (infinite if a true class has probability 0).
    """
    p, y = _checked(probs, labels)
    k = p.shape[1]
    p_true = (1.0 - smoothing) * p[np.arange(len(y)), y] + smoothing / k
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.log(p_true)))


def brier(probs: ArrayLike, labels: ArrayLike) -> float:
    """(1/n) Σ_i Σ_k (p_ik − 1[y_i = k])²."""
    p, y = _checked(probs, labels)
    one_hot = np.zeros_like(p)
    one_hot[np.arange(len(y)), y] = 1.0
    return float(np.mean(np.sum((p - one_hot) ** 2, axis=1)))


def expected_calibration_error(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """ECE = Σ_b (|B_b| / n) · |acc(B_b) − conf(B_b)|.

    Confidence c_i = max_k p_ik; bin b = 1..``n_bins`` holds the examples with c_i in ((b−1)/B, b/B]
    (equal width, open below, closed above); acc and conf are the bin's mean correctness and mean
    confidence.  Since (|B|/n)·|acc − conf| = |Σ_{i∈B} (1[correct_i] − c_i)| / n, that is what is summed.
    """
    p, y = _checked(probs, labels)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    edges = np.arange(n_bins + 1) / n_bins  # i / B correctly rounded, so 0.2 is exactly edge 3 of 15
    # side="left": c == edges[j] gives j, i.e. bin (edges[j-1], edges[j]]; clip catches c ≈ 1 + rounding.
    bin_index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
    gap = np.bincount(bin_index, weights=correct - confidence, minlength=n_bins)
    return float(np.sum(np.abs(gap)) / len(y))


def _auroc_aupr(is_positive: np.ndarray, score: np.ndarray) -> tuple[float, float]:
    return float(roc_auc_score(is_positive, score)), float(average_precision_score(is_positive, score))


def misclassification_detection(
    probs: ArrayLike, labels: ArrayLike, mutual_information: ArrayLike
) -> dict[str, float]:
    """How well uncertainty scores flag the predictive's own errors (positives = misclassified).

    Scores: −max_k p_ik (``maxprob``), the predictive entropy −Σ_k p_ik log p_ik (``entropy``) and the
    mutual information (``mi``).  Returns AUROC and AUPR (sklearn ``roc_auc_score`` and
    ``average_precision_score``) for each; all NaN when every prediction is right or every one wrong.
    """
    p, y = _checked(probs, labels)
    mi = _to_numpy(mutual_information).astype(np.float64, copy=False)
    if mi.shape != y.shape:
        raise ValueError(f"expected mutual_information of shape {y.shape}, got {mi.shape}")
    errors = p.argmax(axis=1) != y
    scores = {"maxprob": -p.max(axis=1), "entropy": entr(p).sum(axis=1), "mi": mi}
    out: dict[str, float] = {}
    for name, score in scores.items():
        auroc, aupr = (math.nan, math.nan) if errors.all() or not errors.any() else _auroc_aupr(errors, score)
        out[f"misclass_auroc_{name}"] = auroc
        out[f"misclass_aupr_{name}"] = aupr
    return out


def ood_detection(
    in_total_entropy: ArrayLike, in_mi: ArrayLike, ood_total_entropy: ArrayLike, ood_mi: ArrayLike
) -> dict[str, float]:
    """AUROC of separating an out-of-distribution set (label 1) from the in-distribution test set
    (label 0), scored by total predictive entropy and by mutual information."""
    is_ood = np.concatenate([np.zeros(len(in_total_entropy)), np.ones(len(ood_total_entropy))])
    entropy = np.concatenate([_to_numpy(in_total_entropy), _to_numpy(ood_total_entropy)])
    mi = np.concatenate([_to_numpy(in_mi), _to_numpy(ood_mi)])
    if mi.shape != entropy.shape:
        raise ValueError("entropy and mutual information arrays must have matching lengths")
    return {
        "ood_auroc_entropy": float(roc_auc_score(is_ood, entropy)),
        "ood_auroc_mi": float(roc_auc_score(is_ood, mi)),
    }


def decision_cost(probs: ArrayLike, labels: ArrayLike, cost_matrix: ArrayLike) -> float:
    """Mean cost of Bayes decisions: d_i = argmin_d Σ_y p_iy C[y, d], cost = (1/n) Σ_i C[y_i, d_i].

    ``cost_matrix`` C is K×D, indexed [true class, decision].  (URSABench reports the sum over the test
    set; this is that sum divided by n.)
    """
    p, y = _checked(probs, labels)
    c = _to_numpy(cost_matrix).astype(np.float64, copy=False)
    if c.ndim != 2 or c.shape[0] != p.shape[1]:
        raise ValueError(f"expected a cost matrix with {p.shape[1]} rows, got shape {c.shape}")
    decisions = (p @ c).argmin(axis=1)
    return float(np.mean(c[y, decisions]))


def classification_metrics(
    pred: ClassificationSummary, labels: ArrayLike, cost_matrix: ArrayLike | None = None
) -> dict[str, float]:
    """All in-distribution metrics of a classification predictive.

    Keys: accuracy, nll (ε = 1e-4), brier, ece (15 bins), the six ``misclass_*`` keys, ``mean_entropy``
    (mean total predictive entropy), ``mean_mi`` (mean mutual information) and, when ``cost_matrix`` is
    given, ``decision_cost``.
    """
    probs = pred.mean_probs
    mi = pred.mutual_information
    out = {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        **misclassification_detection(probs, labels, mi),
        "mean_entropy": float(np.mean(pred.total_entropy)),
        "mean_mi": float(np.mean(mi)),
    }
    if cost_matrix is not None:
        out["decision_cost"] = decision_cost(probs, labels, cost_matrix)
    return out


def ood_metrics(in_pred: ClassificationSummary, ood_pred: ClassificationSummary) -> dict[str, float]:
    """:func:`ood_detection` on two accumulated predictives (in-distribution test set, OOD set)."""
    return ood_detection(
        in_pred.total_entropy, in_pred.mutual_information, ood_pred.total_entropy, ood_pred.mutual_information
    )


def regression_metrics(
    pred: RegressionPredictive,
    noise_std: float,
    *,
    truth: ArrayLike | None = None,
    observed: ArrayLike | None = None,
) -> dict[str, float]:
    """Metrics of a regression predictive; each name has one meaning on every evaluation set.

    With m = ``pred.mean``, s = ``pred.std`` (the epistemic spread across posterior samples, S − 1
    divisor) and σ = ``noise_std`` (the known observation noise):

    * ``mean_std`` = (1/n) Σ_i s_i, always;
    * against the noise-free truth t (``truth``; a synthetic set's test targets), the epistemic metrics:
      ``rmse_truth`` = √((1/n) Σ_i (m_i − t_i)²) and
      ``coverage_95_epistemic`` = (1/n) Σ_i 1[|m_i − t_i| ≤ 1.96 s_i];
    * against noisy observations y = t + ε (``observed``; the validation split), the predictive metrics
      under N(m_i, v_i) with v_i = s_i² + σ²: ``rmse`` = √((1/n) Σ_i (y_i − m_i)²),
      ``nll`` = (1/n) Σ_i [½ log(2π v_i) + (y_i − m_i)² / (2 v_i)] and
      ``coverage_95_predictive`` = (1/n) Σ_i 1[|y_i − m_i| ≤ 1.96 √v_i].

    A set gets the metrics of the targets it has: give ``truth``, ``observed`` or both.
    """
    if truth is None and observed is None:
        raise ValueError("give the noise-free truth, the noisy observed targets, or both")
    mean, std = pred.mean, pred.std

    def targets(values: ArrayLike, what: str) -> np.ndarray:
        array = _to_numpy(values).astype(np.float64, copy=False).reshape(-1)
        if array.shape != mean.shape:
            raise ValueError(f"expected {what} with {mean.shape[0]} values, got {array.shape[0]}")
        return array

    out = {"mean_std": float(np.mean(std))}
    if truth is not None:
        error = np.abs(mean - targets(truth, "truth"))
        out["rmse_truth"] = float(np.sqrt(np.mean(error**2)))
        out["coverage_95_epistemic"] = float(np.mean(error <= 1.96 * std))
    if observed is not None:
        error = np.abs(targets(observed, "observed targets") - mean)
        var = std**2 + float(noise_std) ** 2
        out["rmse"] = float(np.sqrt(np.mean(error**2)))
        out["nll"] = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * error**2 / var))
        out["coverage_95_predictive"] = float(np.mean(error <= 1.96 * np.sqrt(var)))
    return out
