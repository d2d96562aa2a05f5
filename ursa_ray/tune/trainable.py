"""The function trainable: one ursa-ray trial inside a Ray Tune trial.

It runs :func:`ursa_ray.trial.run_trial` on the resources Tune reserved, catches any exception so that the
trial is recorded as failed with its error (the rest of the grid goes on), and hands its rows to the
driver as a Tune checkpoint directory (which Tune moves to the storage path, local or remote).  In the
search phase it also reports the running validation metrics after each posterior sample, so that an
ASHA scheduler can stop poor configurations early.

A Tune trial of the final phase runs one or several seeds of one cell (several: one batched computation,
with its CPU seconds split evenly over them: this process measures ``cpu_s``, the driver's row,
:func:`ursa_ray.results.trial_row`, says how many shared it in ``seeds_in_trial``); its checkpoint holds one
folder per seed, ``0/``, ``1/``, ...

The first trial a worker process runs warms the process up first, and the first of each method that
method's own one-off costs (:func:`ursa_ray.trial.warm_up_worker`); the trial records that time as
``worker_setup_s`` (0 when the worker had paid it all before); the trial's own timings (``cpu_s``,
``train_s``, ``s_per_sample``) start after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune

from ursa_ray.spec import TrialSpec


def request(resources: Mapping[str, Any]) -> dict[str, float]:
    """What Ray is asked for by a trial whose spec has ``resources`` ({cpu, gpu, custom}, as in
    ``spec.resources``): {"CPU": ..., "GPU": ..., custom...}, amounts of zero left out."""
    need = {"CPU": float(resources["cpu"]), "GPU": float(resources["gpu"])}
    need.update({k: float(v) for k, v in resources["custom"].items()})
    return {k: v for k, v in need.items() if v > 0}


def pack(specs: Any) -> bytes:
    """ursa-ray specs as one pickled ``bytes`` (a final trial's seed group in the run's spec table, a search
    cell's base spec in its Tune config): immutable, so Tune's copies of a config are the same object."""
    return pickle.dumps(specs, protocol=pickle.HIGHEST_PROTOCOL)


class SpecTable:
    """The final phase's packed seed groups (:func:`pack`), entry ``i`` ``table[i]``, held as one byte array and
    its offsets: Ray passes numpy arrays out of band, so a worker's ``ray.get`` of the table maps it from the
    object store without copying, where a list of ``bytes`` was unpickled whole for every trial (12 ms at
    20,000 groups, 62 ms at 100,000)."""

    def __init__(self, packed: Sequence[bytes]) -> None:
        self.offsets = np.cumsum([0, *map(len, packed)], dtype=np.int64)
        self.data = np.frombuffer(b"".join(packed), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> bytes:
        return self.data[self.offsets[index] : self.offsets[index + 1]].tobytes()


def config_specs(config: Mapping[str, Any], tune_trial_id: str, spec_table: Sequence[bytes] = ()) -> list[TrialSpec]:
    """The ursa-ray specs of a Tune trial with ``config``: a final trial's seeds, entry ``config["group"]`` of
    the run's spec table (:class:`~ursa_ray.tune.queue.SpecQueue`'s packed seed groups), each with what the
    queue added when it handed the trial out (``config["additions"]``, by position, where any); or a search
    trial's one (the cell's ``config["spec"]`` with the sampled ``config["hp"]`` and an id of its own).

    A final trial's config holds its index, not its specs: Tune keeps every trial's config several times over
    (the trial, its flattened parameters, its tag, every result) and, once it has snapshotted the experiment,
    their JSON, ~24 KB a trial with the specs in it (docs/performance.md, "Driver memory per trial")."""
    if config.get("hp"):
        return [search_trial_spec(pickle.loads(config["spec"]), config["hp"], tune_trial_id)]
    specs = pickle.loads(spec_table[config["group"]])
    additions = config.get("additions")
    if not additions:
        return specs
    return [dataclasses.replace(spec, **added) for spec, added in zip(specs, additions, strict=True)]


def placement(config: dict[str, Any]) -> tune.PlacementGroupFactory:
    """A Tune trial's own request, from its config (``tune.with_resources`` calls it for each trial): a final
    trial's ``config["request"]`` (its seeds are one cell's: one request) or a search trial's spec's.

    It lives here, beside the trainable, because Tune pickles it with the trainable: a worker unpickling it
    imports this light module only (not the grid's, which imports torch before the trial's timed warm-up)."""
    if "request" in config:
        return tune.PlacementGroupFactory([dict(config["request"])])
    return tune.PlacementGroupFactory([request(pickle.loads(config["spec"]).resources)])


def trial_folder_name(trial: Any) -> str:
    """A final Tune trial's folder: its first seed's trial id (``config["trial_id"]``).  A function of this
    module, so Tune's per-trial snapshot pickles a reference to it, not a closure (1.3 KB a trial)."""
    return trial.config["trial_id"][:80]


def search_trial_spec(spec: TrialSpec, hp: dict[str, Any], tune_trial_id: str) -> TrialSpec:
    """A search-phase spec: the cell's base spec with the sampled hyperparameters and its own trial id."""
    return dataclasses.replace(spec, config={**spec.config, **hp}, trial_id=f"search-{spec.cell_slug}-{tune_trial_id}")


