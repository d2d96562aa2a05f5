"""Metrics of a posterior predictive, as defined by URSABench (Vadera et al. 2020).

Conventions: ``probs`` is an n×K array of predictive class probabilities (rows sum to 1), ``labels`` an
array of n integer class indices.  Arrays go in (numpy, or CPU/GPU torch tensors which are copied to
numpy), python floats come out.  Logarithms are natural.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Protocol

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import entr, log_softmax
from scipy.stats import norm
from sklearn.metrics import confusion_matrix_at_thresholds

if TYPE_CHECKING:  # torch only in annotations: the report (analysis/) reads saved tables without importing torch
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
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(values, torch.Tensor):
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


def adaptive_calibration_error(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """Adaptive (equal-mass) ECE (Nixon et al. 2019, "Measuring calibration in deep learning").

    The examples, in ascending order of confidence c_i = max_k p_ik (a stable sort, so ties keep the
    order they are given in), are cut into ``n_bins`` bins of equal count (``numpy.array_split``: the
    first n mod B bins get one more); ACE = Σ_b (|B_b| / n) · |acc(B_b) − conf(B_b)| =
    Σ_b |Σ_{i∈B_b} (1[correct_i] − c_i)| / n, as :func:`expected_calibration_error` sums it.
    """
    p, y = _checked(probs, labels)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    order = np.argsort(confidence, kind="stable")
    gaps = [np.sum(correct[b] - confidence[b]) for b in np.array_split(order, n_bins)]
    return float(np.sum(np.abs(gaps)) / len(y))


def risk_coverage_curve(errors: ArrayLike, confidence: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The selective risk at every coverage (Geifman & El-Yaniv 2017; Geifman et al. 2019).

    The examples are accepted in descending order of ``confidence``; after k = 1..n of them the coverage
    is k/n and the risk the share of errors among the k accepted.  Examples of equal confidence are
    accepted in random order and the curve is its expectation over that order: within a tie group of m
    examples holding e errors that starts after a accepted examples with E errors, risk(a + j) =
    (E + j·e/m)/(a + j), j = 1..m.  So the curve does not depend on the order ties are given in, and a
    constant score (the MI of a one-sample method) gives the risk of accepting at random.
    Returns (coverage, risk), each of length n.
    """
    wrong = _to_numpy(errors).astype(np.float64).reshape(-1)
    score = _to_numpy(confidence).astype(np.float64).reshape(-1)
    if wrong.shape != score.shape or wrong.size == 0:
        raise ValueError(f"expected errors and confidence of one non-zero length, got {wrong.shape}, {score.shape}")
    order = np.argsort(-score, kind="stable")
    sorted_score, sorted_wrong = score[order], wrong[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    sizes = np.diff(np.r_[starts, len(score)])
    group_errors = np.add.reduceat(sorted_wrong, starts)
    errors_before = np.cumsum(group_errors) - group_errors
    group = np.repeat(np.arange(len(starts)), sizes)
    within = np.arange(len(score)) - starts[group] + 1
    accepted = np.arange(1, len(score) + 1)
    expected_errors = errors_before[group] + within * group_errors[group] / sizes[group]
    return accepted / len(score), expected_errors / accepted


def aurc(errors: ArrayLike, confidence: ArrayLike) -> tuple[float, float]:
    """(AURC, E-AURC) of a confidence score (Geifman, Uziel & El-Yaniv 2019, "Bias-reduced uncertainty
    estimation for deep neural classifiers").

    AURC = (1/n) Σ_{k=1..n} risk(k/n) on :func:`risk_coverage_curve`; E-AURC = AURC − AURC*, where AURC* is
    the AURC of the optimal ordering (every right answer before every error): with r errors,
    risk*(k) = max(0, k − (n − r)) / k.
    """
    coverage, risk = risk_coverage_curve(errors, confidence)
    n = len(risk)
    n_errors = float(np.sum(_to_numpy(errors)))
    k = np.arange(1, n + 1)
    optimal = np.maximum(0.0, k - (n - n_errors)) / k
    area = float(np.mean(risk))
    return area, area - float(np.mean(optimal))


def selective_prediction(probs: ArrayLike, labels: ArrayLike, mutual_information: ArrayLike) -> dict[str, float]:
    """AURC and E-AURC (:func:`aurc`) of the 0/1 loss with confidence max_k p_ik (``maxprob``) and −MI
    (``mi``): keys ``aurc_maxprob``, ``eaurc_maxprob``, ``aurc_mi``, ``eaurc_mi``."""
    p, y = _checked(probs, labels)
    mi = _to_numpy(mutual_information).astype(np.float64, copy=False)
    errors = p.argmax(axis=1) != y
    out: dict[str, float] = {}
    for name, confidence in (("maxprob", p.max(axis=1)), ("mi", -mi)):
        out[f"aurc_{name}"], out[f"eaurc_{name}"] = aurc(errors, confidence)
    return out


CALIBRATION_SPLITS = 5
"""Random halvings of the test set averaged by :func:`calibrated_nll` (Ashukha et al. 2020 use five)."""

TEMPERATURE_BOUNDS = (0.01, 100.0)


def _tempered_nll(log_probs: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """−(1/n) Σ_i log softmax(log_probs_i / T)[y_i]."""
    scaled = log_softmax(log_probs / temperature, axis=1)
    return float(-np.mean(scaled[np.arange(len(labels)), labels]))


def optimal_temperature(log_probs: np.ndarray, labels: np.ndarray) -> float:
    """argmin_T of :func:`_tempered_nll` over T in :data:`TEMPERATURE_BOUNDS` (scipy's bounded Brent
    search on log T, tolerance 1e-6 in log T)."""
    low, high = np.log(TEMPERATURE_BOUNDS)
    found = minimize_scalar(
        lambda log_t: _tempered_nll(log_probs, labels, float(np.exp(log_t))),
        bounds=(low, high),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(np.exp(found.x))


def smoothed_log_probs(probs: ArrayLike, smoothing: float = 1e-4) -> np.ndarray:
    """z_ik = log((1 − ε) p̄_ik + ε/K): the log of the posterior predictive, smoothed as in :func:`nll` (finite
    where p̄_ik = 0); what both temperature fits temper (:func:`calibrated_nll`, :func:`fit_temperature`)."""
    p = np.ascontiguousarray(_to_numpy(probs), dtype=np.float64)
    return np.log((1.0 - smoothing) * p + smoothing / p.shape[1])


def fit_temperature(probs: ArrayLike, labels: ArrayLike) -> float:
    """Post-hoc temperature scaling's T (Guo et al. 2017) in the form of Ashukha et al. 2020 (§3.5): the
    T minimising the NLL −(1/n) Σ_i log softmax(z_i / T)[y_i] of the tempered log posterior predictive
    z = :func:`smoothed_log_probs` on a held-out split (:func:`optimal_temperature`)."""
    p, y = _checked(probs, labels)
    return optimal_temperature(smoothed_log_probs(p), y)


class TemperedPredictive:
    """A posterior predictive tempered by T, with what the classification metrics read of it
    (:class:`ClassificationSummary`): ``mean_probs`` p_T = softmax(z / T), z = :func:`smoothed_log_probs` of
    p̄ (Ashukha et al. 2020: the ensemble's log predictive tempered, not each member's logits);
    ``total_entropy`` H[p_T]; ``mutual_information`` the untempered predictive's, since tempering p̄ leaves
    the samples' disagreement as it was.  p_T ranks the classes as p̄ does, so accuracy and every
    mutual-information score are unchanged; NLL, Brier, ECE and every entropy or max-probability score move."""

    def __init__(self, pred: ClassificationSummary, temperature: float) -> None:
        z = smoothed_log_probs(pred.mean_probs)
        self.mean_probs = np.exp(log_softmax(z / temperature, axis=1))
        self.total_entropy = entr(self.mean_probs).sum(axis=1)
        self.mutual_information = pred.mutual_information


def calibrated_nll(probs: ArrayLike, labels: ArrayLike, smoothing: float = 1e-4) -> tuple[float, float]:
    """The NLL at the optimal temperature by test-time cross-validation (Ashukha et al. 2020, "Pitfalls of
    in-domain uncertainty estimation and ensembling in deep learning", §3.5): (calibrated NLL, temperature).

    The test set is halved at random (``numpy.random.default_rng(0)``, :data:`CALIBRATION_SPLITS` times);
    for each halving and each half, T is fitted on that half (:func:`optimal_temperature`) and the NLL of
    the other half taken at that T; the calibrated NLL is the mean NLL over all 2·splits held-out halves
    (each weighted by its size) and the temperature reported the geometric mean of the 2·splits fitted
    temperatures.  Tempering acts on the log of the (smoothed, as in :func:`nll`) posterior predictive,
    z_ik = log((1 − ε) p̄_ik + ε/K), p_T = softmax(z / T): at T = 1 this is exactly :func:`nll`, and it
    is what a saved prediction table holds.  (Tempering each sample's logits before averaging would need the
    per-sample logits, which the saved predictive does not keep.)
    """
    p, y = _checked(probs, labels)
    if len(y) < 2:
        return math.nan, math.nan  # no halves to fit on and evaluate
    log_probs = smoothed_log_probs(p, smoothing)
    rng = np.random.default_rng(0)
    total, temperatures = 0.0, []
    for _ in range(CALIBRATION_SPLITS):
        order = rng.permutation(len(y))
        halves = (order[: len(y) // 2], order[len(y) // 2 :])
        for fit, held_out in (halves, halves[::-1]):
            temperature = optimal_temperature(log_probs[fit], y[fit])
            temperatures.append(temperature)
            total += len(held_out) * _tempered_nll(log_probs[held_out], y[held_out], temperature)
    return total / (CALIBRATION_SPLITS * len(y)), float(np.exp(np.mean(np.log(temperatures))))


def _detection_curve(is_positive: ArrayLike, score: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FPR, TPR, precision) at every distinct threshold of ``score``, highest first, positives those scoring at
    or above it: one sweep by sklearn's ``confusion_matrix_at_thresholds`` (true and false positives per
    threshold).  FPR and TPR start at (0, 0) as sklearn's ``roc_curve(drop_intermediate=False)`` does;
    precision is TP / (TP + FP) at each threshold (no leading point).  Needs both classes present."""
    _, fps, _, tps, _ = confusion_matrix_at_thresholds(_to_numpy(is_positive), _to_numpy(score))
    return np.r_[0.0, fps / fps[-1]], np.r_[0.0, tps / tps[-1]], tps / (tps + fps)


def _auroc(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """The trapezoidal area under the ROC curve: sklearn's ``roc_auc_score`` (``auc`` of ``roc_curve``, whose
    dropped collinear points change no area)."""
    return float(np.trapezoid(tpr, fpr))


def _average_precision(tpr: np.ndarray, precision: np.ndarray) -> float:
    """AP = Σ_n (R_n − R_{n−1}) P_n over the thresholds, recall R = TPR: sklearn's ``average_precision_score``."""
    return float(np.sum(np.diff(tpr) * precision))


def _auroc_aupr(is_positive: np.ndarray, score: np.ndarray) -> tuple[float, float]:
    fpr, tpr, precision = _detection_curve(is_positive, score)
    return _auroc(fpr, tpr), _average_precision(tpr, precision)


def misclassification_detection(probs: ArrayLike, labels: ArrayLike, mutual_information: ArrayLike) -> dict[str, float]:
    """How well uncertainty scores flag the predictive's own errors (positives = misclassified).

    Scores: −max_k p_ik (``maxprob``), the predictive entropy −Σ_k p_ik log p_ik (``entropy``) and the
    mutual information (``mi``).  Returns AUROC and AUPR (sklearn's ``roc_auc_score`` and
    ``average_precision_score``, from one :func:`_detection_curve`) for each; all NaN when every prediction is
    right or every one wrong.
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


def fpr_at_95_tpr(is_positive: ArrayLike, score: ArrayLike) -> float:
    """The false-positive rate at the first threshold whose true-positive rate reaches 0.95 (Hendrycks &
    Gimpel 2017; Liang et al. 2018): FPR at min{t : TPR(t) ≥ 0.95} on the ROC curve with every threshold kept
    (:func:`_detection_curve`, as sklearn's ``roc_curve(drop_intermediate=False)``), positives those with
    larger scores."""
    fpr, tpr, _ = _detection_curve(is_positive, score)
    return _fpr_at_95_tpr(fpr, tpr)


def _fpr_at_95_tpr(fpr: np.ndarray, tpr: np.ndarray) -> float:
    return float(fpr[np.searchsorted(tpr, 0.95, side="left")])


def ood_detection(
    in_total_entropy: ArrayLike, in_mi: ArrayLike, ood_total_entropy: ArrayLike, ood_mi: ArrayLike
) -> dict[str, float]:
    """How well an out-of-distribution set (label 1) is told from the in-distribution test set (label 0),
    scored by total predictive entropy (``entropy``) and by mutual information (``mi``).

    Per score: ``ood_auroc_*`` (as sklearn's ``roc_auc_score``); ``ood_fpr95_*`` (:func:`fpr_at_95_tpr`, OOD
    positive); ``ood_aupr_out_*``, the average precision with OOD as the positive class and the score as
    is, and ``ood_aupr_in_*``, with in-distribution as the positive class and the negated score (as
    sklearn's ``average_precision_score``; Hendrycks & Gimpel 2017).  The first three read one
    :func:`_detection_curve`, the last a second.
    """
    is_ood = np.concatenate([np.zeros(len(in_total_entropy)), np.ones(len(ood_total_entropy))])
    entropy = np.concatenate([_to_numpy(in_total_entropy), _to_numpy(ood_total_entropy)])
    mi = np.concatenate([_to_numpy(in_mi), _to_numpy(ood_mi)])
    if mi.shape != entropy.shape:
        raise ValueError("entropy and mutual information arrays must have matching lengths")
    out: dict[str, float] = {}
    for name, score in (("entropy", entropy), ("mi", mi)):
        fpr, tpr, precision = _detection_curve(is_ood, score)
        out[f"ood_auroc_{name}"] = _auroc(fpr, tpr)
        out[f"ood_fpr95_{name}"] = _fpr_at_95_tpr(fpr, tpr)
        out[f"ood_aupr_out_{name}"] = _average_precision(tpr, precision)
        _, tpr_in, precision_in = _detection_curve(1 - is_ood, -score)
        out[f"ood_aupr_in_{name}"] = _average_precision(tpr_in, precision_in)
    return out


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

    Keys: accuracy, nll (ε = 1e-4), brier, ece (15 bins), ``ece_adaptive`` (15 equal-mass bins), the six
    ``misclass_*`` keys, the four of :func:`selective_prediction`, ``nll_calibrated`` and
    ``calibration_temperature`` (:func:`calibrated_nll`), ``mean_entropy`` (mean total predictive
    entropy), ``mean_mi`` (mean mutual information) and, when ``cost_matrix`` is given, ``decision_cost``.
    """
    probs = pred.mean_probs
    mi = pred.mutual_information
    out = {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        "ece_adaptive": adaptive_calibration_error(probs, labels),
        **misclassification_detection(probs, labels, mi),
        **selective_prediction(probs, labels, mi),
        "mean_entropy": float(np.mean(pred.total_entropy)),
        "mean_mi": float(np.mean(mi)),
    }
    out["nll_calibrated"], out["calibration_temperature"] = calibrated_nll(probs, labels)
    if cost_matrix is not None:
        out["decision_cost"] = decision_cost(probs, labels, cost_matrix)
    return out


def ood_metrics(in_pred: ClassificationSummary, ood_pred: ClassificationSummary) -> dict[str, float]:
    """:func:`ood_detection` on two accumulated predictives (in-distribution test set, OOD set)."""
    return ood_detection(
        in_pred.total_entropy, in_pred.mutual_information, ood_pred.total_entropy, ood_pred.mutual_information
    )


INTERVAL_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""Levels p = 0.05, 0.10, …, 0.95 of the central intervals of the regression calibration curve."""


def crps_gaussian(mean: np.ndarray, std: np.ndarray, y: np.ndarray) -> np.ndarray:
    """CRPS of N(m, s²) at y, per example (Gneiting & Raftery 2007, eq. 21), with z = (y − m)/s:
    CRPS = s [z (2Φ(z) − 1) + 2φ(z) − 1/√π]; |y − m| where s = 0 (a point forecast)."""
    error = y - mean
    safe = np.where(std > 0, std, 1.0)
    z = error / safe
    crps = safe * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi))
    return np.where(std > 0, crps, np.abs(error))


def interval_coverage(mean: np.ndarray, std: np.ndarray, y: np.ndarray, level: float) -> float:
    """Share of y inside the central interval of N(m, s²) of probability ``level``:
    (1/n) Σ_i 1[|y_i − m_i| ≤ z s_i], z = Φ⁻¹(½ + level/2)."""
    return float(np.mean(np.abs(y - mean) <= norm.ppf(0.5 + level / 2) * std))


def miscalibration_area(levels: np.ndarray, observed: np.ndarray) -> float:
    """∫₀¹ |obs(p) − p| dp for the calibration curve through (0, 0), (levels, observed) and (1, 1), taken
    piecewise linear and integrated exactly, crossings of the diagonal included (Tran et al. 2020's
    miscalibration area, uncertainty-toolbox's polygon area).  On a segment of width h whose gaps d₀, d₁
    to the diagonal share a sign the area is h (|d₀| + |d₁|)/2; across a crossing h (d₀² + d₁²)/(2(|d₀| + |d₁|))."""
    p = np.r_[0.0, levels, 1.0]
    gap = np.r_[0.0, observed, 1.0] - p
    h, d0, d1 = np.diff(p), gap[:-1], gap[1:]
    same = d0 * d1 >= 0
    spread = np.abs(d0) + np.abs(d1)
    crossing = (d0**2 + d1**2) / (2 * np.where(spread > 0, spread, 1.0))
    return float(np.sum(h * np.where(same, spread / 2, crossing)))


def interval_score(mean: np.ndarray, std: np.ndarray, y: np.ndarray, alpha: float = 0.05) -> float:
    """Mean interval score of the central (1 − α) interval [l, u] of N(m, s²) (Gneiting & Raftery 2007,
    eq. 43): (u − l) + (2/α)(l − y) 1[y < l] + (2/α)(y − u) 1[y > u]."""
    half = norm.ppf(1 - alpha / 2) * std
    lower, upper = mean - half, mean + half
    score = (upper - lower) + (2 / alpha) * np.maximum(lower - y, 0.0) + (2 / alpha) * np.maximum(y - upper, 0.0)
    return float(np.mean(score))


def gaussian_forecast_metrics(mean: np.ndarray, std: np.ndarray, y: np.ndarray, suffix: str = "") -> dict[str, float]:
    """Scores of the Gaussian forecasts N(m_i, s_i²) against y, each key ending in ``suffix``:
    ``crps`` (mean :func:`crps_gaussian`), ``interval_coverage_05`` … ``_95`` (:func:`interval_coverage` at
    :data:`INTERVAL_LEVELS`, the calibration curve), ``miscalibration_area`` (:func:`miscalibration_area`
    of that curve), ``sharpness`` = √((1/n) Σ_i s_i²) (Tran et al. 2020; uncertainty-toolbox's definition,
    the root-mean-square predictive std) and ``interval_score_95`` (:func:`interval_score`, α = 0.05)."""
    curve = np.array([interval_coverage(mean, std, y, level) for level in INTERVAL_LEVELS])
    out = {f"crps{suffix}": float(np.mean(crps_gaussian(mean, std, y)))}
    out.update({f"interval_coverage_{round(100 * p):02d}{suffix}": float(c) for p, c in zip(INTERVAL_LEVELS, curve)})
    out[f"miscalibration_area{suffix}"] = miscalibration_area(np.array(INTERVAL_LEVELS), curve)
    out[f"sharpness{suffix}"] = float(np.sqrt(np.mean(std**2)))
    out[f"interval_score_95{suffix}"] = interval_score(mean, std, y)
    return out


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

    Beside these, :func:`gaussian_forecast_metrics` of N(m_i, s_i²) against t (keys ending
    ``_epistemic``) and of N(m_i, v_i) against y (no suffix): CRPS, the calibration curve of central
    intervals at levels 0.05 … 0.95, its miscalibration area, sharpness and the 95% interval score.

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
        out.update(gaussian_forecast_metrics(mean, std, targets(truth, "truth"), "_epistemic"))
    if observed is not None:
        error = np.abs(targets(observed, "observed targets") - mean)
        var = std**2 + float(noise_std) ** 2
        out["rmse"] = float(np.sqrt(np.mean(error**2)))
        out["nll"] = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * error**2 / var))
        out["coverage_95_predictive"] = float(np.mean(error <= 1.96 * np.sqrt(var)))
        out.update(gaussian_forecast_metrics(mean, np.sqrt(var), targets(observed, "observed targets")))
    return out
