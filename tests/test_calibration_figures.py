"""Reliability diagrams and risk–coverage curves (analysis/calibration_figures.py) on hand cases, and their
section in ``ursa-ray report``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.calibration_figures import (
    MethodPredictions,
    calibration_section,
    mean_risk_coverage,
    reliability_bins,
    reliability_summary,
)
from ursa_ray.evaluation.metrics import expected_calibration_error
from ursa_ray.evaluation.predictions import metrics_from_predictions
from ursa_ray.results import Location, ResultsDirectory

# five examples, five classes: max probabilities 0.2 (uniform: predicts class 0, label 1, wrong), 0.6 right,
# 0.6 wrong, 0.9 right, 1.0 right.  0.2 = 3/15 and 0.6 = 9/15 sit exactly on bin edges: bins are open below
# and closed above, as the ece metric's, so they fall in bins 3 and 9 (indices 2 and 8).
PROBS = np.array(
    [
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.6, 0.1, 0.1, 0.1, 0.1],
        [0.6, 0.1, 0.1, 0.1, 0.1],
        [0.025, 0.025, 0.9, 0.025, 0.025],
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ]
)
LABELS = np.array([1, 0, 3, 2, 4])


def prediction_table(probs: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    """A saved test-prediction table (the columns of ursa_ray.evaluation.predictions.prediction_table)."""
    table = pd.DataFrame(probs, columns=[f"p{k}" for k in range(probs.shape[1])])
    table.insert(0, "label", labels)
    table.insert(0, "index", np.arange(len(labels)))
    table["total_entropy"] = 0.0
    table["expected_entropy"] = 0.0
    table["mutual_information"] = 0.0
    table["n_samples"] = 1
    return table


def test_reliability_bins_equal_a_hand_count_and_give_the_ece_metric():
    bins, ece = reliability_summary(reliability_bins(PROBS, LABELS))
    filled = bins[bins["count"] > 0]
    assert filled.index.tolist() == [2, 8, 13, 14]  # an edge put in the bin above (side="right") moves 0.2, 0.6
    assert filled["count"].tolist() == [1, 2, 1, 1]
    assert filled["accuracy"].tolist() == [0.0, 0.5, 1.0, 1.0]
    assert filled["confidence"].tolist() == pytest.approx([0.2, 0.6, 0.9, 1.0], abs=1e-15)
    assert bins.loc[8, "low"] == pytest.approx(8 / 15) and bins.loc[8, "high"] == pytest.approx(9 / 15)
    assert bins["accuracy"].isna().sum() == 11  # empty bins have no accuracy, not 0
    # (|0 − 0.2| + |1 − 1.2| + |1 − 0.9| + |1 − 1|) / 5
    assert ece == pytest.approx(0.1, abs=1e-15)
    assert ece == pytest.approx(expected_calibration_error(PROBS, LABELS), abs=1e-15)


def test_reliability_bins_pool_seeds_by_adding_counts():
    method = MethodPredictions()
    method.add(prediction_table(PROBS, LABELS))
    method.add(prediction_table(PROBS[[1, 3]], LABELS[[1, 3]]))
    bins, _ = reliability_summary(method.bins)
    assert bins.loc[[2, 8, 13, 14], "count"].tolist() == [1, 3, 2, 1]
    assert bins.loc[8, "accuracy"] == pytest.approx(2 / 3)


def test_risk_coverage_curve_and_its_area_equal_the_hand_case_and_the_stored_aurc():
    """Confidences 0.9, 0.8, 0.8, 0.6 with errors on one of the tied 0.8s and on 0.6: risk 0, then the tie
    group's expectation (0 + ½)/2 and 1/3, then 2/4; its area is aurc_maxprob as the trial computes it."""
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.6, 0.4]])
    labels = np.array([0, 1, 1, 1])
    method = MethodPredictions()
    method.add(prediction_table(probs, labels))
    coverage, risk = mean_risk_coverage(method.curves)
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert risk.tolist() == pytest.approx([0.0, 0.25, 1 / 3, 0.5], abs=1e-15)
    stored = metrics_from_predictions(prediction_table(probs, labels))["test"]["aurc_maxprob"]
    assert np.mean(risk) == pytest.approx(stored, abs=1e-15)

    method.add(prediction_table(probs, np.array([0, 0, 1, 0])))  # a second seed without errors: risk 0
    coverage, risk = mean_risk_coverage(method.curves)
    assert risk.tolist() == pytest.approx([0.0, 0.125, 1 / 6, 0.25], abs=1e-15)
    assert np.mean(risk) == pytest.approx(stored / 2, abs=1e-15)  # the mean over seeds of the stored metric