def run_ursa_trial(param: dict[str, Any], spec_table: Sequence[bytes] = ()) -> None:
    """Tune entry point.  ``param``: a Tune config (:func:`config_specs`): which of the final phase's seed groups
    this Tune trial runs (several seeds of one cell are one batched computation,
    :func:`ursa_ray.trial.run_trials_batched`), or in the search phase the cell's spec with the sampled
    ``param["hp"]``.  ``spec_table``: the final phase's packed seed groups, which ``tune.with_parameters`` puts
    in Ray's object store once for the whole run."""
    import torch

    from ursa_ray.prepare import needs_torchvision
    from ursa_ray.trial import pick_device, warm_up_worker

    specs = config_specs(param, tune.get_context().get_trial_id(), spec_table)
    torch.set_num_threads(max(1, int(specs[0].resources["cpu"])))
    # subnormal floats (Adam's second moments of weights whose gradients vanish, for one) are up to 100×
    # slower on x86 CPUs: flushing them to zero made variational dropout's 1,000-epoch regression trials
    # ~1.5× faster and changes no metric beyond float noise (docs/performance.md)
    torch.set_flush_denormal(True)
    # the process's first trial, and its first of this method, warm up before anything is timed
    worker_setup_s = warm_up_worker(
        pick_device(specs[0].resources["gpu"]), [specs[0].method], torchvision=any(map(needs_torchvision, specs))
    )
    started_cpu = time.process_time()

    def progress(n_samples: int, values: dict[str, float], cost: dict[str, float]) -> None:
        tune.report({"status": "running", "n_samples": n_samples, **values, **cost})

    outcomes = _run(specs, progress if specs[0].phase == "search" else None)
    gpu_ids = assigned_gpu_ids()
    cpu_s = (time.process_time() - started_cpu) / len(specs)  # a batched trial's CPU time, split evenly
    with tempfile.TemporaryDirectory(prefix="ursa-") as folder:
        for i, (record, files) in enumerate(outcomes):
            record.update(
                {
                    "cpu_s": cpu_s,
                    "worker_setup_s": worker_setup_s if i == 0 else 0.0,
                    "node": socket.gethostname(),
                    "node_id": ray.get_runtime_context().get_node_id(),
                    "worker_pid": os.getpid(),  # the worker process: its first trial alone carries worker_setup_s
                    "gpu_ids": gpu_ids,
                }
            )
            _write_outcome(Path(folder) / str(i), record, files)
        selection = outcomes[0][1].get("selection", {}) if len(specs) == 1 else {}  # what a search selects on
        tune.report(
            {"status": outcomes[0][0]["status"], **selection, "cpu_s": cpu_s},
            checkpoint=tune.Checkpoint.from_directory(folder),
        )


def assigned_gpu_ids() -> str:
    """The GPUs Ray assigned this trial's worker, as a JSON list (``"[0]"``), or "" when it has none.  A trial
    asking for a share of a GPU (``gpu: 0.25``) gets that GPU's id too; the trial uses it only when torch can
    see a GPU (:func:`ursa_ray.trial.pick_device`)."""
    ids = ray.get_gpu_ids()
    return json.dumps([int(i) if str(i).isdigit() else str(i) for i in ids]) if ids else ""


def _run(specs: list[TrialSpec], progress: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(record, files) of each spec.  Every failure becomes a failed record, never a lost grid; a batched
    run that fails is rerun one seed at a time, so that only the seeds that fail alone are recorded failed."""
    from ursa_ray.trial import run_reference_trial, run_trial, run_trials_batched

    if len(specs) > 1:
        try:
            return [_succeeded(outcome) for outcome in run_trials_batched(specs)]
        except Exception:  # noqa: BLE001 - rerun alone below, where each seed's own error is recorded
            pass
    results = []
    for spec in specs:
        try:
            if spec.phase == "reference":  # a cell's reference posterior (ursa_ray.reference)
                results.append(_succeeded(run_reference_trial(spec)))
                continue
            results.append(_succeeded(run_trial(spec, progress=progress)))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a failed row, never a lost grid
            results.append(({"status": "failed", "error": f"{type(exc).__name__}: {exc}"}, {}))
    return results


def _succeeded(outcome: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    files = {
        "metrics": outcome.metrics,
        "points": outcome.points,
        "predictions": outcome.predictions,
        "transfer": outcome.transfer_examples,
        "selection": outcome.selection,
    }
    return {**outcome.record, "status": "ok", "error": ""}, files


def _write_outcome(out: Path, record: dict[str, Any], files: dict[str, Any]) -> None:
    """One trial's outcome as files in ``out``: record.json, metrics/points Parquet, predictions/, transfer.pt."""
    import pandas as pd

    out.mkdir(parents=True)
    (out / "record.json").write_text(json.dumps(record, default=float))
    for name in ("metrics", "points"):
        rows = files.get(name)
        if rows:
            pd.DataFrame(rows).to_parquet(out / f"{name}.parquet", index=False)
    if files.get("transfer"):
        (out / "transfer.pt").write_bytes(files["transfer"])
    for eval_set, frame in (files.get("predictions") or {}).items():
        (out / "predictions").mkdir(exist_ok=True)
        frame.to_parquet(out / "predictions" / f"{eval_set}.parquet", index=False)
