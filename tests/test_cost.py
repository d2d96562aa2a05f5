"""The compute-cost report on hand cases: every phase's reserved hours, a reference posterior's included, add
up to trials.parquet's; a method's search + inference hours, its calibrated variant's the same."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.cost import compute_hours, cost_markdown, cost_table

TRIALS = pd.DataFrame(
    {
        "trial_id": ["s1", "f1", "f2", "r1", "b1"],
        "phase": ["search", "final", "final", "reference", "final"],
        "method": ["sgd_ts", "sgd_ts", "hmc", "reference", "bd"],
        "cell": ["sgd_ts/mlp/digits", "sgd_ts/mlp/digits", "hmc/mlp/digits", "reference/mlp/digits", "bd/mlp/e1"],
        "task": ["classification"] * 4 + ["regression"],
        "reserved_cpu_s": [1800.0, 3600.0, 7200.0, 9000.0, 100.0],
        "reserved_gpu_s": [0.0, 0.0, 0.0, 1800.0, 0.0],
        "finished_at": [1.0, 2.0, 3.0, 4.0, 5.0],
        "selection": [""] * 5,
    }
)


def test_the_reference_phase_is_counted_in_the_cost_table_and_its_totals():
    table = cost_table(TRIALS, pd.DataFrame())
    reference = table.loc[("reference", "mlp/digits")]
    assert reference["reference_trials"] == 1 and reference["final_trials"] == 0
    assert reference["reference_cpu_h"] == reference["total_cpu_h"] == 2.5
    assert reference["reference_gpu_h"] == reference["total_gpu_h"] == 0.5
    assert table["total_cpu_h"].sum() == pytest.approx(TRIALS["reserved_cpu_s"].sum() / 3600)
    assert table.loc[("sgd_ts", "mlp/digits"), "total_cpu_h"] == 1.5  # search 0.5 + final 1.0
    text, _ = cost_markdown(TRIALS, pd.DataFrame(), pd.DataFrame(), None)
    assert "reference_cpu_h = 2.5000" in text and "total_cpu_h = 6.0278" in text


def test_without_a_reference_the_table_has_no_reference_columns():
    table = cost_table(TRIALS[TRIALS["phase"] != "reference"], pd.DataFrame())
    assert not [c for c in table if c.startswith("reference_")]


def test_compute_hours_per_method_and_its_calibrated_variant():
    labels = pd.Index(["sgd_ts", "sgd_ts@calibrated", "hmc", "bd"])
    hours = compute_hours(TRIALS, labels)
    assert hours[["sgd_ts", "sgd_ts@calibrated", "hmc"]].tolist() == [1.5, 1.5, 2.0]  # search + final
    assert pd.isna(hours["bd"]) and list(hours.index) == list(labels)  # regression trials are not counted
