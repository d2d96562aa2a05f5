"""A tiny grid on Ray Tune, end to end: Parquet contract, failure handling, report, resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from light_evaluation import LIGHT_EVALUATION  # quicker trials: no corruption sets or bit depths, one small attack

from ursa_ray.cli import main
from ursa_ray.grid import parse_grid
from ursa_ray.results import METRIC_COLUMNS
from ursa_ray.tune.runner import run_grid

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

TINY = {
    "name": "tiny",
    "methods": [
        {"name": "sgd", "hyperparameters": {"lr": 0.05}},
        {"name": "mc_dropout", "hyperparameters": {"p": 0.3}},
        {"name": "sgd", "label": "sgd_diverging", "hyperparameters": {"lr": 1.0e6, "momentum": 0.99}},
        {"name": "mc_dropout", "label": "mc_dropout_ts", "calibrate": "temperature", "hyperparameters": {"p": 0.3}},
    ],
    "models": [{"name": "mlp", "options": {"widths": [32]}}],
    "datasets": [{"name": "digits", "ood": ["noise", "digits_inverted"]}, "digits_imbalanced"],
    "seeds": [0, 1],
    "resources": {"cpu": 1},
    "budget": {"epochs": 3, "n_samples": 4, "batch_size": 128},
    "save_predictions": True,
    "corruptions": {"types": ["gaussian_noise", "rotate"], "severities": [1, 5], "n_examples": 200},
    "adversarial": {"n_examples": 100, "attack_samples": 4},
}
TINY_REFERENCE = {"chains": 2, "n_samples": 10, "burn_in": 5, "n_leapfrog": 3}
"""The module's tiny run has a (short, unconverged) reference per classification cell: its fidelity rows."""
TRIAL_REQUIRED = [
    "trial_id",
    "phase",
    "method",
    "model",
    "dataset",
    "seed",
    "status",
    "error",
    "config",
    "wall_s",
    "cpu_s",
    "gpu_s",
    "n_cpus",
    "n_gpus",
    "node",
    "n_samples",
    "train_s",
    "n_params",
]


