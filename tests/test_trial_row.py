"""The trials.parquet row and the metric rows' trial columns, each built in one place (ursa_ray.results): a hand
case for every column the driver computes.  No Ray."""

from __future__ import annotations

import json
import math

import pyarrow as pa
from spec_fixtures import hand_spec

from ursa_ray.results import METRIC_COLUMNS, TRIAL_COLUMNS, TRIAL_SCHEMA, metric_key, trial_row

SPEC = hand_spec(
    trial_id="final-sgd-mlp-digits-s3",
    phase="final",
    cell="sgd/mlp/digits",
    label="sgd_wide",
    method="sgd",
    model="mlp",
    dataset="digits",
    task="classification",
    decision_task=False,
    complexity=None,
    seed=3,
    config={"lr": 0.1, "epochs": 2},
)
WORKER = {  # what a worker records, including fields the driver must override
    "cpu_s": 4.5,
    "train_s": 2.0,
    "node": "",
    "seeds_in_trial": 1,
    "status": "ok",
    "trial_id": "stale",
    "wall_s": 99.0,
}


def _row(**changes):
    arguments = dict(
        seeds_in_trial=2,
        started_at=10.0,
        finished_at=16.0,
        request={"CPU": 2.0, "GPU": 0.5},
        node_ip="10.0.0.7",
        selection={"val_nll": 0.25},
    )
    return trial_row(SPEC, "failed", {**WORKER, "error": "ValueError: x"}, **(arguments | changes))


def test_a_seed_gets_its_share_of_the_tune_trial_and_the_driver_fields_win_over_the_record():
    row = _row()
    assert row["wall_s"] == 3.0  # 6 s shared by 2 seeds (fails if wall is not split by seeds_in_trial)
    assert row["reserved_cpu_s"] == 6.0 and row["reserved_gpu_s"] == 1.5 and row["gpu_s"] == 1.5
    assert (row["n_cpus"], row["n_gpus"]) == (2.0, 0.5)
    assert row["seeds_in_trial"] == 2  # the Tune trial's count, not the worker's 1
    assert row["status"] == "failed" and row["error"] == "ValueError: x" and row["trial_id"] == SPEC.trial_id
    assert row["cpu_s"] == 4.5 and row["train_s"] == 2.0  # the worker's measures pass through
    assert row["node"] == "10.0.0.7"  # the record names no node: the Tune trial's
    assert math.isnan(row["complexity"]) and row["method"] == "sgd_wide" and row["method_name"] == "sgd"
    assert json.loads(row["config"]) == SPEC.config and json.loads(row["selection"]) == {"val_nll": 0.25}
    assert (row["started_at"], row["finished_at"]) == (10.0, 16.0)
    assert _row(request={"CPU": 1.0})["reserved_gpu_s"] == 0.0  # a request without GPUs reserves none
    assert trial_row(SPEC, "ok", {"node": "worker-3"}, **{**_arguments(), "node_ip": None})["node"] == "worker-3"


def _arguments():
    return dict(seeds_in_trial=1, started_at=0.0, finished_at=1.0, request={}, node_ip=None, selection={})


def test_the_row_fits_the_trials_table_schema():
    row = _row()
    assert set(row) <= set(TRIAL_COLUMNS), set(row) - set(TRIAL_COLUMNS)
    pa.Table.from_pylist([row], schema=TRIAL_SCHEMA)  # every value has its column's type


def test_metric_rows_name_their_trial_with_the_metric_table_columns():
    key = metric_key(SPEC)
    assert key == {
        "trial_id": SPEC.trial_id,
        "method": "sgd_wide",  # the label, as in trials.parquet's method column
        "model": "mlp",
        "dataset": "digits",
        "seed": 3,
        "phase": "final",
    }
    assert set(key) <= set(METRIC_COLUMNS)
