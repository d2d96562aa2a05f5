"""Pareto fronts of quality against test-time cost: the front on hand cases (ties, dominated points, a
lower-is-better composite, missing values) and the report section on a small synthetic results directory."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from analysis.pareto import draw_front, pareto_front, pareto_fronts, pareto_markdown, quality_composites
from analysis.report import write_report
from ursa_ray.results import ResultsDirectory

NAN = float("nan")
# a hand case: cost (lower is better) and accuracy (higher is better) per method
COST = pd.Series({"a": 1.0, "b": 2.0, "c": 2.0, "d": 3.0, "e": 4.0, "g": 2.0, "h": 5.0})
ACCURACY = pd.Series({"a": 0.5, "b": 0.7, "c": 0.7, "d": 0.6, "e": 0.9, "g": 0.65, "h": 0.9})


def test_front_keeps_ties_and_drops_dominated_points():
    # b and c tie (same cost, same accuracy): neither is strictly better, both optimal.  d is costlier and
    # worse than b; g as costly as b but worse; h as good as e but costlier.
    assert pareto_front(COST, ACCURACY, higher_is_better=True) == ["a", "b", "c", "e"]


def test_front_of_a_lower_is_better_composite():
    nll = pd.Series({"a": 0.5, "b": 0.3, "d": 0.4, "e": 0.2})
    cost = COST[nll.index]
    assert pareto_front(cost, nll, higher_is_better=False) == ["a", "b", "e"]  # d: costlier and worse than b
    assert pareto_front(cost, nll, higher_is_better=True) == ["a"]  # read as higher-is-better, a dominates all


def test_equal_cost_ties_come_by_label_and_one_method_is_its_own_front():
    cost = pd.Series({"y": 1.0, "x": 1.0})
    assert pareto_front(cost, pd.Series({"y": 0.2, "x": 0.2}), higher_is_better=False) == ["x", "y"]
    assert pareto_front(cost, pd.Series({"x": 0.3, "y": 0.2}), higher_is_better=False) == ["y"]
    assert pareto_front(cost[["x"]], pd.Series({"x": 0.3}), higher_is_better=True) == ["x"]


@pytest.mark.parametrize(("costs", "minor_labels"), [((2e-3, 3e-3, 5e-3), True), ((0.2, 3.0, 40.0), False)])
def test_a_log_cost_axis_within_a_decade_labels_its_minor_ticks(costs, minor_labels):
    # within one decade there is no major tick to label: the minor ticks carry the values (2x10^-3, ...)
    fig, ax = plt.subplots()
    cost = pd.Series(costs, index=["a", "b", "c"])
    draw_front(ax, cost, pd.Series([0.5, 0.6, 0.7], index=cost.index), True, "accuracy")
    fig.canvas.draw()
    assert any(label.get_text() for label in ax.xaxis.get_minorticklabels()) is minor_labels
    plt.close(fig)


def test_a_method_missing_a_value_is_left_out_and_named():
    # m would dominate everything (cheapest, best) but has no storage; n has no nll
    scores = pd.DataFrame(
        {
            "accuracy": {"k": 0.8, "l": 0.9, "m": 0.99, "n": 0.7},
            "nll": {"k": 0.4, "l": 0.3, "m": 0.01, "n": NAN},
            "s_per_sample": {"k": 1.0, "l": 1.0, "m": 1.0, "n": 1.0},
            "flops_per_prediction": {"k": 10.0, "l": 20.0, "m": 1.0, "n": 5.0},
            "storage_bytes": {"k": 10.0, "l": 20.0, "m": NAN, "n": 5.0},
            "rank_accuracy": {"k": 3.0, "l": 2.0, "m": 1.0, "n": 4.0},
            "mean_rank": {"k": 3.0, "l": 2.0, "m": 1.0, "n": 4.0},
            "cells": {"k": 1, "l": 1, "m": 1, "n": 1},
        }
    )
    assert quality_composites(scores) == ["accuracy", "nll"]  # no cost, training cost, rank or count column
    fronts = pareto_fronts(scores)
    assert list(fronts.index) == [
        ("flops_per_prediction", "accuracy"),
        ("flops_per_prediction", "nll"),
        ("storage_bytes", "accuracy"),
        ("storage_bytes", "nll"),
    ]
    assert fronts.loc[("flops_per_prediction", "accuracy"), "front"] == ["m"]
    assert fronts.loc[("flops_per_prediction", "nll"), "no_value"] == ["n"]
    assert fronts.loc[("storage_bytes", "accuracy"), "front"] == ["n", "k", "l"]
    assert fronts.loc[("storage_bytes", "accuracy"), "no_value"] == ["m"]
    assert fronts.loc[("storage_bytes", "nll"), "front"] == ["k", "l"]
    assert fronts.loc[("storage_bytes", "nll"), "no_value"] == ["m", "n"]
    assert fronts.loc[("storage_bytes", "nll"), "better"] == "lower"


def test_markdown_lists_fronts_and_left_out_methods(tmp_path):
    scores = pd.DataFrame(
        {
            "accuracy": {"k": 0.8, "l": 0.9, "m": NAN},
            "flops_per_prediction": {"k": 10.0, "l": 20.0, "m": 1.0},
            "storage_bytes": {"k": 30.0, "l": 20.0, "m": 1.0},
        }
    )
    text, figures = pareto_markdown(scores, tmp_path)
    assert "| accuracy | higher | k, l | m |" in text  # against FLOPs
    assert "| accuracy | higher | l | m |" in text  # against storage l is cheaper and better than k
    assert [f.name for f in figures] == ["pareto_flops.png", "pareto_storage.png"]
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in figures)
    text, figures = pareto_markdown(scores.drop(columns="storage_bytes"), tmp_path / "flops_only")
    assert [f.name for f in figures] == ["pareto_flops.png"] and "### Against storage" not in text
    no_cost = scores.drop(columns=["storage_bytes", "flops_per_prediction"])
    assert pareto_markdown(no_cost, tmp_path / "none") == ("", [])
    assert pareto_markdown(scores.drop(columns="accuracy"), tmp_path / "none") == ("", [])  # no quality composite
    assert not (tmp_path / "none").exists()


# A results directory: three methods on one in-domain cell, two seeds each
METHODS = {  # method: (accuracy, nll, flops_per_prediction, storage_bytes_32)
    "sgd": (0.90, 0.40, 4.0e5, 8.0e5),
    "mc_dropout": (0.92, 0.30, 8.0e6, 8.0e5),
    "deep_ensemble": (0.93, 0.25, 2.0e6, 4.0e6),
}


def _results_directory(path, with_cost: bool) -> None:
    results = ResultsDirectory(path)
    for method, (accuracy, nll, flops, storage) in METHODS.items():
        for seed in (0, 1):
            trial_id = f"{method}-{seed}"
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
                "reserved_cpu_s": 10.0,
                "reserved_gpu_s": 0.0,
                "finished_at": float(seed),
                "selection": "",
            }
            values = [("test", "accuracy", accuracy), ("test", "nll", nll)]
            if with_cost:
                values += [("cost", "flops_per_prediction", flops), ("cost", "storage_bytes_32", storage)]
            results.add(
                record,
                [
                    {
                        "trial_id": trial_id,
                        "method": method,
                        "model": "mlp",
                        "dataset": "digits",
                        "seed": seed,
                        "phase": "final",
                        "eval_set": e,
                        "metric": k,
                        "value": v + 0.01 * seed * (k != "flops_per_prediction"),
                    }
                    for e, k, v in values
                ],
            )


def test_report_writes_the_pareto_section_and_figures(tmp_path):
    _results_directory(tmp_path, with_cost=True)
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    section = report.split("## Quality against cost (Pareto fronts)")[1].split("\n## ")[0]
    # FLOPs: sgd 4e5 < deep_ensemble 2e6 < mc_dropout 8e6, and the ensemble is better than MC dropout
    assert "| accuracy | higher | sgd, deep_ensemble | - |" in section.split("### Against storage")[0]
    assert "| nll | lower | sgd, deep_ensemble | - |" in section.split("### Against storage")[0]
    # storage: sgd and mc_dropout equally costly, mc_dropout better
    assert "| accuracy | higher | mc_dropout, deep_ensemble | - |" in section.split("### Against storage")[1]
    for name in ("pareto_flops.png", "pareto_storage.png"):
        assert f"![{name[:-4]}](figures/{name})" in section
        assert (tmp_path / "figures" / name).read_bytes().startswith(b"\x89PNG")


def test_report_has_no_pareto_section_without_cost_composites(tmp_path):
    _results_directory(tmp_path, with_cost=False)
    write_report(tmp_path)
    assert "Pareto fronts" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "figures" / "pareto_flops.png").exists()
