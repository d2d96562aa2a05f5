"""The search phase: best configuration reaches the final phase, test data is never touched, cost totals add up."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from light_evaluation import LIGHT_EVALUATION

from analysis.cost import cost_table
from ursa_ray.cli import main
from ursa_ray.data import digits
from ursa_ray.grid import parse_grid
from ursa_ray.prepare import validation_split
from ursa_ray.trial import run_trial

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

SEARCH_GRID = {
    "name": "search",
    "methods": [{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1.0e-4, "high": 0.5}}}],
    "models": [{"name": "mlp", "options": {"widths": [32]}}],
    "datasets": [{"name": "digits", "ood": ["noise"]}],
    "seeds": [0, 1],
    "resources": {"cpu": 1},
    "budget": {"epochs": 2, "batch_size": 128},
    "search": {"algorithm": "random", "n_trials": 3, "metric": "val_nll"},
    **LIGHT_EVALUATION,  # the final trials' evaluation is not what these tests are about
}


@pytest.fixture(scope="module")
def search_run(ray_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("search")
    grid_file = folder / "search.yaml"
    grid_file.write_text(yaml.safe_dump(SEARCH_GRID))
    assert main(["run", str(grid_file), "--out", str(folder / "results")]) == 0
    return folder / "results"


def test_best_search_configuration_reaches_final_phase(search_run):
    trials = pd.read_parquet(search_run / "trials.parquet")
    search = trials[trials["phase"] == "search"]
    final = trials[trials["phase"] == "final"]
    assert len(search) == 3 and len(final) == 2
    scores = search["selection"].map(lambda s: json.loads(s)["val_nll"])
    best_lr = json.loads(search.loc[scores.idxmin(), "config"])["lr"]
    assert len({json.loads(c)["lr"] for c in search.config}) == 3  # three sampled configurations
    for config in final["config"]:
        assert json.loads(config)["lr"] == pytest.approx(best_lr)
    metrics = pd.read_parquet(search_run / "metrics.parquet")
    assert set(metrics.loc[metrics["phase"] == "search", "eval_set"]) == {"validation", "cost"}


def test_cost_report_totals_equal_trial_rows(search_run):
    trials = pd.read_parquet(search_run / "trials.parquet")
    metrics = pd.read_parquet(search_run / "metrics.parquet")
    table = cost_table(trials, metrics)
    for phase in ("search", "final"):
        rows = trials[trials["phase"] == phase]
        assert table[f"{phase}_cpu_h"].sum() == pytest.approx(rows["reserved_cpu_s"].sum() / 3600)
        assert table[f"{phase}_trials"].sum() == len(rows)
    assert table["total_cpu_h"].sum() == pytest.approx(trials["reserved_cpu_s"].sum() / 3600)
    assert main(["report", str(search_run), "--cost"]) == 0
    report = (search_run / "report.md").read_text()
    assert "## Compute cost: hyperparameter search + inference" in report
    assert (search_run / "figures" / "search_anytime.png").stat().st_size > 1000
    assert (search_run / "figures" / "pareto_compute.png").stat().st_size > 1000


def test_resumed_search_phase_does_not_repeat_trials(search_run, capsys):
    grid_file = search_run.parent / "search.yaml"
    assert main(["run", str(grid_file), "--out", str(search_run)]) == 0
    trials = pd.read_parquet(search_run / "trials.parquet")
    assert (trials["phase"] == "search").sum() == 3 and (trials["phase"] == "final").sum() == 2
    assert "(2 already finished)" in capsys.readouterr().out


def test_search_phase_never_evaluates_test_data(monkeypatch):
    """Poison the test inputs with NaN: a final trial must fail on them, a search trial must not see them."""
    real = digits.load_digits_dataset

    def poisoned(*args, **kwargs):
        ds = real(*args, **kwargs)
        ds.test_x = torch.full_like(ds.test_x, float("nan"))
        return ds

    from dataclasses import replace

    from ursa_ray import data

    patched = replace(data.get_dataset("digits"), load=poisoned)
    monkeypatch.setitem(data.registry(), "digits", patched)
    # no corruption sets: corrupting NaN images would fail before the network sees them
    grid = parse_grid({**SEARCH_GRID, "datasets": ["digits"], "corruptions": {"types": []}}, "s.yaml")
    cell = grid.cells()[0]
    search_spec = grid.spec_for(cell, 0, "search", {"lr": 0.05})
    outcome = run_trial(search_spec)
    assert np.isfinite(outcome.selection["val_nll"])
    assert {m["eval_set"] for m in outcome.metrics} == {"validation", "cost"}
    with pytest.raises(FloatingPointError):
        run_trial(grid.spec_for(cell, 0, "final", {"lr": 0.05}))


def test_validation_split_is_seeded_and_disjoint():
    fit, val = validation_split(100, 0.2, seed=3)
    assert len(val) == 20 and len(fit) == 80
    assert not set(fit.tolist()) & set(val.tolist())
    assert torch.equal(validation_split(100, 0.2, seed=3)[1], val)
    assert not torch.equal(validation_split(100, 0.2, seed=4)[1], val)