@pytest.fixture(scope="module")
def tiny_run(ray_session, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    grid_file = out.parent / "tiny.yaml"
    grid_file.write_text(yaml.safe_dump({**TINY, "reference": TINY_REFERENCE}))
    code = main(["run", str(grid_file), "--out", str(out / "results")])
    return code, out / "results"


def test_failing_trials_are_recorded_and_the_rest_completes(tiny_run, capsys):
    code, results = tiny_run
    assert code == 1  # some trials failed
    trials = pd.read_parquet(results / "trials.parquet")
    assert len(trials) == 4 * 2 * 2 + 2  # and a reference trial per dataset
    failed = trials[trials["status"] == "failed"]
    assert set(failed["method"]) == {"sgd_diverging"}
    assert failed["error"].str.contains("FloatingPointError").all()
    ok = trials.loc[trials["status"] == "ok", "method"]
    assert ok.isin(["sgd", "mc_dropout", "mc_dropout_ts", "reference"]).all()
    assert (trials["status"] == "ok").sum() == 12 + 2


def test_trials_parquet_contract(tiny_run):
    _, results = tiny_run
    trials = pd.read_parquet(results / "trials.parquet")
    for column in TRIAL_REQUIRED:
        assert column in trials.columns, column
    ok = trials[trials["status"] == "ok"]
    assert set(ok.loc[ok["phase"] == "reference", "dataset"]) == {"digits", "digits_imbalanced"}
    ok = ok[ok["phase"] == "final"]
    assert (ok["n_cpus"] == 1).all() and (ok["n_gpus"] == 0).all() and (ok["gpu_s"] == 0).all()
    assert (ok["wall_s"] > 0).all() and (ok["cpu_s"] > 0).all() and (ok["train_s"] > 0).all()
    assert (ok["wall_s"] >= ok["train_s"]).all()
    assert (ok["reserved_cpu_s"] == ok["wall_s"]).all()
    assert set(ok.loc[ok["method"] == "mc_dropout", "n_samples"]) == {4}
    assert set(ok.loc[ok["method"] == "sgd", "n_samples"]) == {1}
    assert set(ok["n_params"]) == {64 * 32 + 32 + 32 * 10 + 10}
    configs = [json.loads(c) for c in ok["config"]]
    assert all(c["epochs"] == 3 for c in configs)
    assert trials["trial_id"].is_unique


def test_metrics_parquet_contract(tiny_run):
    _, results = tiny_run
    metrics = pd.read_parquet(results / "metrics.parquet")
    assert list(metrics.columns) == METRIC_COLUMNS
    ok_ids = set(pd.read_parquet(results / "trials.parquet").query("status == 'ok'")["trial_id"])
    assert set(metrics["trial_id"]) == ok_ids
    one = metrics[metrics["trial_id"] == sorted(i for i in ok_ids if "mc_dropout-mlp-digits-" in i)[0]]
    test = one[one["eval_set"] == "test"].set_index("metric")["value"]
    for metric in [
        "accuracy",
        "nll",
        "brier",
        "ece",
        "misclass_auroc_maxprob",
        "misclass_aupr_entropy",
        "misclass_auroc_mi",
        "decision_cost",
    ]:
        assert metric in test.index, metric
    assert 0.5 < test["accuracy"] <= 1.0
    full_precision = {"test", "noise", "digits_inverted"}
    stored = {f"{name}@{scheme}" for name in full_precision for scheme in ("float16", "bfloat16", "int8")}
    corrupted = {f"corrupt:{kind}:{severity}" for kind in ("gaussian_noise", "rotate") for severity in (1, 5)}
    attacked = {"adv:clean"} | {
        f"adv:{attack}_eps{eps:.6g}" for attack in ("fgsm", "pgd") for eps in (1 / 32, 1 / 16, 1 / 8, 1 / 4)
    }
    transferred = {name.replace("adv:", "transfer:") for name in attacked}  # crafted on the seed's sgd trial
    fidelity = {f"fidelity:{name}" for name in full_precision}  # against the cell's reference
    assert set(one["eval_set"]) == full_precision | stored | corrupted | attacked | transferred | fidelity | {"cost"}
    ood = one[one["eval_set"] == "noise"].set_index("metric")["value"]
    assert set(ood.index) == {
        f"ood_{m}_{s}" for m in ("auroc", "fpr95", "aupr_in", "aupr_out") for s in ("entropy", "mi")
    }
    cost = one[one["eval_set"] == "cost"].set_index("metric")["value"]
    assert {"train_s", "s_per_sample", "predict_s_per_example", "n_params"} <= set(cost.index)
    assert not metrics.duplicated(["trial_id", "eval_set", "metric"]).any()


def test_saved_predictions_reproduce_every_metric_of_every_trial(tiny_run):
    import math

    from ursa_ray.data import get_dataset
    from ursa_ray.evaluation.adversarial import metrics_from_adversarial_tables
    from ursa_ray.evaluation.predictions import metrics_from_predictions

    _, results = tiny_run
    metrics = pd.read_parquet(results / "metrics.parquet")
    reported = metrics[(metrics["eval_set"] != "cost") & (metrics["phase"] == "final")]
    assert set(reported["method"]) == {"sgd", "mc_dropout", "mc_dropout_ts"}
    assert {"test@calibrated", "noise@calibrated", "corrupt:rotate:5@calibrated", "adv:pgd_eps0.0625@calibrated",
            "transfer:clean@calibrated"} <= set(reported["eval_set"])  # fmt: skip
    assert {"fidelity:test", "fidelity:noise"} <= set(reported["eval_set"])
    trials = pd.read_parquet(results / "trials.parquet")
    references = trials.loc[trials["phase"] == "reference", "trial_id"]
    scored_by = trials.set_index("trial_id")["reference_from"]  # what scored each trial's fidelity rows

    def saved_tables(trial_id):
        return {
            p.name[len(trial_id) + 2 : -len(".parquet")]: pd.read_parquet(p)
            for p in (results / "predictions").glob(f"{trial_id}__*.parquet")
        }

    reference_tables = {trial_id: saved_tables(trial_id) for trial_id in references}
    digits_reference = trials.loc[(trials["phase"] == "reference") & (trials["dataset"] == "digits"), "trial_id"]
    assert set(reference_tables[digits_reference.item()]) == {"test", "noise", "digits_inverted"}  # its sets, saved
    assert {
        "test@float16",
        "test@bfloat16",
        "test@int8",
        "noise@int8",
        "corrupt:rotate:5",
        "adv:pgd_eps0.0625",
        "adv:clean",
    } <= set(reported["eval_set"])
    for (trial_id, dataset), rows in reported.groupby(["trial_id", "dataset"]):
        saved = saved_tables(trial_id)
        cost = get_dataset(dataset).load({}, (), None, False, 0).cost_matrix
        cost = None if cost is None else cost.numpy()
        validation = saved.get("validation")  # temperature scaling's split: calibrated trials only
        recomputed = {}
        for scheme in ("", "@float16", "@bfloat16", "@int8"):  # full precision, then each bit depth
            ood = {
                n: t
                for n, t in saved.items()
                if n not in ("test" + scheme, "validation")
                and n.endswith(scheme)
                and ("@" in n) == bool(scheme)
                and not n.startswith(("corrupt:", "adv:", "transfer:"))
            }
            reference = None if scheme else reference_tables[scored_by[trial_id]]  # fidelity:SET at full precision
            again = metrics_from_predictions(
                saved["test" + scheme], ood, cost, None if scheme else validation, reference
            )
            recomputed.update({name + (scheme if name == "test" else ""): v for name, v in again.items()})
        for name in (n for n in saved if n.startswith("corrupt:")):  # labelled copies of the test set
            again = metrics_from_predictions(saved[name], {}, cost, validation)
            recomputed[name] = again["test"]
            if validation is not None:
                recomputed[f"{name}@calibrated"] = again["test@calibrated"]
        temperature = recomputed.get("test@calibrated", {}).get("validation_temperature")
        for kind in ("adv:", "transfer:"):
            adversarial = {n[len(kind) :]: t for n, t in saved.items() if n.startswith(kind)}
            if adversarial:
                recomputed.update({f"{kind}{n}": v for n, v in metrics_from_adversarial_tables(adversarial).items()})
            if adversarial and temperature is not None:
                again = metrics_from_adversarial_tables(adversarial, temperature)
                recomputed.update({f"{kind}{n}@calibrated": v for n, v in again.items()})
        for row in rows[rows["metric"] != "reference"].itertuples():  # reference: a flag the trial sets
            again = recomputed[row.eval_set][row.metric]
            assert again == row.value or (math.isnan(again) and math.isnan(row.value)), (trial_id, row)
    # a single-sample method has no knowledge uncertainty: its mutual-information AUROCs are exactly 0.5
    sgd = reported[(reported["method"] == "sgd") & reported["metric"].isin(["ood_auroc_mi", "misclass_auroc_mi"])]
    assert len(sgd) > 0 and (sgd["value"] == 0.5).all()


def test_transfer_attack_scores_every_method_on_the_examples_of_its_seeds_sgd_trial(tiny_run):
    """The sgd trial of each seed ran first and saved its crafted examples; mc_dropout's trial of the same
    seed was scored on them (``transfer_from``).  They were crafted on a source network of the sgd trial's
    own (its own initialisation and data order), so for sgd too they differ from its white-box sets but for
    the clean images; for mc_dropout they differ from its own white-box ones (another network crafted them,
    and the clean images are scored by its whole stream rather than by the attacked average of kept
    samples)."""
    _, results = tiny_run
    trials = pd.read_parquet(results / "trials.parquet").set_index("trial_id")
    metrics = pd.read_parquet(results / "metrics.parquet")
    in_domain = trials[(trials["dataset"] == "digits") & (trials["status"] == "ok")]
    sources = in_domain[in_domain["method"] == "sgd"]
    assert len(sources) == 2 and (sources["transfer_from"] == sources.index).all()
    for trial_id in sources.index:
        assert (results / "transfer" / f"{trial_id}.pt").is_file()
    for _, row in in_domain[in_domain["method"] == "mc_dropout"].iterrows():
        source = sources[sources["seed"] == row["seed"]].index[0]
        assert row["transfer_from"] == source
    decision = trials[(trials["dataset"] == "digits_imbalanced") & (trials["status"] == "ok")]
    assert set(decision["transfer_from"]) == {""}  # the decision task has no adversarial evaluation

    def values(trial_id, kind):
        rows = metrics[(metrics["trial_id"] == trial_id) & metrics["eval_set"].str.startswith(kind)]
        rows = rows[rows["metric"] != "reference"]
        return rows.assign(eval_set=rows["eval_set"].str.slice(len(kind))).set_index(["eval_set", "metric"])["value"]

    for trial_id in sources.index:
        transfer, white_box = values(trial_id, "transfer:"), values(trial_id, "adv:")
        pd.testing.assert_index_equal(transfer.index, white_box.index)
        assert transfer["clean"].equals(white_box["clean"])
        attacked = [k for k in transfer.index if k[0] != "clean" and k[1] == "accuracy"]
        assert not transfer[attacked].equals(white_box[attacked])
    dropout = in_domain[in_domain["method"] == "mc_dropout"].index[0]
    transfer, white_box = values(dropout, "transfer:"), values(dropout, "adv:")
    assert not transfer.equals(white_box)


def test_mc_dropout_samples_differ(tiny_run):
    """A dropout that silently turned off would give identical samples: mutual information 0 everywhere."""
    _, results = tiny_run
    metrics = pd.read_parquet(results / "metrics.parquet")
    test = metrics[metrics["eval_set"] == "test"]
    mean_mi = test[(test["method"] == "mc_dropout") & (test["metric"] == "mean_mi")]
    assert len(mean_mi) == 4 and (mean_mi["value"] > 1e-4).all()


def test_prediction_seconds_are_per_evaluated_example(tiny_run):
    """predict_s_per_example = eval_s ÷ examples of every evaluation set (test, OOD and corruption sets): the
    cost of one prediction, all samples."""
    _, results = tiny_run
    trials = pd.read_parquet(results / "trials.parquet").set_index("trial_id")
    metrics = pd.read_parquet(results / "metrics.parquet")
    per_example = metrics[metrics["metric"] == "predict_s_per_example"].set_index("trial_id")["value"]
    # digits: test, noise, digits_inverted, and 2 corruptions × 2 severities of 200; the decision task: test;
    # a calibrated trial also its validation split, ⌈0.1 n⌉ of the training set
    n_examples = {"digits": 360 * 3 + 4 * 200, "digits_imbalanced": 360}
    n_validation = {"digits": 144, "digits_imbalanced": 118}
    for trial_id, value in per_example.items():
        dataset = trials.loc[trial_id, "dataset"]
        calibrated = trials.loc[trial_id, "method"] == "mc_dropout_ts"
        expected = trials.loc[trial_id, "eval_s"] / (n_examples[dataset] + calibrated * n_validation[dataset])
        assert value == pytest.approx(expected, rel=1e-9)


def test_first_trial_of_each_worker_records_its_warm_up(tiny_run):
    """Each worker process warms up once, before its first trial, and each method once more before its first
    trial in that process; only those trials record it: a warm-up per trial, none, or one charged to a later
    trial of the process or of the method all fail."""
    _, results = tiny_run
    trials = pd.read_parquet(results / "trials.parquet")
    # a Ray Tune trial is one worker process's run from one start: the two seeds of a cell share it
    tune_trials = trials.groupby(["worker_pid", "started_at"]).ngroups
    # 4 methods × 2 datasets, each cell's 2 seeds batched into one trial, and a reference per dataset
    assert tune_trials == 4 * 2 + 2
    processes = trials["worker_pid"].nunique()
    # one CPU per trial on a 2-CPU Ray: worker processes are reused across trials (without reuse every trial
    # would start a process of its own, and warm up again: 6 processes).  Not always two: while the trials
    # scored on the transfer source wait for it, no trial is pending and Tune evicts its idle cached actor,
    # so a later trial may start a third process (and warm it up, which the assertions below check)
    assert processes < tune_trials
    # the first row of a worker: its first Ray Tune trial (seeds of a batched trial share its start), and in
    # that trial the first seed, which carries the warm-up
    in_order = trials.sort_values(["started_at", "seed"], kind="stable")
    first = in_order.groupby("worker_pid").head(1)
    # a real warm-up: torch's first calls and the samplers' compiled kernels take well over 0.05 s
    assert (first["worker_setup_s"] > 0.05).all(), first[["worker_pid", "worker_setup_s"]]
    # a worker's first trial of a method (sgd_diverging is sgd's method) may warm that method up, and its first
    # trial that may corrupt images (a final digits trial: digits_imbalanced is the decision task's) the
    # corruptions' imports; no later one
    first_of_method = in_order.groupby(["worker_pid", "method_name"]).head(1)
    corrupting = in_order[(in_order["phase"] == "final") & (in_order["dataset"] == "digits")]
    first_corrupting = corrupting.groupby("worker_pid").head(1)
    warmed = first_of_method.index.union(first_corrupting.index)
    assert (trials.drop(warmed)["worker_setup_s"] == 0).all()


def test_temperature_scaling_reports_calibrated_sets_and_its_temperature(tiny_run):
    """The entry with ``calibrate: temperature`` reports every set twice, raw and ``@calibrated``, and records
    the temperature fitted on its validation split in method_stats (the same value as its
    ``test@calibrated`` row) and the fit's seconds; the entries without it report no calibrated set."""
    _, results = tiny_run
    trials = pd.read_parquet(results / "trials.parquet")
    metrics = pd.read_parquet(results / "metrics.parquet")
    calibrated = metrics["eval_kind"] == "calibrated"
    assert set(metrics.loc[calibrated, "method"]) == {"mc_dropout_ts"}
    ok = trials[(trials["status"] == "ok") & (trials["method"] == "mc_dropout_ts")]
    assert len(ok) == 4
    for row in ok.itertuples():
        stats = json.loads(row.method_stats)
        assert stats["temperature_fit_s"] > 0
        mine = metrics[metrics["trial_id"] == row.trial_id]
        raw = set(
            mine.loc[mine["eval_kind"].isin(("in_domain", "ood", "corruption", "adversarial", "transfer")), "eval_set"]
        )
        assert set(mine.loc[mine["eval_kind"] == "calibrated", "eval_set"]) == {f"{s}@calibrated" for s in raw}
        fitted = mine[(mine["eval_set"] == "test@calibrated") & (mine["metric"] == "validation_temperature")]
        assert fitted["value"].tolist() == [stats["validation_temperature"]]
        test = mine[mine["eval_set"].isin(("test", "test@calibrated"))].pivot(
            index="metric", columns="eval_set", values="value"
        )
        assert test.loc["accuracy", "test"] == test.loc["accuracy", "test@calibrated"]  # tempering keeps the argmax
    for row in trials[(trials["status"] == "ok") & (trials["method"] != "mc_dropout_ts")].itertuples():
        assert "validation_temperature" not in json.loads(row.method_stats)


def test_report_writes_markdown(tiny_run, capsys):
    _, results = tiny_run
    assert main(["report", str(results)]) == 0
    printed = capsys.readouterr().out
    assert "| method | accuracy | nll |" in printed
    report = (results / "report.md").read_text()
    assert "## Composite scores" in report and "mean ± std over seeds" in report
    assert "sgd_diverging" in report  # failed trials are listed
    assert re.search(r"\d ± \d", report)  # a per-cell table cell
    # the reviewer's metrics have per-cell tables too (issue 31): calibrated NLL, adaptive ECE, E-AURC, FPR@95
    for title in ("### calibrated NLL", "### adaptive expected calibration error", "### excess area under the risk"):
        assert title in report, title
    assert re.search(r"### OOD detection vs \S+: ood_fpr95_mi", report)
    # temperature scaling's variant is a method of its own, ranked beside the raw one
    composite = report.split("## Composite scores")[1].split("\n## ")[0]
    assert "| mc_dropout_ts@calibrated |" in composite and "| mc_dropout_ts |" in composite
    fitted = report.split("### temperature scaling: T fitted")[1].split("\n### ")[0]
    assert "| mc_dropout_ts@calibrated |" in fitted and "| mc_dropout |" not in fitted


def test_resume_reruns_only_missing_trials(ray_session, tmp_path):
    # which trials rerun is the claim, not what they score: the light evaluation
    grid = dict(TINY, methods=TINY["methods"][:1], datasets=["digits"], seeds=[0, 1, 2], **LIGHT_EVALUATION)
    grid_file = tmp_path / "resume.yaml"
    grid_file.write_text(yaml.safe_dump(grid))
    out = tmp_path / "results"
    spec = parse_grid(grid, str(grid_file))
    first = run_grid(spec, out, echo=lambda line: None)
    assert len(first.finished) == 3
    # as if the run had been interrupted after its first trial: drop two trials' rows (their parts)
    trials = pd.read_parquet(out / "trials.parquet")
    for dropped in trials["trial_id"].iloc[1:]:
        (out / "trials.parquet" / f"{dropped}.parquet").unlink()
    again = run_grid(spec, out, echo=lambda line: None)
    assert again.skipped == 1 and len(again.finished) == 2
    final = pd.read_parquet(out / "trials.parquet")
    assert sorted(final["trial_id"]) == sorted(trials["trial_id"])
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert not metrics.duplicated(["trial_id", "eval_set", "metric"]).any()
    third = run_grid(spec, out, echo=lambda line: None)
    assert third.skipped == 3 and not third.finished


def test_ctrl_c_then_rerun_completes_every_trial_exactly_once(ray_session, tmp_path, capsys):
    # what trials score is the other tests' claim: light evaluation keeps this one about the interrupt
    grid = dict(TINY, methods=TINY["methods"][:2], datasets=["digits"], seeds=[0, 1, 2], save_predictions=False)
    grid |= LIGHT_EVALUATION
    grid["budget"] = {"epochs": 40, "n_samples": 4, "batch_size": 64}
    grid_file = tmp_path / "interrupt.yaml"
    grid_file.write_text(yaml.safe_dump(grid))
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    run = ["run", str(grid_file), "--out", str(out)]
    # Ctrl-C goes to a subprocess on the session's Ray (no Ray start-up of its own); the rerun, in-process
    address = ray_session.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "ursa_ray.cli", *run, "--address", address]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    deadline = time.time() + 240
    for line in process.stdout:
        lines.append(line)
        if line.startswith("[1/6]"):
            process.send_signal(signal.SIGINT)
            break
        assert time.time() < deadline, "".join(lines)
    rest, _ = process.communicate(timeout=180)
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "interrupted" in output
    partial = pd.read_parquet(out / "trials.parquet")
    assert 0 < len(partial) < 6  # some, not all, trials finished before Ctrl-C
    code = main(run)
    rerun = capsys.readouterr()
    assert code == 0, rerun.out + rerun.err
    assert f"({len(partial)} already finished)" in rerun.out
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 6 and trials["trial_id"].is_unique and (trials["status"] == "ok").all()
    # each method's three seeds were one batched trial: the one Ctrl-C cut short is rerun whole, once
    assert set(trials["seeds_in_trial"]) == {3}
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert metrics.groupby("trial_id").size().nunique() == 1  # every trial's rows exactly once