def test_curves_of_unequal_length_meet_on_the_shortest_ones_coverages():
    short = (np.array([0.5, 1.0]), np.array([0.0, 0.5]))
    long = (np.array([0.25, 0.5, 0.75, 1.0]), np.array([0.0, 0.2, 1 / 3, 0.5]))
    coverage, risk = mean_risk_coverage([long, short])
    assert coverage.tolist() == [0.5, 1.0]
    assert risk.tolist() == pytest.approx([0.1, 0.5])


def write_classification_results(path, with_predictions: set[str]) -> None:
    """Two methods × two seeds on mlp/digits, test metrics only; ``with_predictions``: the trial ids that
    also save their test predictions."""
    results = ResultsDirectory(path)
    for method in ("a", "b"):
        for seed in (0, 1):
            trial_id = f"{method}-{seed}"
            probs = np.roll(PROBS, seed, axis=0) if method == "a" else PROBS
            record = {
                "trial_id": trial_id,
                "phase": "final",
                "cell": f"{method}/mlp/digits",
                "method": method,
                "method_name": method,
                "model": "mlp",
                "dataset": "digits",
                "task": "classification",
                "decision_task": False,
                "seed": seed,
                "status": "ok",
                "reserved_cpu_s": 1.0,
                "reserved_gpu_s": 0.0,
                "finished_at": float(seed),
                "selection": "",
            }
            table = prediction_table(probs, LABELS)
            rows = [
                {
                    "trial_id": trial_id,
                    "method": method,
                    "model": "mlp",
                    "dataset": "digits",
                    "seed": seed,
                    "phase": "final",
                    "eval_set": "test",
                    "metric": metric,
                    "value": value,
                }
                for metric, value in metrics_from_predictions(table)["test"].items()
            ]
            results.add(record, rows, predictions={"test": table} if trial_id in with_predictions else None)


def test_section_draws_both_figures_per_cell_and_leaves_out_trials_without_predictions(tmp_path):
    write_classification_results(tmp_path, {"a-0", "a-1", "b-0"})
    where = Location.parse(tmp_path)
    results = ResultsDirectory(where)
    lines, figures = calibration_section(where, results.read("metrics"), results.read("trials"), tmp_path / "f")
    assert [f.name for f in figures] == ["reliability_mlp_digits.png", "risk_coverage_mlp_digits.png"]
    assert all(f.stat().st_size > 10_000 for f in figures)
    text = "\n".join(lines)
    assert "![reliability_mlp_digits](figures/reliability_mlp_digits.png)" in text
    assert "1 final trials without saved test predictions are left out." in text


def test_report_has_the_section_with_figures_or_one_line_without_predictions(tmp_path):
    from analysis.report import write_report

    write_classification_results(tmp_path / "with", {"a-0", "a-1", "b-0", "b-1"})
    write_report(tmp_path / "with")
    report = (tmp_path / "with" / "report.md").read_text()
    assert "## Reliability and selective prediction" in report
    assert "![risk_coverage_mlp_digits](figures/risk_coverage_mlp_digits.png)" in report
    assert (tmp_path / "with" / "figures" / "reliability_mlp_digits.png").exists()

    write_classification_results(tmp_path / "without", set())
    write_report(tmp_path / "without")
    report = (tmp_path / "without" / "report.md").read_text()
    assert "No saved test predictions (grid key `save_predictions: true`)" in report
    assert not list((tmp_path / "without" / "figures").glob("reliability_*"))
