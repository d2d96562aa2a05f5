"""Coverage statistics, markdown and figures, checked on small hand-made points tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.coverage import coverage_summary, coverage_table, named_point_table, regression_markdown
from analysis.regression_figures import _series_names, write_regression_figures


def hand_table() -> pd.DataFrame:
    """Two methods (on the model "mlp"; the anchor on "true_features"), one cell, two points (0
    in-distribution, 1 OOD), four repetitions."""
    rows = []
    truth = {0: 1.0, 1: -2.0}
    # method "m": (mean, std) per repetition and point
    m = {
        0: [(1.1, 0.1), (0.7, 0.1), (1.0, 0.2), (1.5, 0.2)],  # deviations .1 .3 0 .5; covered 1 0 1 0
        1: [(-2.0, 0.5), (-1.0, 0.4), (-3.0, 0.6), (-2.2, 0.1)],  # deviations 0 1 1 .2; covered 1 0 1 0
    }
    blr = {0: 0.15, 1: 0.3}
    for rep in range(4):
        for pid in (0, 1):
            mean, std = m[pid][rep]
            common = dict(
                experiment="e1",
                complexity=2,
                repetition=rep,
                point_id=pid,
                x=[float(pid)],
                in_distribution=pid == 0,
                truth=truth[pid],
            )
            rows.append(dict(trial_id=f"m{rep}", method="m", model="mlp", mean=mean, std=std, **common))
            rows.append(
                dict(
                    trial_id=f"b{rep}",
                    method="blr",
                    model="true_features",
                    mean=truth[pid] + 0.01 * (rep - 1.5),
                    std=blr[pid],
                    **common,
                )
            )
    return pd.DataFrame(rows)


def test_per_point_statistics_match_direct_computation() -> None:
    table = coverage_table(hand_table()).set_index(["method", "point_id"])
    row = table.loc[("m", 0)]
    dev = np.array([0.1, 0.3, 0.0, 0.5])
    assert row["k"] == 4 and bool(row["in_distribution"])
    assert row["deviation"] == pytest.approx(dev.mean())
    assert row["deviation_se"] == pytest.approx(dev.std(ddof=1) / 2)
    assert row["uncertainty"] == pytest.approx(0.15)
    assert row["uncertainty_se"] == pytest.approx(np.std([0.1, 0.1, 0.2, 0.2], ddof=1) / 2)
    assert row["coverage"] == pytest.approx(0.5)
    assert row["coverage_se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 4))
    assert row["anchor_uncertainty"] == pytest.approx(0.15)
    assert row["uncertainty_ratio"] == pytest.approx(1.0) and not row["below_anchor"]
    row = table.loc[("m", 1)]
    # |−2 − −2| = 0 ≤ 1.96·.5; 1 > .784; 1 ≤ 1.176; .2 ≤ .196? no  → covered 1 0 1 0
    assert row["coverage"] == pytest.approx(0.5)
    assert row["uncertainty"] == pytest.approx(0.4)
    assert row["uncertainty_ratio"] == pytest.approx(0.4 / 0.3) and not row["below_anchor"]
    blr = table.loc[("blr", 0)]
    assert blr["coverage"] == 1.0 and blr["coverage_se"] == 0.0 and blr["uncertainty_ratio"] == 1.0


def test_below_anchor_flag_and_summary_aggregates() -> None:
    points = hand_table()
    points.loc[(points["method"] == "m") & (points["point_id"] == 0), "std"] = 0.05
    table = coverage_table(points).set_index(["method", "point_id"])
    assert table.loc[("m", 0), "below_anchor"] and table.loc[("m", 0), "uncertainty_ratio"] == pytest.approx(1 / 3)
    assert not table.loc[("m", 1), "below_anchor"]

    summary = coverage_summary(hand_table()).set_index(["method", "in_distribution"])
    # one point per region: the region mean over repetitions is the per-point mean, SE over repetitions
    ood = summary.loc[("m", False)]
    dev = np.array([0.0, 1.0, 1.0, 0.2])
    cov = np.array([1, 0, 1, 0], float)
    assert ood["k"] == 4 and ood["n_points"] == 1
    assert ood["deviation"] == pytest.approx(dev.mean()) and ood["deviation_se"] == pytest.approx(dev.std(ddof=1) / 2)
    assert ood["coverage"] == pytest.approx(0.5) and ood["coverage_se"] == pytest.approx(cov.std(ddof=1) / 2)
    assert ood["uncertainty_ratio"] == pytest.approx(0.4 / 0.3) and ood["share_below_anchor"] == 0.0


def test_summary_averages_points_within_each_repetition() -> None:
    points = hand_table()
    points["in_distribution"] = True  # both points in one region
    s = coverage_summary(points).set_index("method").loc["m"]
    dev = np.array([[0.1, 0.0], [0.3, 1.0], [0.0, 1.0], [0.5, 0.2]]).mean(axis=1)  # per repetition
    cov = np.array([[1, 1], [0, 0], [1, 1], [0, 0]], float).mean(axis=1)
    unc = np.array([[0.1, 0.5], [0.1, 0.4], [0.2, 0.6], [0.2, 0.1]]).mean(axis=1)
    assert s["n_points"] == 2 and s["k"] == 4
    assert s["deviation"] == pytest.approx(dev.mean()) and s["deviation_se"] == pytest.approx(dev.std(ddof=1) / 2)
    assert s["uncertainty"] == pytest.approx(unc.mean()) and s["uncertainty_se"] == pytest.approx(unc.std(ddof=1) / 2)
    assert s["coverage"] == pytest.approx(0.5) and s["coverage_se"] == pytest.approx(cov.std(ddof=1) / 2)
    assert s["uncertainty_ratio"] == pytest.approx((1.0 + 0.4 / 0.3) / 2)


def test_a_label_run_on_two_models_keeps_the_rows_of_both() -> None:
    """The label "m" on the models "mlp" and "wide" (shifted by +1): neither model's rows are dropped as
    duplicates, each keeps its k = 4 repetitions and its own statistics, and both share the anchor."""
    points = hand_table()
    wide = points[points["method"] == "m"].assign(
        model="wide", trial_id=lambda f: "w" + f["trial_id"], mean=lambda f: f["mean"] + 1.0
    )
    points = pd.concat([points, wide], ignore_index=True)
    table = coverage_table(points).set_index(["method", "model", "point_id"])
    assert table.loc[("m", "mlp", 0), "k"] == table.loc[("m", "wide", 0), "k"] == 4
    assert table.loc[("m", "mlp", 0), "deviation"] == pytest.approx(np.mean([0.1, 0.3, 0.0, 0.5]))
    assert table.loc[("m", "wide", 0), "deviation"] == pytest.approx(np.mean([1.1, 0.7, 1.0, 1.5]))
    assert table.loc[("m", "wide", 0), "uncertainty_ratio"] == pytest.approx(1.0)  # the anchor's std 0.15
    assert table.loc[("blr", "true_features", 0), "k"] == 4
    summary = coverage_summary(points).set_index(["method", "model", "in_distribution"])
    assert summary.loc[("m", "wide", True), "k"] == summary.loc[("m", "mlp", True), "k"] == 4
    assert "| m | wide |" in regression_markdown(points)
    assert set(_series_names(points)) == {"m (mlp)", "m (wide)", "blr"}  # one figure series per model


def synthetic_points() -> pd.DataFrame:
    """Anchor rows plus a biased, over-confident fake method for e1 (two complexities) and e3."""
    from ursa_ray.data.synthetic_regression import make_dataset
    from ursa_ray.regression.points import anchor_points, points_frame

    frames = []
    for experiment, complexities in (("e1", (1.0, 3.0)), ("e3", (1.0,))):
        for c in complexities:
            for rep in range(3):
                ds = make_dataset(experiment, c, rep)
                blr = anchor_points(ds, complexity=c, repetition=rep, trial_id=f"{experiment}-{c}-{rep}-blr")
                frames.append(blr)
                frames.append(
                    points_frame(
                        ds,
                        blr["mean"] + 0.05,
                        blr["std"] * 0.5,
                        method="fake",
                        model="mlp",
                        complexity=c,
                        repetition=rep,
                        trial_id=f"{experiment}-{c}-{rep}-fake",
                    )
                )
    return pd.concat(frames, ignore_index=True)


@pytest.mark.slow
def test_named_points_markdown_and_figures(tmp_path) -> None:
    points = synthetic_points()
    points.to_parquet(tmp_path / "points.parquet")
    points = pd.read_parquet(tmp_path / "points.parquet")  # x comes back as arrays
    named = named_point_table(points)
    assert set(named["label"]) == {"x=-2.38", "x=1.2", "x=-5.11"}
    assert len(named) == 3 * 2 * 2  # points × complexities × methods
    assert named[named["method"] == "fake"]["below_anchor"].all()
    text = regression_markdown(points)
    assert "### e1: named test points" in text and "### e3: averages" in text and "| x=-5.11 (OOD) |" in text
    paths = write_regression_figures(points, tmp_path / "figures")
    names = {p.name for p in paths}
    assert {
        "e1_bands_c1.png",
        "e1_bands_c3.png",
        "e1_named_points.png",
        "e1_regions.png",
        "e3_heatmaps_c1.png",
    } <= names
    for p in paths:
        assert p.exists() and p.stat().st_size > 5000
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
