"""What users do to the search phase: diverging configurations, compute budgets, Ctrl-C and resume.

Each test runs the real CLI on the tiny MLP and the embedded digits set (in-process on the session's Ray,
or as a subprocess where a signal is sent), plus unit tests of the pieces each outcome rests on: the
searcher told about failed trials and earlier runs, the budget counting running trials, and trials cut
short by the budget recorded with their compute.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from light_evaluation import LIGHT_EVALUATION

from analysis.cost import cost_markdown, cost_table
from analysis.tables import load_results
from ursa_ray.cli import main
from ursa_ray.grid import parse_grid
from ursa_ray.results import ResultsDirectory
from ursa_ray.tune.callback import ResultsCallback, RunSummary
from ursa_ray.tune.interrupt import Interrupt, RunStopper
from ursa_ray.tune.search import ComputeBudget, _search_algorithm, search_plan
from ursa_ray.tune.trainable import pack

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

MLP = [{"name": "mlp", "options": {"widths": [32]}}]
DIGITS = [{"name": "digits", "ood": ["noise"]}]


def _write(tmp_path, grid: dict) -> str:
    path = tmp_path / f"{grid['name']}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return str(path)


def _val(selection: str, metric: str = "val_nll") -> float:
    return json.loads(selection or "{}").get(metric, math.nan)


# --- a search space whose upper learning rates diverge ------------------------------------------------------

DIVERGING = {
    "name": "diverging",
    "methods": [
        # momentum 0.99: lr >= ~3e3 makes the loss NaN (FloatingPointError); seed 0 draws 2.3e4, 5.0, 0.026, 0.015
        {
            "name": "sgd",
            "hyperparameters": {"momentum": 0.99},
            "search": {"lr": {"type": "loguniform", "low": 0.01, "high": 1.0e8}},
        },
        {
            "name": "sgd",
            "label": "sgd_diverging",
            "hyperparameters": {"momentum": 0.99},
            "search": {"lr": {"type": "loguniform", "low": 1.0e4, "high": 1.0e6}},
        },
    ],
    "models": MLP,
    "datasets": DIGITS,
    "seeds": [0],
    "resources": {"cpu": 1},
    "budget": {"epochs": 2, "batch_size": 128},
    "search": {"algorithm": "random", "n_trials": 4, "metric": "val_nll", "max_concurrent": 1},
    **LIGHT_EVALUATION,  # the final trial's evaluation is not what these tests are about
}


def test_diverging_search_trials_fail_and_the_run_goes_on(ray_session, tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["run", _write(tmp_path, DIVERGING), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 1, printed.out + printed.err  # some trials failed: not a traceback, not 0
    trials = pd.read_parquet(out / "trials.parquet")
    search = trials[trials["phase"] == "search"]
    mixed, diverging = search[search["cell"] == "sgd/mlp/digits"], search[search["cell"] == "sgd_diverging/mlp/digits"]
    assert len(mixed) == 4 and len(diverging) == 4 and search["trial_id"].is_unique
    assert (diverging["status"] == "failed").all()
    assert set(mixed["status"]) == {"ok", "failed"}  # the cell's search went on past its failed trial
    failed = search[search["status"] == "failed"]
    assert failed["error"].str.contains("FloatingPointError").all()
    for lr in (json.loads(c)["lr"] for c in failed["config"]):
        assert lr > 1.0e3
    # recorded with their compute, and without a selection metric
    assert (failed["wall_s"] > 0).all() and (failed["cpu_s"] > 0).all()
    assert (failed["reserved_cpu_s"] == failed["wall_s"]).all()
    assert all(math.isnan(_val(s)) for s in failed["selection"])
    # the final phase ran for the cell that has a finished configuration, with the best of them, and only there
    final = trials[trials["phase"] == "final"]
    assert list(final["cell"]) == ["sgd/mlp/digits"] and (final["status"] == "ok").all()
    ok = mixed[mixed["status"] == "ok"]
    best = ok.loc[ok["selection"].map(_val).idxmin()]
    chosen = json.loads(final["config"].iloc[0])["lr"]
    assert chosen == pytest.approx(json.loads(best["config"])["lr"]) and chosen < 1.0e3
    metrics = pd.read_parquet(out / "metrics.parquet")
    nll = metrics[(metrics["phase"] == "final") & (metrics["eval_set"] == "test") & (metrics["metric"] == "nll")]
    assert len(nll) == 1 and math.isfinite(nll["value"].iloc[0])
    # what the user reads last
    n_failed = len(failed)
    assert f"{n_failed} failed ({n_failed} of them search trials)" in printed.out
    assert f"{n_failed} search trial(s) failed" in printed.out
    assert "FAILED cell sgd_diverging/mlp/digits: every one of its 4 search trial(s) failed" in printed.err
    assert "Traceback" not in printed.out + printed.err
    # the cost report counts the failed trials' compute
    table = cost_table(trials, metrics)
    assert table["search_cpu_h"].sum() == pytest.approx(search["reserved_cpu_s"].sum() / 3600)
    assert table["search_trials"].sum() == 8


@pytest.mark.parametrize(
    ("failed", "failed_cells", "code"),
    [
        ([("search-a-1", "FloatingPointError: nan"), ("search-a-2", "FloatingPointError: nan")], [], 0),
        ([("search-a-1", "FloatingPointError: nan"), ("final-b", "RuntimeError: boom")], [], 1),
        ([("search-c-1", "FloatingPointError: nan")], [("sgd_diverging/mlp/digits", "every one failed")], 1),
    ],
)
def test_run_exit_status_counts_final_trials_not_search_trials(
    tmp_path, monkeypatch, capsys, failed, failed_cells, code
):
    """Diverging search configurations are an expected outcome: exit 0 when every final trial ran and succeeded
    (saying how many search trials failed); 1 when a final trial failed or a cell's final phase could not run.
    Catches the old rule (exit 1 on any failed trial, search trials included)."""
    import ursa_ray.api

    summary = RunSummary(planned=1, finished=["final-a"], failed=failed, failed_cells=failed_cells)
    summary.search_failed = [t for t, _ in failed if t.startswith("search-")]
    summary.recorded = {"search": len(summary.search_failed), "final": 1 + len(failed) - len(summary.search_failed)}
    summary.planned = summary.recorded["final"]
    monkeypatch.setattr(ursa_ray.api, "run_checked", lambda *args, **kwargs: summary)
    assert main(["run", _write(tmp_path, DIVERGING), "--out", str(tmp_path / "r")]) == code
    printed = capsys.readouterr()
    assert f"{len(summary.search_failed)} search trial(s) failed" in printed.out
    assert ("final-b" in printed.err) == (code == 1 and not failed_cells)


# --- a search stopped by its compute budget (TPE + ASHA) -----------------------------------------------------

BUDGET_S = 25  # the first trial, a fresh worker's warm-up included, took 3.5-4 s on a fast hour and 12 s on a slow one
BUDGETED = {
    "name": "budgeted",
    "methods": [
        {
            "name": "mc_dropout",
            "hyperparameters": {"n_samples": 4},  # a report per sample: ASHA's rungs
            "search": {
                "lr": {"type": "loguniform", "low": 0.01, "high": 0.5},
                "p": {"type": "uniform", "low": 0.05, "high": 0.5},
            },
        },
    ],
    "models": MLP,
    "datasets": DIGITS,
    "seeds": [0],
    "resources": {"cpu": 1},
    "budget": {"epochs": 15, "batch_size": 64},
    # no n_trials: the budget alone ends the search.  The first trial pays the worker's start and warm-up (3.5-4 s
    # measured on the 2-core machine, where each later trial takes 0.1-0.2 s): a budget of about three first trials
    "search": {
        "algorithm": "tpe",
        "scheduler": "asha",
        "cpu_seconds": BUDGET_S,
        "metric": "val_nll",
        "max_concurrent": 1,
    },
    **LIGHT_EVALUATION,
}


def test_budget_stops_a_tpe_asha_search_cleanly_and_its_compute_adds_up(ray_session, tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["run", _write(tmp_path, BUDGETED), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err  # complete: not 130 (interrupted), not 1
    assert "search budget spent (search complete) in 1 cell(s): mc_dropout/mlp/digits" in printed.out
    assert "interrupted" not in printed.err
    assert not re.search(r"\b1000\b", printed.out)  # no plan of 1,000 phantom trials, no "[k/1000]"
    trials = pd.read_parquet(out / "trials.parquet")
    search = trials[trials["phase"] == "search"]
    assert len(search) >= 2 and (search["status"] == "ok").any() and search["trial_id"].is_unique
    # every trial that ran is recorded with its compute, the one the budget cut short included: the recorded
    # search compute reaches the budget, and exceeds it by no more than the stopper's reaction time (running
    # trials are counted, so no trial runs on after the budget is spent)
    spent = search["reserved_cpu_s"].sum()
    assert BUDGET_S <= spent <= BUDGET_S + 3.0, search[["status", "wall_s", "error"]]
    assert (search["wall_s"] > 0).all()
    cut = search[search["error"].str.contains("budget")]
    assert (cut["status"] == "early_stopped").all()
    assert len(trials[trials["phase"] == "final"]) == 1  # the final phase ran with the best configuration
    # the cost report's search total is those trials' compute: its section as `ursa-ray report --cost` prints it
    # (the whole report, 4 s more, is test_search.py's test_cost_report_totals_equal_trial_rows)
    results = load_results(out)
    report, _ = cost_markdown(results.trials, results.metrics, pd.DataFrame(), tmp_path / "figures")
    reported = float(re.search(r"All cells: search_cpu_h = ([0-9.]+)", report).group(1))
    assert reported == pytest.approx(spent / 3600, abs=5e-5)
    assert cost_table(trials, results.metrics)["search_cpu_h"].sum() == pytest.approx(spent / 3600)


# --- Ctrl-C during the search phase, then a rerun ------------------------------------------------------------

INTERRUPTED = {
    "name": "interrupted",
    "methods": [{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 0.01, "high": 0.5}}}],
    "models": MLP,
    "datasets": DIGITS,
    "seeds": [0],
    "resources": {"cpu": 1},
    "budget": {"epochs": 40, "batch_size": 64},  # a trial of a few seconds: Ctrl-C lands inside the next one
    "search": {"algorithm": "random", "n_trials": 3, "metric": "val_nll", "max_concurrent": 1},
    **LIGHT_EVALUATION,
}


def test_ctrl_c_in_the_search_phase_stops_the_run_and_a_rerun_resumes_the_search(ray_session, tmp_path, capsys):
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    address = ray_session.get_runtime_context().gcs_address  # the session's Ray: no start-up per run
    run = ["run", _write(tmp_path, INTERRUPTED), "--out", str(out)]
    command = [sys.executable, "-m", "ursa_ray.cli", *run, "--address", address]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        for line in process.stdout:  # the progress line is printed once the trial's rows are written
            lines.append(line)
            if line.startswith("[1/3]"):
                process.send_signal(signal.SIGINT)
                break
        rest, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "stopped in the search phase: the final phase did not start" in output
    assert "final phase:" not in output and "best val_nll" not in output
    first = pd.read_parquet(out / "trials.parquet")
    assert (first["phase"] == "search").all() and 1 <= len(first) < 3, output  # cut short, nothing more
    assert (first["status"] == "ok").all()

    code = main(run)  # the rerun needs no signal: in-process, on the same session Ray
    rerun = capsys.readouterr()
    assert code == 0, rerun.out + rerun.err
    assert f"{3 - len(first)} trial(s) ({len(first)} already finished)" in rerun.out
    trials = pd.read_parquet(out / "trials.parquet")
    search = trials[trials["phase"] == "search"]
    assert len(search) == 3 and search["trial_id"].is_unique and (search["status"] == "ok").all()
    assert set(first["trial_id"]) <= set(search["trial_id"])  # the finished ones were kept, not repeated
    assert len({json.loads(c)["lr"] for c in search["config"]}) == 3  # no configuration drawn twice
    assert (trials["phase"] == "final").sum() == 1


# --- the pieces, without Ray --------------------------------------------------------------------------------


def test_tpe_is_told_failed_trials_as_pruned_and_learns_earlier_runs():
    import optuna
    from ray import tune

    history = [({"hp/lr": 0.1}, 0.4, "complete"), ({"hp/lr": 0.3}, None, "pruned"), ({"hp/lr": 0.01}, 0.9, "pruned")]
    searcher = _search_algorithm(SimpleNamespace(algorithm="tpe"), seed=0, history=history)
    assert searcher.set_search_properties(
        "val_nll", "min", {"spec": {"x": 1}, "hp": {"lr": tune.loguniform(1e-3, 1.0)}}
    )
    study = searcher._ot_study
    states = [(t.params["hp/lr"], t.state) for t in study.trials]
    assert states == [
        (0.1, optuna.trial.TrialState.COMPLETE),
        (0.3, optuna.trial.TrialState.PRUNED),
        (0.01, optuna.trial.TrialState.PRUNED),
    ]
    assert study.trials[0].value == 0.4 and study.trials[2].intermediate_values == {0: 0.9}
    for trial_id in ("failed", "finished", "infinite"):
        assert 1e-3 <= searcher.suggest(trial_id)["hp"]["lr"] <= 1.0
    # a failed trial reports no metric (and a diverging one may report NaN while running); Tune hands its last
    # report to on_trial_result, then to on_trial_complete
    failed = {"status": "failed", "cpu_s": 0.1, "training_iteration": 2}
    searcher.on_trial_result("failed", {"val_nll": math.nan, "training_iteration": 1})
    searcher.on_trial_result("failed", failed)
    searcher.on_trial_complete("failed", failed)
    searcher.on_trial_result("finished", {"val_nll": 0.7, "training_iteration": 1})
    searcher.on_trial_complete("finished", {"status": "ok", "val_nll": 0.5, "training_iteration": 2})
    searcher.on_trial_complete("infinite", {"status": "ok", "val_nll": math.inf, "training_iteration": 1})
    told = {t.number: t for t in study.trials}
    assert told[3].state == optuna.trial.TrialState.PRUNED and told[3].intermediate_values == {}
    assert told[4].state == optuna.trial.TrialState.COMPLETE and told[4].value == 0.5
    assert told[4].intermediate_values == {1: 0.7}
    assert told[5].state == optuna.trial.TrialState.PRUNED  # not a value TPE could rank as good


def _rows(*statuses_and_seconds):
    return pd.DataFrame([{"status": s, "reserved_cpu_s": c, "reserved_gpu_s": 0.0} for s, c in statuses_and_seconds])


def test_search_plan_counts_finished_trials_as_done_and_every_trial_as_spent():
    rows = _rows(("ok", 10.0), ("failed", 4.0), ("early_stopped", 6.0), ("failed", 2.0))
    counted = SimpleNamespace(n_trials=5, cpu_seconds=None, gpu_seconds=None)
    remaining, finished, budget = search_plan(rows, counted)
    assert (remaining, finished) == (3, 2)  # failed trials are not done: a rerun runs others in their place
    assert not budget.active and not budget.exhausted()
    budgeted = SimpleNamespace(n_trials=None, cpu_seconds=25.0, gpu_seconds=None)  # a budget alone
    remaining, finished, budget = search_plan(rows, budgeted)
    assert remaining is None and budget.spent_before == (22.0, 0.0)  # no trial count planned; failed ones spent
    assert not budget.exhausted() and budget.exhausted((3.0, 0.0))
    assert search_plan(_rows(), SimpleNamespace(n_trials=4, cpu_seconds=None, gpu_seconds=None))[:2] == (4, 0)


def _search_spec(**resources):
    """A search spec of DIVERGING's first method, whose trials ask for 2 CPUs (and ``resources``)."""
    methods = [{**DIVERGING["methods"][0], "resources": resources}]
    grid = parse_grid({**DIVERGING, "methods": methods, "resources": {"cpu": 2}}, "s.yaml")
    return grid.spec_for(grid.cells()[0], 0, "search", {})


