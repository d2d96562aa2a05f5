"""The function trainable: one ursa-ray trial inside a Ray Tune trial.

It runs :func:`ursa_ray.trial.run_trial` on the resources Tune reserved, catches any exception so that the
trial is recorded as failed with its error (the rest of the grid goes on), and hands its rows to the
driver as a Tune checkpoint directory (which Tune moves to the storage path, local or remote).  In the
search phase it also reports the running validation metrics after each posterior sample, so that an
ASHA scheduler can stop poor configurations early.

The first trial a worker process runs warms the process up first (:func:`ursa_ray.trial.warm_up_worker`)
and records that time as ``worker_setup_s`` (0 on later trials of the same worker); the trial's own
timings (``cpu_s``, ``train_s``, ``s_per_sample``) start after it.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

_worker_warm = False
"""Whether this worker process has paid its one-off costs (:func:`ursa_ray.trial.warm_up_worker`)."""


def search_trial_spec(spec: dict[str, Any], hp: dict[str, Any], tune_trial_id: str) -> dict[str, Any]:
    """A search-phase spec: the cell's base spec with the sampled hyperparameters and its own trial id."""
    return {
        **spec,
        "config": {**spec["config"], **hp},
        "trial_id": f"search-{spec['cell'].replace('/', '-')}-{tune_trial_id}",
    }


def run_ursa_trial(param: dict[str, Any]) -> None:
    """Tune entry point; ``param["spec"]`` is a trial spec from the grid (``param["hp"]`` in the search phase)."""
    import torch

    from ursa_ray.trial import pick_device, run_trial, warm_up_worker

    global _worker_warm
    spec = param["spec"]
    if param.get("hp"):
        spec = search_trial_spec(spec, param["hp"], tune.get_context().get_trial_id())
    torch.set_num_threads(max(1, int(spec["resources"]["cpu"])))
    worker_setup_s = 0.0
    if not _worker_warm:  # the first trial in this process: warm up before anything is timed
        worker_setup_s = warm_up_worker(pick_device(spec["resources"]["gpu"]))
        _worker_warm = True
    started_cpu = time.process_time()

    def progress(n_samples: int, values: dict[str, float], cost: dict[str, float]) -> None:
        tune.report({"status": "running", "n_samples": n_samples, **values, **cost})

    outcome_files: dict[str, Any] = {}
    try:
        outcome = run_trial(spec, progress=progress if spec["phase"] == "search" else None)
        record = {**outcome.record, "status": "ok", "error": ""}
        selection = outcome.selection
        outcome_files = {
            "metrics": outcome.metrics,
            "points": outcome.points,
            "predictions": outcome.predictions,
            "transfer": outcome.transfer_examples,
        }
    except Exception as exc:  # noqa: BLE001 - every failure becomes a failed row, never a lost grid
        record = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        selection = {}
    record.update(
        {
            "cpu_s": time.process_time() - started_cpu,
            "worker_setup_s": worker_setup_s,
            "node": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "worker_pid": os.getpid(),  # the worker process: its first trial alone carries worker_setup_s
        }
    )
    with tempfile.TemporaryDirectory(prefix="ursa-") as folder:
        out = Path(folder)
        (out / "record.json").write_text(json.dumps(record, default=float))
        import pandas as pd

        for name in ("metrics", "points"):
            rows = outcome_files.get(name)
            if rows:
                pd.DataFrame(rows).to_parquet(out / f"{name}.parquet", index=False)
        if outcome_files.get("transfer"):
            (out / "transfer.pt").write_bytes(outcome_files["transfer"])
        for eval_set, frame in (outcome_files.get("predictions") or {}).items():
            (out / "predictions").mkdir(exist_ok=True)
            frame.to_parquet(out / "predictions" / f"{eval_set}.parquet", index=False)
        tune.report(
            {"status": record["status"], **selection, "cpu_s": record["cpu_s"]},
            checkpoint=tune.Checkpoint.from_directory(folder),
        )
