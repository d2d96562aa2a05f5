"""URSABench metrics: hand-computed cases and agreement with scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, log_loss, roc_auc_score, roc_curve

from ursa_ray.evaluation import (
    ClassificationPredictive,
    accuracy,
    adaptive_calibration_error,
    aurc,
    brier,
    calibrated_nll,
    classification_metrics,
    decision_cost,
    expected_calibration_error,
    fpr_at_95_tpr,
    misclassification_detection,
    nll,
    ood_detection,
    ood_metrics,
    risk_coverage_curve,
    selective_prediction,
)
from ursa_ray.evaluation.metrics import TemperedPredictive, fit_temperature

PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
LABELS = np.array([0, 2])


def _random_case(n: int = 200, k: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return probs, rng.integers(0, k, size=n)


def _row(confidence: float, k: int = 10) -> list[float]:
    """Probabilities over k classes with class 0 at ``confidence`` and the rest shared equally."""
    return [confidence] + [(1 - confidence) / (k - 1)] * (k - 1)


def test_accuracy_hand_case_and_sklearn() -> None:
    probs = np.array([[0.6, 0.4], [0.3, 0.7], [0.8, 0.2], [0.45, 0.55]])
    labels = np.array([0, 0, 0, 1])  # predictions 0, 1, 0, 1: three right
    assert accuracy(probs, labels) == 0.75
    probs, labels = _random_case()
    assert accuracy(probs, labels) == pytest.approx(accuracy_score(labels, probs.argmax(1)), abs=1e-15)


def test_nll_hand_case_smoothed_and_plain() -> None:
    # plain: -(ln 0.7 + ln 0.3) / 2 = 0.780324; smoothed: p' = 0.9999 p + 1e-4 / 3
    assert nll(PROBS, LABELS, smoothing=0.0) == pytest.approx(0.780324, abs=1e-6)
    assert nll(PROBS, LABELS) == pytest.approx(0.7803445, abs=1e-7)


def test_nll_plain_matches_sklearn_log_loss() -> None:
    probs, labels = _random_case()
    assert nll(probs, labels, smoothing=0.0) == pytest.approx(log_loss(labels, probs, labels=range(5)), rel=1e-12)


def test_nll_smoothing_keeps_zero_probability_finite() -> None:
    probs = np.array([[1.0, 0.0]])
    assert nll(probs, np.array([1]), smoothing=0.0) == math.inf
    assert nll(probs, np.array([1])) == pytest.approx(-math.log(1e-4 / 2), rel=1e-12)


def test_brier_hand_case_and_direct_sum() -> None:
    # (0.3² + 0.2² + 0.1²) = 0.14 and (0.1² + 0.6² + 0.7²) = 0.86; mean 0.5
    assert brier(PROBS, LABELS) == pytest.approx(0.5, abs=1e-12)
    probs, labels = _random_case(seed=1)
    direct = sum(sum((probs[i, k] - (labels[i] == k)) ** 2 for k in range(5)) for i in range(len(labels))) / len(labels)
    assert brier(probs, labels) == pytest.approx(direct, rel=1e-12)


def test_ece_bin_edges_are_closed_above() -> None:
    # 15 bins.  Confidence 0.2 (= 3/15) belongs to (0.1333, 0.2], not to (0.2, 0.2667] with 0.25;
    # 0.6 (= 9/15) to (0.5333, 0.6], not with 0.62; 1.0 to the last bin.
    probs = np.array([_row(0.2), _row(0.25), _row(0.6), _row(0.62), _row(1.0)])
    labels = np.array([0, 1, 1, 0, 0])  # right, wrong, wrong, right, right
    # separate bins: |1 - 0.2| + |0 - 0.25| + |0 - 0.6| + |1 - 0.62| + |1 - 1| = 2.03, over n = 5
    assert expected_calibration_error(probs, labels) == pytest.approx(0.406, abs=1e-12)
    # had the edges been open above: |1 - 0.45| + |1 - 1.22| + 0 = 0.77 -> 0.154
    # one bin: |3 - 2.67| / 5 = 0.066
    assert expected_calibration_error(probs, labels, n_bins=1) == pytest.approx(0.066, abs=1e-12)


def test_ece_matches_loop_over_bins() -> None:
    probs, labels = _random_case(n=500, seed=2)
    confidence, correct = probs.max(1), probs.argmax(1) == labels
    expected = 0.0
    for b in range(15):
        in_bin = (confidence > b / 15) & (confidence <= (b + 1) / 15)
        if in_bin.any():
            expected += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    assert expected_calibration_error(probs, labels) == pytest.approx(expected, rel=1e-12)


def test_ece_zero_when_calibrated_within_each_bin() -> None:
    # confidence 0.75 in one bin, three of four right
    probs = np.array([[0.75, 0.25]] * 4)
    assert expected_calibration_error(probs, np.array([0, 0, 0, 1])) == pytest.approx(0.0, abs=1e-12)


def test_misclassification_detection_hand_case() -> None:
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = np.array([0, 1, 1, 1])  # errors: examples 1 and 3
    mi = np.array([0.1, 0.4, 0.2, 0.3])
    out = misclassification_detection(probs, labels, mi)
    # -maxprob: errors (-0.8, -0.6) vs right (-0.9, -0.7): 3 of 4 pairs ordered -> AUROC 0.75.
    # Ranked: -0.6 (err), -0.7, -0.8 (err), -0.9 -> AP = 0.5 * 1 + 0.5 * 2/3 = 0.833333.
    assert out["misclass_auroc_maxprob"] == pytest.approx(0.75, abs=1e-12)
    assert out["misclass_aupr_maxprob"] == pytest.approx(0.833333, abs=1e-6)
    # with two classes the entropy ranks exactly as -maxprob
    assert out["misclass_auroc_entropy"] == pytest.approx(0.75, abs=1e-12)
    assert out["misclass_aupr_entropy"] == pytest.approx(0.833333, abs=1e-6)
    # MI puts both errors (0.4, 0.3) above both right answers (0.1, 0.2)
    assert out["misclass_auroc_mi"] == 1.0
    assert out["misclass_aupr_mi"] == 1.0


def test_misclassification_detection_matches_sklearn() -> None:
    probs, labels = _random_case(n=300, seed=3)
    mi = np.random.default_rng(4).uniform(size=300)
    errors = probs.argmax(1) != labels
    entropy = -(probs * np.log(probs)).sum(1)
    out = misclassification_detection(probs, labels, mi)
    for name, score in (("maxprob", -probs.max(1)), ("entropy", entropy), ("mi", mi)):
        assert out[f"misclass_auroc_{name}"] == pytest.approx(roc_auc_score(errors, score), abs=1e-12)
        assert out[f"misclass_aupr_{name}"] == pytest.approx(average_precision_score(errors, score), abs=1e-12)


@pytest.mark.parametrize("labels", [np.array([0, 1, 0]), np.array([1, 0, 1])])
def test_misclassification_detection_undefined_gives_nan(labels: np.ndarray) -> None:
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])  # predictions 0, 1, 0
    out = misclassification_detection(probs, labels, np.zeros(3))
    assert len(out) == 6 and all(math.isnan(v) for v in out.values())


def test_ood_detection_hand_case_and_sklearn() -> None:
    # entropy: OOD (0.4, 0.9) vs in (0.1, 0.5): 3 of 4 pairs ordered; MI fully separated
    out = ood_detection(np.array([0.1, 0.5]), np.array([0.0, 0.1]), np.array([0.4, 0.9]), np.array([0.2, 0.3]))
    assert out["ood_auroc_entropy"] == 0.75 and out["ood_auroc_mi"] == 1.0
    rng = np.random.default_rng(5)
    in_h, in_mi, ood_h, ood_mi = rng.uniform(size=40), rng.uniform(size=40), rng.uniform(size=30), rng.uniform(size=30)
    out = ood_detection(in_h, in_mi, ood_h, ood_mi)
    is_ood = np.r_[np.zeros(40), np.ones(30)]
    assert out["ood_auroc_entropy"] == pytest.approx(roc_auc_score(is_ood, np.r_[in_h, ood_h]), abs=1e-12)
    assert out["ood_auroc_mi"] == pytest.approx(roc_auc_score(is_ood, np.r_[in_mi, ood_mi]), abs=1e-12)


@pytest.mark.parametrize("decimals", [1, 2, 15])  # scores tied in tens, in few, and all distinct
def test_detection_metrics_equal_sklearns_with_ties(decimals: int) -> None:
    # every AUROC, AP and FPR@95 comes from one threshold sweep (metrics._detection_curve); each must equal
    # the sklearn function it stands for, ties between positives and negatives included
    rng = np.random.default_rng(decimals)
    in_h, in_mi = rng.uniform(size=(2, 250)).round(decimals)
    ood_h, ood_mi = (rng.uniform(size=(2, 150)) + 0.3).round(decimals)
    out = ood_detection(in_h, in_mi, ood_h, ood_mi)
    is_ood = np.r_[np.zeros(250), np.ones(150)]
    for name, score in (("entropy", np.r_[in_h, ood_h]), ("mi", np.r_[in_mi, ood_mi])):
        fpr, tpr, _ = roc_curve(is_ood, score, drop_intermediate=False)
        assert out[f"ood_auroc_{name}"] == pytest.approx(roc_auc_score(is_ood, score), abs=1e-12)
        assert out[f"ood_fpr95_{name}"] == fpr[np.searchsorted(tpr, 0.95)]
        assert out[f"ood_aupr_out_{name}"] == pytest.approx(average_precision_score(is_ood, score), abs=1e-12)
        assert out[f"ood_aupr_in_{name}"] == pytest.approx(average_precision_score(1 - is_ood, -score), abs=1e-12)
    probs, labels = _random_case(n=300, k=3, seed=decimals)
    probs = probs.round(decimals) + 1e-3
    probs /= probs.sum(axis=1, keepdims=True)
    errors, mi = probs.argmax(1) != labels, rng.uniform(size=300).round(decimals)
    got = misclassification_detection(probs, labels, mi)
    for name, score in (("maxprob", -probs.max(1)), ("mi", mi)):
        assert got[f"misclass_auroc_{name}"] == pytest.approx(roc_auc_score(errors, score), abs=1e-12)
        assert got[f"misclass_aupr_{name}"] == pytest.approx(average_precision_score(errors, score), abs=1e-12)


def test_decision_cost_bayes_decision_differs_from_argmax() -> None:
    cost = np.array([[0.0, 1.0], [10.0, 0.0]])  # deciding 0 when the truth is 1 costs 10
    probs = np.array([[0.8, 0.2], [0.95, 0.05], [0.3, 0.7]])
    labels = np.array([0, 1, 1])
    # expected costs (d=0, d=1): (2.0, 0.8) -> 1; (0.5, 0.95) -> 0; (7.0, 0.3) -> 1
    # incurred: C[0,1] = 1, C[1,0] = 10, C[1,1] = 0 -> mean 11/3 (argmax decisions would give 10/3)
    assert decision_cost(probs, labels, cost) == pytest.approx(11 / 3, abs=1e-12)


def test_classification_metrics_assembles_every_metric() -> None:
    gen = torch.Generator().manual_seed(6)
    pred = ClassificationPredictive(60, 4)
    for _ in range(5):
        pred.update(torch.randn(60, 4, generator=gen) * 2)
    labels = torch.randint(0, 4, (60,), generator=gen)  # a tensor is accepted as labels
    cost = np.full((4, 4), 0.1) - 0.1 * np.eye(4)
    out = classification_metrics(pred, labels, cost)
    probs, y = pred.mean_probs, labels.numpy()
    assert set(out) == {
        "accuracy",
        "nll",
        "brier",
        "ece",
        "ece_adaptive",
        "decision_cost",
        "mean_entropy",
        "mean_mi",
        "nll_calibrated",
        "calibration_temperature",
        *misclassification_detection(probs, y, pred.mutual_information),
        *selective_prediction(probs, y, pred.mutual_information),
    }
    assert out["ece_adaptive"] == adaptive_calibration_error(probs, y)
    assert (out["nll_calibrated"], out["calibration_temperature"]) == calibrated_nll(probs, y)
    assert out["accuracy"] == accuracy(probs, y)
    assert out["nll"] == nll(probs, y)
    assert out["brier"] == brier(probs, y)
    assert out["ece"] == expected_calibration_error(probs, y)
    assert out["decision_cost"] == decision_cost(probs, y, cost)
    assert out["mean_entropy"] == pytest.approx(pred.total_entropy.mean(), abs=1e-15)
    assert out["mean_mi"] == pytest.approx(pred.mutual_information.mean(), abs=1e-15)
    assert out["mean_mi"] > 0
    assert all(isinstance(v, float) for v in out.values())
    assert "decision_cost" not in classification_metrics(pred, labels)


def test_ood_metrics_uses_total_entropy_and_mi() -> None:
    gen = torch.Generator().manual_seed(7)
    in_pred, ood_pred = ClassificationPredictive(30, 3), ClassificationPredictive(20, 3)
    for _ in range(3):
        in_pred.update(torch.randn(30, 3, generator=gen) * 4)
        ood_pred.update(torch.randn(20, 3, generator=gen) * 0.5)
    expected = ood_detection(
        in_pred.total_entropy, in_pred.mutual_information, ood_pred.total_entropy, ood_pred.mutual_information
    )
    assert ood_metrics(in_pred, ood_pred) == expected
    assert expected["ood_auroc_entropy"] > 0.8  # flat logits are the more uncertain


def test_adaptive_ece_hand_case_and_loop_over_equal_mass_bins() -> None:
    # confidences 0.2, 0.25, 0.6, 0.62, 1.0 (right, wrong, wrong, right, right) in 2 equal-mass bins:
    # {0.2, 0.25, 0.6}: |1 - 1.05| = 0.05; {0.62, 1.0}: |2 - 1.62| = 0.38; (0.05 + 0.38) / 5 = 0.086.
    # Equal-width bins (0, 0.5], (0.5, 1] would give (|1 - 0.45| + |2 - 2.22|) / 5 = 0.154.
    probs = np.array([_row(0.2), _row(0.25), _row(0.6), _row(0.62), _row(1.0)])
    labels = np.array([0, 1, 1, 0, 0])
    assert adaptive_calibration_error(probs, labels, n_bins=2) == pytest.approx(0.086, abs=1e-12)
    assert adaptive_calibration_error(probs, labels, n_bins=1) == expected_calibration_error(probs, labels, n_bins=1)
    probs, labels = _random_case(n=500, seed=8)
    confidence, correct = probs.max(1), probs.argmax(1) == labels
    order = np.argsort(confidence)
    expected = sum(len(b) / 500 * abs(correct[b].mean() - confidence[b].mean()) for b in np.array_split(order, 15))
    assert adaptive_calibration_error(probs, labels) == pytest.approx(expected, rel=1e-12)


def test_risk_coverage_hand_case_and_optimal_ordering() -> None:
    errors = np.array([0, 1, 0, 1])
    confidence = np.array([0.9, 0.8, 0.7, 0.6])  # accepted in this order: risks 0, 1/2, 1/3, 2/4
    coverage, risk = risk_coverage_curve(errors, confidence)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 1 / 2, 1 / 3, 1 / 2])
    area, excess = aurc(errors, confidence)
    # optimal: right, right, wrong, wrong -> risks 0, 0, 1/3, 1/2
    assert area == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4, abs=1e-15)
    assert excess == pytest.approx((1 / 2) / 4, abs=1e-15)
    assert aurc(errors, -confidence * errors + 1)[1] == 0.0  # errors least confident: E-AURC 0
    assert aurc(errors, -confidence)[0] > area  # the reversed ordering is worse


def test_risk_coverage_ties_are_the_expectation_over_their_orders() -> None:
    """A tie group is accepted in random order: the curve is the mean over every order of it (enumerated
    here), so a constant score gives the error rate at every coverage and the input order does not matter."""
    import itertools

    errors = np.array([1, 0, 0, 1, 0, 1])
    confidence = np.array([0.9, 0.5, 0.5, 0.5, 0.2, 0.2])
    curves = []
    for middle in itertools.permutations([1, 2, 3]):
        for tail in itertools.permutations([4, 5]):
            order = [0, *middle, *tail]
            curves.append(np.cumsum(errors[order]) / np.arange(1, 7))
    np.testing.assert_allclose(risk_coverage_curve(errors, confidence)[1], np.mean(curves, axis=0), rtol=1e-14)
    reversed_input = risk_coverage_curve(errors[::-1], confidence[::-1])[1]
    np.testing.assert_allclose(reversed_input, np.mean(curves, axis=0), rtol=1e-14)
    np.testing.assert_allclose(risk_coverage_curve(errors, np.zeros(6))[1], 0.5, rtol=1e-15)


def test_selective_prediction_scores_by_maxprob_and_mi() -> None:
    probs, labels = _random_case(n=300, seed=9)
    mi = np.random.default_rng(10).uniform(size=300)
    errors = probs.argmax(1) != labels
    out = selective_prediction(probs, labels, mi)
    for name, confidence in (("maxprob", probs.max(1)), ("mi", -mi)):
        order = np.argsort(-confidence)  # no ties in continuous random scores
        risks = np.cumsum(errors[order]) / np.arange(1, 301)
        assert out[f"aurc_{name}"] == pytest.approx(risks.mean(), rel=1e-12)
        assert out[f"eaurc_{name}"] == pytest.approx(risks.mean() - aurc(errors, -errors.astype(float))[0], rel=1e-12)
    assert out["aurc_maxprob"] != out["aurc_mi"]


def _tempered_case(n: int, temperature: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from softmax(f) and the predictive softmax(f / temperature): temperature T fits best."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 5)) * 2
    true = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = np.array([rng.choice(5, p=row) for row in true])
    shown = np.exp(logits / temperature)
    return shown / shown.sum(1, keepdims=True), labels


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_calibrated_nll_recovers_the_temperature(temperature: float) -> None:
    """The predictive softmax(f/T₀) of labels drawn from softmax(f) is calibrated at T = 1/T₀ on its log
    probabilities.  The fitted temperature must be that (n = 20,000: its standard error is below 2%),
    and the calibrated NLL the true model's NLL within Monte Carlo error (rel 2%).  Tempering the
    probabilities instead of their logarithms, or inverting T, fails both."""
    probs, labels = _tempered_case(20_000, temperature, seed=11)
    calibrated, fitted = calibrated_nll(probs, labels, smoothing=0.0)
    assert fitted == pytest.approx(1 / temperature, rel=0.05)
    truth, _ = _tempered_case(20_000, 1.0, seed=11)
    assert calibrated == pytest.approx(nll(truth, labels, smoothing=0.0), rel=0.02)
    assert calibrated <= nll(probs, labels, smoothing=0.0) + 1e-3


def test_calibrated_nll_is_the_held_out_nll_at_the_fitted_temperature() -> None:
    """Against a dense grid search for T on each half (independent of scipy's optimiser), on the same
    halvings (default_rng(0), five permutations)."""
    probs, labels = _tempered_case(200, 2.0, seed=12)  # optimum near T = 0.5, well inside the grid
    log_probs = np.log(0.9999 * probs + 1e-4 / 5)
    grid = np.exp(np.linspace(np.log(0.05), np.log(20), 4001))

    def held_out_nll(rows: np.ndarray, t: float) -> np.ndarray:
        z = log_probs[rows] / t
        z = z - z.max(1, keepdims=True)
        return -(z[np.arange(len(rows)), labels[rows]] - np.log(np.exp(z).sum(1)))

    rng, total = np.random.default_rng(0), 0.0
    for _ in range(5):
        order = rng.permutation(200)
        for fit, rest in ((order[:100], order[100:]), (order[100:], order[:100])):
            best = grid[np.argmin([held_out_nll(fit, t).mean() for t in grid])]
            total += held_out_nll(rest, best).sum()
    assert calibrated_nll(probs, labels)[0] == pytest.approx(total / 1000, rel=1e-4)


def test_fpr_at_95_tpr_hand_case_and_loop() -> None:
    # 20 OOD scores 1..20 and 10 in-distribution scores 0.5, 2.5, ..., 18.5.  TPR 0.95 first at threshold
    # 2 (19 of 20 OOD >= 2): in-distribution >= 2 are 2.5..18.5, 9 of 10 -> FPR 0.9.
    ood, in_dist = np.arange(1.0, 21.0), np.arange(0.5, 20.0, 2.0)
    is_ood, score = np.r_[np.zeros(10), np.ones(20)], np.r_[in_dist, ood]
    assert fpr_at_95_tpr(is_ood, score) == pytest.approx(0.9, abs=1e-15)
    rng = np.random.default_rng(13)
    is_ood, score = np.r_[np.zeros(70), np.ones(50)], np.r_[rng.normal(size=70), rng.normal(1.5, size=50)]
    thresholds = np.sort(score)[::-1]
    loop = next((score[is_ood == 0] >= t).mean() for t in thresholds if (score[is_ood == 1] >= t).mean() >= 0.95)
    assert fpr_at_95_tpr(is_ood, score) == loop


def test_ood_detection_aupr_in_and_out_and_fpr95_by_each_score() -> None:
    rng = np.random.default_rng(14)
    in_h, in_mi, ood_h, ood_mi = (
        rng.uniform(size=40),
        rng.uniform(size=40),
        rng.uniform(0.3, 1.3, size=30),
        rng.uniform(size=30),
    )
    out = ood_detection(in_h, in_mi, ood_h, ood_mi)
    is_ood = np.r_[np.zeros(40), np.ones(30)]
    for name, score in (("entropy", np.r_[in_h, ood_h]), ("mi", np.r_[in_mi, ood_mi])):
        assert out[f"ood_aupr_out_{name}"] == pytest.approx(average_precision_score(is_ood, score), abs=1e-15)
        assert out[f"ood_aupr_in_{name}"] == pytest.approx(average_precision_score(1 - is_ood, -score), abs=1e-15)
        assert out[f"ood_fpr95_{name}"] == fpr_at_95_tpr(is_ood, score)
    assert out["ood_aupr_in_entropy"] != out["ood_aupr_out_entropy"]
    assert len(out) == 8


def test_fit_temperature_is_the_minimiser_of_the_validation_nll() -> None:
    """Temperature scaling's T on a hand case (n = 8, K = 3, over-confident), against scipy's bounded Brent
    search on T itself and a dense grid over T (both independent of the fit's search on log T), on the NLL
    −(1/n) Σ log softmax(z_i / T)[y_i] of z = log(0.9999 p + 1e-4/3) computed here from first principles."""
    from scipy.optimize import minimize_scalar

    probs = np.array(
        [[0.98, 0.01, 0.01], [0.97, 0.02, 0.01], [0.05, 0.90, 0.05], [0.02, 0.96, 0.02],
         [0.90, 0.05, 0.05], [0.01, 0.01, 0.98], [0.95, 0.04, 0.01], [0.10, 0.10, 0.80]]
    )  # fmt: skip
    labels = np.array([0, 1, 1, 0, 2, 2, 0, 1])  # four of eight wrong, three of them at confidence ≥ 0.9

    def validation_nll(t: float) -> float:
        z = np.log(0.9999 * probs + 1e-4 / 3) / t
        return float(-np.mean(z[np.arange(8), labels] - np.log(np.exp(z).sum(1))))

    fitted = fit_temperature(probs, labels)
    brent = minimize_scalar(validation_nll, bounds=(0.05, 50.0), method="bounded", options={"xatol": 1e-8}).x
    grid = np.linspace(0.5, 20.0, 195_001)  # spacing 1e-4
    assert fitted == pytest.approx(brent, abs=1e-4)
    assert fitted == pytest.approx(grid[np.argmin([validation_nll(t) for t in grid])], abs=2e-4)
    assert fitted > 1  # confident and often wrong: the fit softens it


def test_an_over_confident_predictive_gets_a_temperature_above_one_and_a_lower_held_out_nll() -> None:
    """Labels drawn from softmax(f), the predictive softmax(3 f): over-confident.  T fitted on a validation half
    is about 3 (> 1) and the tempered predictive's NLL on the other half is lower than the raw one's, near
    the true model's; an under-confident one (softmax(f / 2)) gets T < 1."""
    probs, labels = _tempered_case(4_000, 1 / 3, seed=21)
    validation, test = slice(0, 2_000), slice(2_000, None)
    temperature = fit_temperature(probs[validation], labels[validation])
    assert temperature == pytest.approx(3.0, rel=0.1)
    summary = ClassificationPredictive(2_000, 5)
    summary.update(torch.from_numpy(np.log(probs[test])))
    tempered = TemperedPredictive(summary, temperature)
    raw_nll, calibrated = nll(summary.mean_probs, labels[test]), nll(tempered.mean_probs, labels[test])
    truth, _ = _tempered_case(4_000, 1.0, seed=21)
    assert calibrated < raw_nll - 0.1
    assert calibrated == pytest.approx(nll(truth[test], labels[test]), rel=0.03)
    under, under_labels = _tempered_case(2_000, 2.0, seed=22)
    assert fit_temperature(under, under_labels) < 1


def test_a_tempered_predictive_keeps_the_ranking_and_the_mutual_information() -> None:
    """p_T = softmax(z / T) of z = log(0.9999 p̄ + 1e-4/K): at T = 1 the smoothed p̄; at any T the same argmax,
    its own entropy, and the untempered mutual information (tempering p̄ leaves the samples' spread)."""
    rng = np.random.default_rng(3)
    pred = ClassificationPredictive(50, 4)
    for _ in range(3):
        pred.update(torch.from_numpy(rng.normal(size=(50, 4)) * 2))
    np.testing.assert_allclose(
        TemperedPredictive(pred, 1.0).mean_probs, 0.9999 * pred.mean_probs + 1e-4 / 4, rtol=1e-12
    )
    for t in (0.3, 2.5):
        tempered = TemperedPredictive(pred, t)
        np.testing.assert_allclose(tempered.mean_probs.sum(1), 1.0, rtol=1e-12)
        assert (tempered.mean_probs.argmax(1) == pred.mean_probs.argmax(1)).all()
        expected = -(tempered.mean_probs * np.log(tempered.mean_probs)).sum(1)
        np.testing.assert_allclose(tempered.total_entropy, expected, rtol=1e-12)
        assert np.array_equal(tempered.mutual_information, pred.mutual_information)
    assert TemperedPredictive(pred, 2.5).total_entropy.mean() > pred.total_entropy.mean()  # T > 1 softens