def _callback(tmp_path, stopper=None, summary=None):
    results = ResultsDirectory(tmp_path / "results")
    return ResultsCallback(results, summary or RunSummary(), lambda line: None, None, stopper)


def _start(callback, trial, started):
    """Tune starting ``trial`` at time ``started``."""
    callback.started[trial.trial_id] = started
    callback.on_trial_start(0, [], trial)


def test_the_budget_counts_running_trials_at_their_own_requests():
    stopper = RunStopper(Interrupt(), lambda line: None, ComputeBudget(cpu_seconds=20.0, gpu_seconds=2.0))
    callback = _callback_without_results(stopper)
    # the specs first: building one parses a grid, which may take seconds on a loaded machine, and the
    # budget's clock is the wall clock from here on
    specs = {"a": _search_spec(), "b": _search_spec(cpu=1), "c": _search_spec(gpu=0.5), "d": _search_spec()}
    now = time.time()
    _start(callback, _fake_trial(specs["a"], "a"), now - 6.0)  # running: 2 CPUs x 6 s = 12 reserved CPU-s
    assert not stopper.stop_all()
    _start(callback, _fake_trial(specs["b"], "b"), now - 4.0)  # 1 CPU x 4 s: 16 (not 2 x 4: 20)
    assert not stopper.stop_all() and callback.reserved(now)[0] == pytest.approx(16.0)
    _start(callback, _fake_trial(specs["c"], "c"), now - 3.0)  # 2 CPUs x 3 s: 22; 0.5 GPU x 3 s: 1.5
    assert callback.reserved(now) == pytest.approx((22.0, 1.5))
    assert stopper.stop_all() and stopper.reason == "budget"
    earlier = RunStopper(Interrupt(), lambda line: None, ComputeBudget(20.0, None, spent_before=(15.0, 0.0)))
    callback = _callback_without_results(earlier)
    _start(callback, _fake_trial(specs["d"], "d"), time.time() - 3.0)  # 15 from earlier runs + 6 running
    assert earlier.stop_all()


