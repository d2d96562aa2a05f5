"""The regression report's proper scores and calibration curves: the table's means and t intervals over
repetitions per (complexity, method, model), the curve's mean observed coverage per level, and the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.regression_calibration import calibration_curves, regression_calibration_section, regression_rows


def _tables():
    trials, metrics = [], []
    for method, crps, widen in (("bd", 0.4, 0.5), ("hmc", 0.02, 1.0)):
        for seed in range(3):
            trial_id = f"{method}-{seed}"
            trials.append({"trial_id": trial_id, "phase": "final", "status": "ok", "task": "regression",
                           "complexity": 2.0, "method": method, "model": "mlp", "dataset": "e1", "seed": seed})  # fmt: skip
            values = {"crps_epistemic": crps + 0.1 * seed, "sharpness_epistemic": 0.3, "rmse_truth": 1.0}
            values |= {f"interval_coverage_{p:02d}_epistemic": widen * p / 100 + 0.01 * seed for p in (5, 50, 95)}
            for metric, value in values.items():
                metrics.append({"trial_id": trial_id, "phase": "final", "method": method, "model": "mlp", "dataset": "e1",
                                "seed": seed, "eval_set": "test", "eval_kind": "in_domain", "metric": metric,
                                "value": value})  # fmt: skip
    trials.append({"trial_id": "clf", "phase": "final", "status": "ok", "task": "classification", "complexity": np.nan,
                   "method": "sgd", "model": "mlp", "dataset": "digits", "seed": 0})  # fmt: skip
    metrics.append({"trial_id": "clf", "phase": "final", "method": "sgd", "model": "mlp", "dataset": "digits",
                    "seed": 0, "eval_set": "test", "eval_kind": "in_domain", "metric": "crps", "value": 9.0})  # fmt: skip
    return pd.DataFrame(metrics), pd.DataFrame(trials)


def test_the_table_and_the_curves_hold_each_methods_repetitions(tmp_path):
    metrics, trials = _tables()
    assert set(regression_rows(metrics, trials)["method"]) == {"bd", "hmc"}  # classification trials left out
    curves = calibration_curves(regression_rows(metrics, trials)).set_index(["method", "level"])["value"]
    assert curves[("bd", 0.95)] == pytest.approx(0.5 * 0.95 + 0.01)  # mean over seeds 0, 1, 2 of + 0.01 · seed
    assert curves[("hmc", 0.05)] == pytest.approx(0.05 + 0.01)
    text, figures = regression_calibration_section(metrics, trials, tmp_path)
    half = stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert "### e1" in text
    assert f"| 2.000 | bd | mlp | 0.500 [{0.5 - half:.3f}, {0.5 + half:.3f}] n=3 |" in text
    assert [f.name for f in figures] == ["e1_calibration_curves.png"] and figures[0].read_bytes()[:4] == b"\x89PNG"
    assert regression_calibration_section(metrics[metrics["trial_id"] == "clf"], trials, tmp_path / "n") == ("", [])
