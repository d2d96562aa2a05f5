"""Regression metrics: each name has one meaning on every evaluation set (epistemic against the noise-free
truth, predictive against noisy observations), checked on a hand case and on a trial's evaluation sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from spec_fixtures import hand_spec

from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.evaluation import (
    RegressionPredictive,
    crps_gaussian,
    gaussian_forecast_metrics,
    interval_score,
    miscalibration_area,
    regression_metrics,
)
from ursa_ray.evaluation.probes.in_domain import in_domain_metrics
from ursa_ray.trial import _anchor, _points

SIGMA = 0.1
FORECAST = {"crps", "miscalibration_area", "sharpness", "interval_score_95"} | {
    f"interval_coverage_{level:02d}" for level in range(5, 100, 5)
}
EPISTEMIC = {"mean_std", "rmse_truth", "coverage_95_epistemic"} | {f"{k}_epistemic" for k in FORECAST}
PREDICTIVE = {"mean_std", "rmse", "nll", "coverage_95_predictive"} | FORECAST


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
    on_test = in_domain_metrics(ds, test_pred, ds.test_y, "test")
    assert set(on_test) == EPISTEMIC
    assert on_test == regression_metrics(test_pred, ds.noise_std, truth=ds.test_y.numpy())
    on_validation = in_domain_metrics(ds, validation_pred, ds.train_y[:40], "validation")
    assert set(on_validation) == PREDICTIVE
    assert on_validation == regression_metrics(validation_pred, ds.noise_std, observed=ds.train_y[:40].numpy())


def test_points_rows_carry_the_model() -> None:
    ds = make_dataset("e1", 2.0, 1)
    pred = two_sample_predictive(np.zeros(len(ds.test_y)), np.full(len(ds.test_y), 0.1))
    spec = hand_spec(label="bd", model="mlp", dataset="e1", complexity=2.0, seed=1, trial_id="t")
    rows = _points(spec, ds, pred, _anchor(ds))
    models = {(row["method"], row["model"]) for row in rows}
    assert models == {("bd", "mlp"), ("blr", "true_features")}
    assert all(row["std"] == pytest.approx(0.1) for row in rows if row["method"] == "bd")


def _forecasts(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means, stds and targets whose spread is 1.3× the stated one (a miscalibrated forecast)."""
    rng = np.random.default_rng(seed)
    mean, std = rng.normal(size=n), rng.uniform(0.2, 2.0, size=n)
    return mean, std, mean + 1.3 * std * rng.normal(size=n)


def test_crps_is_the_integral_of_the_squared_cdf_difference() -> None:
    """CRPS(F, y) = ∫ (F(x) − 1[x ≥ y])² dx by quadrature, and |y − m| for a point forecast (s = 0)."""
    from scipy.integrate import quad
    from scipy.stats import norm

    for m, s, y in ((0.0, 1.0, 0.3), (1.0, 0.5, -0.4), (-2.0, 2.0, 3.0)):
        below = quad(lambda x: norm.cdf(x, m, s) ** 2, -np.inf, y)[0]
        above = quad(lambda x: (1 - norm.cdf(x, m, s)) ** 2, y, np.inf)[0]
        assert crps_gaussian(np.array([m]), np.array([s]), np.array([y]))[0] == pytest.approx(below + above, rel=1e-7)
    assert crps_gaussian(np.array([1.0]), np.array([0.0]), np.array([-0.5]))[0] == 1.5