def _callback_without_results(stopper):
    callback = ResultsCallback(None, RunSummary(), lambda line: None, None, stopper)
    stopper.callback = callback
    return callback


def _fake_trial(spec, trial_id="abc_00001"):
    return SimpleNamespace(
        trial_id=trial_id,
        config={"spec": pack(spec), "hp": {"lr": 0.1}},
        last_result={"status": "running", "n_samples": 1, "val_nll": 1.3, "cpu_s": 2.5, "train_s": 2.0},
        checkpoint=None,
        node_ip="10.0.0.1",
    )


def test_a_trial_cut_short_by_the_budget_is_recorded_with_its_compute(tmp_path):
    stopper = RunStopper(Interrupt(), lambda line: None, ComputeBudget(cpu_seconds=10.0, gpu_seconds=None))
    summary = RunSummary()
    callback = _callback(tmp_path, stopper, summary)
    trial = _fake_trial(_search_spec(gpu=0.25))
    _start(callback, trial, 1000.0)
    stopper.reason, stopper.stopped_at = "budget", 1004.0
    callback.on_experiment_end([trial, SimpleNamespace(trial_id="never_started")])
    assert not callback.running  # recorded: no longer counted as running
    rows = pd.read_parquet(tmp_path / "results" / "trials.parquet")
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["status"] == "early_stopped" and "cpu_seconds 10 budget" in row["error"]
    assert row["wall_s"] == 4.0 and row["reserved_cpu_s"] == 8.0 and row["cpu_s"] == 2.5
    assert row["n_cpus"] == 2.0 and row["n_gpus"] == 0.25 and row["reserved_gpu_s"] == 1.0  # the trial's own request
    assert row["gpu_ids"] == ""  # it never reported the GPUs Ray gave it
    assert row["phase"] == "search" and json.loads(row["config"])["lr"] == 0.1
    assert summary.early_stopped == [row["trial_id"]] and summary.incomplete == 0


