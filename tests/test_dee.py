"""The deep-ensemble equivalent: the crossing rule on hand curves, the per-cell table from metric rows, and the
``members:M`` curve a deep-ensemble trial writes (its last point is the trial's own test metrics, and every
point is recomputed from the saved predictions)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.dee import dee_markdown, dee_table, deep_ensemble_equivalent
from ursa_ray.evaluation.predictions import metrics_from_predictions

CURVE = np.array([0.50, 0.40, 0.35, 0.33])  # calibrated NLL of 1, 2, 3, 4 members


@pytest.mark.parametrize(
    ("nll", "dee"),
    [
        (0.60, 1.0),  # worse than one member: the definition's floor
        (0.50, 1.0),  # equal to one member
        (0.45, 1.5),  # halfway from 1 to 2 members
        (0.40, 2.0),
        (0.34, 3.5),
        (0.33, 4.0),
        (0.30, math.nan),  # better than the whole ensemble: no value, never extrapolated
    ],
)
def test_dee_is_the_first_crossing_of_the_ensembles_curve(nll, dee):
    assert deep_ensemble_equivalent(CURVE, nll) == pytest.approx(dee, nan_ok=True)


def test_dee_takes_the_first_crossing_of_a_curve_that_is_not_monotone():
    # min{l >= 1: NLL_DE(l) <= nll}: the curve dips below 0.42 between 1 and 2 members, rises, dips again
    assert deep_ensemble_equivalent(np.array([0.5, 0.4, 0.45, 0.38]), 0.42) == pytest.approx(1.8)


def _tables(ensemble_curve: dict[str, list[float]], nll: dict[tuple[str, str], float]):
    trials, metrics = [], []

    def row(trial_id, method, dataset, eval_set, value):
        return {"trial_id": trial_id, "phase": "final", "method": method, "model": "mlp", "dataset": dataset,
                "seed": int(trial_id[-1]), "eval_set": eval_set, "metric": "nll_calibrated", "value": value}  # fmt: skip

    for (method, dataset), value in nll.items():
        for seed in (0, 1):
            trial_id = f"{method}-{dataset}-{seed}"
            trials.append({"trial_id": trial_id, "phase": "final", "status": "ok", "task": "classification",
                           "method": method, "model": "mlp", "dataset": dataset, "seed": seed})  # fmt: skip
            metrics.append(row(trial_id, method, dataset, "test", value + (0.01 if seed else -0.01)))
            if method == "deep_ensemble":
                for m, point in enumerate(ensemble_curve[dataset], start=1):
                    metrics.append(row(trial_id, method, dataset, f"members:{m}", point + (0.01 if seed else -0.01)))
    return pd.DataFrame(metrics), pd.DataFrame(trials)


def test_the_table_reads_each_cells_curve_seed_means_and_names_cells_without_one():
    metrics, trials = _tables(
        {"digits": [0.5, 0.4, 0.35]},
        {("deep_ensemble", "digits"): 0.35, ("sgd", "digits"): 0.5, ("swag", "digits"): 0.375,
         ("mfvi", "digits"): 0.3, ("sgd", "mnist"): 0.4},
    )  # fmt: skip
    table, missing = dee_table(metrics, trials)
    column = "mlp / digits [deep_ensemble, M = 3]"
    assert table[column].to_dict() == {"deep_ensemble": "3.00", "mfvi": "> 3", "sgd": "1.00", "swag": "2.50"}
    assert missing == ["mlp/mnist"]
    text = dee_markdown(metrics, trials)
    assert "No DEE for mlp/mnist: no `deep_ensemble` entry" in text and "| swag | 2.50" in text
    no_ensemble = metrics[metrics["method"] != "deep_ensemble"]
    assert dee_markdown(no_ensemble, trials).startswith("No DEE for mlp/digits, mlp/mnist")


GRID = {
    "name": "dee",
    "methods": [{"name": "deep_ensemble", "hyperparameters": {"n_samples": 3, "lr": 0.05}}, "sgd"],
    "models": [{"name": "mlp", "options": {"widths": [32]}}],
    "datasets": ["digits"],
    "seeds": [0],
    "budget": {"epochs": 3, "batch_size": 128},
    "save_predictions": True,
    "bit_depths": [],
    "corruptions": {"types": []},
    "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "attack_samples": 1, "transfer": False},
}


def test_a_deep_ensemble_trial_writes_its_curve_and_the_saved_tables_reproduce_it():
    from ursa_ray.grid import parse_grid
    from ursa_ray.trial import run_trial

    specs = {s.label: s for s in parse_grid(GRID, "dee.yaml").trial_specs() if s.phase == "final"}
    outcome = run_trial(specs["deep_ensemble"])
    values = {}
    for row in outcome.metrics:
        values.setdefault(row["eval_set"], {})[row["metric"]] = row["value"]
    assert [s for s in values if s.startswith("members:")] == ["members:1", "members:2", "members:3"]
    assert values["members:3"] == values["test"]  # all M members: the trial's own predictive
    assert values["members:1"]["nll"] > values["members:3"]["nll"]  # members help on digits
    from ursa_ray.data import get_dataset

    cost = get_dataset("digits").load({}, (), None, False, 0).cost_matrix.numpy()
    for name in ("members:1", "members:2", "members:3"):
        table = outcome.predictions[name]
        assert (table["n_samples"] == int(name[-1])).all()
        assert metrics_from_predictions(table, {}, cost)["test"] == values[name]
    sgd = run_trial(specs["sgd"])
    assert not any(row["eval_set"].startswith("members:") for row in sgd.metrics)  # only ensembles have a curve


def test_the_report_prints_the_dee_table_from_a_results_directory(tmp_path):
    from analysis.report import write_report
    from ursa_ray.results import ResultsDirectory

    metrics, trials = _tables(
        {"digits": [0.5, 0.4, 0.35]}, {("deep_ensemble", "digits"): 0.35, ("sgd", "digits"): 0.45}
    )
    results = ResultsDirectory(tmp_path)
    for trial in trials.to_dict("records"):
        record = {**trial, "cell": f"{trial['method']}/mlp/digits", "method_name": trial["method"],
                  "decision_task": False, "reserved_cpu_s": 1.0, "reserved_gpu_s": 0.0, "finished_at": 0.0,
                  "selection": ""}  # fmt: skip
        rows = metrics[metrics["trial_id"] == trial["trial_id"]].to_dict("records")
        results.add(record, rows + [{**rows[0], "metric": "accuracy", "value": 0.9}])
    write_report(tmp_path)
    section = (tmp_path / "report.md").read_text().split("### Deep-ensemble equivalent (DEE)")[1].split("\n#")[0]
    assert "| sgd | 1.50 |" in section and "| deep_ensemble | 3.00 |" in section
