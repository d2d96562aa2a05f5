"""Regression metrics: each name has one meaning on every evaluation set (epistemic against the noise-free
truth, predictive against noisy observations), checked on a hand case and on a trial's evaluation sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.evaluation import RegressionPredictive, regression_metrics
from ursa_ray.trial import _evaluate, _points

SIGMA = 0.1
EPISTEMIC = {"mean_std", "rmse_truth", "coverage_95_epistemic"}
PREDICTIVE = {"mean_std", "rmse", "nll", "coverage_95_predictive"}


def two_sample_predictive(mean: np.ndarray, std: np.ndarray) -> RegressionPredictive:
    """Samples mean ± std/√2: their mean is ``mean`` and their S − 1 standard deviation ``std``."""
    pred = RegressionPredictive(len(mean))
    for sign in (-1.0, 1.0):
        pred.update(torch.from_numpy(mean + sign * std / math.sqrt(2.0)))
    return pred


def hand_case() -> tuple[RegressionPredictive, np.ndarray, np.ndarray]:
    """m = 0, s = (0.1, 0.1, 0.05), σ = 0.1, truth t and noisy observations y at the same three points."""
    pred = two_sample_predictive(np.zeros(3), np.array([0.1, 0.1, 0.05]))
    return pred, np.array([0.15, 0.25, 0.05]), np.array([0.25, 0.3, 0.25])


def test_hand_case_spread_and_targets() -> None:
    pred, truth, observed = hand_case()
    np.testing.assert_allclose(pred.std, [0.1, 0.1, 0.05], rtol=1e-12)
    out = regression_metrics(pred, SIGMA, truth=truth, observed=observed)
    assert set(out) == EPISTEMIC | PREDICTIVE
    assert out["mean_std"] == pytest.approx(0.25 / 3)
    # epistemic, against t with 1.96·s = (0.196, 0.196, 0.098): |t| = 0.15 in, 0.25 out, 0.05 in
    assert out["coverage_95_epistemic"] == pytest.approx(2 / 3)
    assert out["rmse_truth"] == pytest.approx(math.sqrt((0.15**2 + 0.25**2 + 0.05**2) / 3))
    # predictive, against y with 1.96·√(s² + σ²) = (0.2772, 0.2772, 0.2191): |y| = 0.25 in, 0.3 out, 0.25 out
    assert out["coverage_95_predictive"] == pytest.approx(1 / 3)
    assert out["rmse"] == pytest.approx(math.sqrt((0.25**2 + 0.3**2 + 0.25**2) / 3))
    var = np.array([0.02, 0.02, 0.0125])
    assert out["nll"] == pytest.approx(np.mean(0.5 * np.log(2 * np.pi * var) + observed**2 / (2 * var)))


def test_each_coverage_uses_its_own_spread() -> None:
    """Swapping the targets changes the numbers: the epistemic coverage of y is 0 (no |y| ≤ 1.96·s), the
    predictive coverage of t is 1 (every |t| ≤ 1.96·√(s² + σ²)), unlike the 2/3 and 1/3 above."""
    pred, truth, observed = hand_case()
    assert regression_metrics(pred, SIGMA, truth=observed)["coverage_95_epistemic"] == 0.0
    assert regression_metrics(pred, SIGMA, observed=truth)["coverage_95_predictive"] == 1.0
    assert set(regression_metrics(pred, SIGMA, truth=truth)) == EPISTEMIC
    assert set(regression_metrics(pred, SIGMA, observed=observed)) == PREDICTIVE
    with pytest.raises(ValueError):
        regression_metrics(pred, SIGMA)


def test_trial_evaluates_test_set_against_truth_and_validation_split_against_noisy_targets() -> None:
    """The test set carries the noise-free truth: epistemic metrics only.  The validation split carries
    noisy training targets: predictive metrics only, which include the selection metrics val_rmse and
    val_nll."""
    ds = make_dataset("e1", 2.0, 0)
    gen = torch.Generator().manual_seed(0)
    test_pred = RegressionPredictive(len(ds.test_y))
    validation_pred = RegressionPredictive(40)
    for _ in range(3):
        test_pred.update(ds.test_y.double() + 0.1 * torch.randn(len(ds.test_y), dtype=torch.float64, generator=gen))
        validation_pred.update(torch.randn(40, dtype=torch.float64, generator=gen))
    on_test = _evaluate(ds, test_pred, ds.test_y, "test")
    assert set(on_test) == EPISTEMIC
    assert on_test == regression_metrics(test_pred, ds.noise_std, truth=ds.test_y.numpy())
    on_validation = _evaluate(ds, validation_pred, ds.train_y[:40], "validation")
    assert set(on_validation) == PREDICTIVE
    assert on_validation == regression_metrics(validation_pred, ds.noise_std, observed=ds.train_y[:40].numpy())


def test_points_rows_carry_the_model() -> None:
    ds = make_dataset("e1", 2.0, 1)
    pred = two_sample_predictive(np.zeros(len(ds.test_y)), np.full(len(ds.test_y), 0.1))
    spec = {"label": "bd", "model": "mlp", "dataset": "e1", "complexity": 2.0, "seed": 1, "trial_id": "t"}
    rows = _points(spec, ds, pred)
    models = {(row["method"], row["model"]) for row in rows}
    assert models == {("bd", "mlp"), ("blr", "true_features")}
    assert all(row["std"] == pytest.approx(0.1) for row in rows if row["method"] == "bd")