def test_a_trial_stopped_by_ctrl_c_is_not_recorded(tmp_path):
    interrupt = Interrupt()
    interrupt.event.set()
    stopper = RunStopper(interrupt, lambda line: None)
    summary = RunSummary()
    callback = _callback(tmp_path, stopper, summary)
    stopper.callback = callback
    assert stopper.stop_all() and stopper.reason == "interrupt"
    trial = _fake_trial(_search_spec())
    _start(callback, trial, 1000.0)
    callback.on_experiment_end([trial])
    callback.on_trial_error(0, [trial], trial)  # a worker lost to Ctrl-C is not a failed trial
    assert not (tmp_path / "results" / "trials.parquet").exists()
    assert summary.unfinished_search == 1 and summary.incomplete == 1 and not summary.failed


def test_a_cell_whose_final_phase_started_keeps_its_configuration(tmp_path, monkeypatch):
    """Failed search trials are not done, but once the final phase ran a rerun must not reopen the search:
    a new best would give the cell a second set of final trials (their ids hash the configuration)."""
    import ursa_ray.tune.search as search_module
    from ursa_ray.tune.search import run_search_phase

    grid = parse_grid({**DIVERGING, "methods": DIVERGING["methods"][:1]}, "s.yaml")
    cell = grid.cells()[0]
    results = ResultsDirectory(tmp_path / "results")
    search = grid.spec_for(cell, 0, "search", {"lr": 2.0e4})
    final = grid.spec_for(cell, 0, "final", {"lr": 0.3})
    for spec, status in ((search, "failed"), (final, "ok")):
        results.add(
            {
                "trial_id": spec.trial_id,
                "phase": spec.phase,
                "cell": spec.cell,
                "status": status,
                "config": json.dumps(spec.config),
                "reserved_cpu_s": 1.0,
                "reserved_gpu_s": 0.0,
                "selection": "{}",
                "finished_at": 1.0,
            }
        )

    def no_search(*args, **kwargs):
        raise AssertionError("the search was reopened")

    monkeypatch.setattr(search_module, "run_trials", no_search)
    lines = []
    summary = RunSummary()
    assert run_search_phase(grid, results, summary, lines.append, "stamp") == {"sgd/mlp/digits": {"lr": 0.3}}
    assert lines == ["search phase: sgd/mlp/digits: closed (its final phase has started) with {'lr': 0.3}"]
    assert not summary.failed_cells