def test_calibration_curve_and_area_hand_case() -> None:
    """Four forecasts N(0, 1) at y = 0.01, 0.5, 1.0, 3.0: |y| is inside the central p-interval from
    p = 2Φ(|y|) − 1 = 0.008, 0.383, 0.683, 0.997; at p = 0.05 one of four, at 0.40 two, at 0.70 three."""
    mean, std, y = np.zeros(4), np.ones(4), np.array([0.01, 0.5, 1.0, 3.0])
    out = gaussian_forecast_metrics(mean, std, y)
    assert [out[f"interval_coverage_{p:02d}"] for p in (5, 35, 40, 65, 70, 95)] == [0.25, 0.25, 0.5, 0.5, 0.75, 0.75]
    assert out["sharpness"] == 1.0
    # on the diagonal: 0.  At 0 for every level: the triangle 0.95²/2 up to p = 0.95, then the segment
    # (0.95, 0) -> (1, 1) whose gap falls from 0.95 to 0: 0.05 · 0.95 / 2.
    levels = np.arange(1, 20) / 20
    assert miscalibration_area(levels, levels) == 0.0
    assert miscalibration_area(levels, np.zeros(19)) == pytest.approx(0.95**2 / 2 + 0.05 * 0.95 / 2, abs=1e-15)
    # gap +0.05 at p = 0.05 … 0.45, −0.05 at p = 0.50 … 0.95: end segments 0 <-> 0.05 (0.05 · 0.05 / 2
    # each), flat stretches 0.40 · 0.05 and 0.45 · 0.05, and the crossing segment 0.45 -> 0.50 (gap
    # 0.05 -> −0.05: two triangles of 0.025 · 0.05 / 2).  Trapezoids of |gap| would give 0.0025 there.
    crossing = np.where(levels < 0.5, levels + 0.05, levels - 0.05)
    expected = 2 * 0.05 * 0.05 / 2 + 0.40 * 0.05 + 0.45 * 0.05 + 2 * 0.025 * 0.05 / 2
    assert miscalibration_area(levels, crossing) == pytest.approx(expected, abs=1e-15)


def test_interval_score_hand_case() -> None:
    """N(0, 1), α = 0.05: width 2·1.95996; y = 3 lies 1.04004 above u: IS = 3.91993 + 40 · 1.04004."""
    z = 1.959963984540054
    assert interval_score(np.zeros(1), np.ones(1), np.array([3.0])) == pytest.approx(2 * z + 40 * (3 - z), rel=1e-12)
    assert interval_score(np.zeros(1), np.ones(1), np.array([-0.5])) == pytest.approx(2 * z, rel=1e-12)


def test_forecast_metrics_match_uncertainty_toolbox() -> None:
    uct = pytest.importorskip("uncertainty_toolbox")
    mean, std, y = _forecasts()
    out = gaussian_forecast_metrics(mean, std, y)
    assert out["crps"] == pytest.approx(uct.crps_gaussian(mean, std, y), rel=1e-12)
    assert out["sharpness"] == pytest.approx(uct.sharpness(std), rel=1e-12)
    assert out["interval_score_95"] == pytest.approx(
        uct.interval_score(mean, std, y, start_p=0.95, end_p=0.95, resolution=1), rel=1e-12
    )
    # the toolbox's curve at linspace(0, 1, 21) is ours with (0, 0) and (1, 1) added
    expected, observed = uct.get_proportion_lists_vectorized(mean, std, y, num_bins=21)
    np.testing.assert_allclose(
        [out[f"interval_coverage_{p:02d}"] for p in range(5, 100, 5)], observed[1:-1], rtol=0, atol=1e-15
    )
    assert out["miscalibration_area"] == pytest.approx(uct.miscalibration_area(mean, std, y, num_bins=21), rel=1e-9)
    assert out["miscalibration_area"] > 0.03  # spread 1.3× the stated one: off the diagonal


def test_forecast_metrics_in_regression_metrics_use_each_spread() -> None:
    pred, truth, observed = hand_case()
    out = regression_metrics(pred, SIGMA, truth=truth, observed=observed)
    epistemic = gaussian_forecast_metrics(pred.mean, pred.std, truth, "_epistemic")
    predictive = gaussian_forecast_metrics(pred.mean, np.sqrt(pred.std**2 + SIGMA**2), observed)
    assert {k: out[k] for k in epistemic} == epistemic
    assert {k: out[k] for k in predictive} == predictive
    assert out["sharpness"] == pytest.approx(math.sqrt(np.mean(np.array([0.02, 0.02, 0.0125]))))
