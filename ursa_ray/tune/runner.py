"""The driver: runs a validated grid on Ray Tune and writes each finished trial into the results directory.

A :class:`ResultsCallback` on the driver writes every trial's rows as soon as Tune reports it complete (or
errored), so an interrupted run keeps everything that finished; a rerun skips finished trial ids.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")  # a retried or failed trial is one line of ours

import ray  # noqa: E402
from ray import cloudpickle, tune  # noqa: E402
from ray.tune.search import Searcher  # noqa: E402

from ursa_ray.grid import Grid, GridError  # noqa: E402
from ursa_ray.results import Location, ResultsDirectory  # noqa: E402
from ursa_ray.tune.trainable import run_ursa_trial, search_trial_spec  # noqa: E402

Echo = Callable[[str], None]


def connect(address: str | None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start a small local Ray."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    common = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address:
        ray.init(address=address, **common)
    else:  # "local": a new local Ray even when `ray start` left a cluster on this machine
        ray.init(address="local", object_store_memory=256 * 1024**2, **common)


def trial_resources(grid: Grid) -> dict[str, float]:
    need = {"CPU": float(grid.resources["cpu"]), "GPU": float(grid.resources["gpu"])}
    need.update({k: float(v) for k, v in grid.resources["custom"].items()})
    return {k: v for k, v in need.items() if v > 0}


# Written by the cluster launcher (`ray up`) on the head node: the node types its autoscaler may add.
LAUNCHER_CONFIG = Path("~/ray_bootstrap_config.yaml")


def launchable_node_resources() -> list[dict[str, float]]:
    """Resources of the node types an autoscaler may still add: the autoscaler v2 / KubeRay config in the GCS,
    else the launcher's config on a `ray up` head (worker types with max_workers 0 excluded)."""
    offers: list[dict[str, float]] = []
    try:
        config = ray._private.state.state.get_cluster_config()
    except Exception:  # noqa: BLE001 - no autoscaler config in this cluster's GCS
        config = None
    for group in getattr(config, "node_group_configs", None) or []:
        if group.max_count != 0:
            offers.append({k: float(v) for k, v in group.resources.items()})
    path = LAUNCHER_CONFIG.expanduser()
    if not offers and path.is_file():
        import yaml

        try:
            launcher = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            launcher = {}
        for name, node_type in (launcher.get("available_node_types") or {}).items():
            if node_type.get("max_workers", 1) != 0 or name == launcher.get("head_node_type"):
                offers.append({k: float(v) for k, v in (node_type.get("resources") or {}).items()})
    return offers


def check_cluster_fits(grid: Grid) -> None:
    """GridError when no alive node (nor any node type the autoscaler may add) has the resources one trial asks
    for (Ray would wait forever)."""
    need = trial_resources(grid)
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")] + launchable_node_resources()
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
        return
    offered = "; ".join(
        ", ".join(f"{k}={v:g}" for k, v in sorted(node.items()) if k in ("CPU", "GPU") or k in need) for node in nodes
    )
    short = {k: v for k, v in need.items() if not any(node.get(k, 0.0) >= v for node in nodes)}
    which = ", ".join(f"{k}={v:g}" for k, v in short.items()) or ", ".join(f"{k}={v:g}" for k, v in need.items())
    raise GridError(
        f"{grid.path}: resources: each trial asks for {which}, which no node of the Ray cluster has "
        f"(nodes offer: {offered or 'nothing'})"
    )


@dataclass
class RunSummary:
    planned: int = 0
    skipped: int = 0
    finished: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    early_stopped: list[str] = field(default_factory=list)

    @property
    def incomplete(self) -> int:
        return self.planned - self.skipped - len(self.finished) - len(self.failed) - len(self.early_stopped)


class ResultsCallback(tune.Callback):
    """Writes each trial's rows when Tune reports it finished or errored, and prints one line per trial."""

    def __init__(self, results: ResultsDirectory, resources: dict[str, float], summary: RunSummary, echo: Echo, total: int):
        self.results = results
        self.resources = resources
        self.summary = summary
        self.echo = echo
        self.total = total
        self.started: dict[str, float] = {}
        self.done = 0

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.started.setdefault(trial.trial_id, time.time())

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, error=None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        error = trial.get_error()
        self._record(trial, error=f"{type(error).__name__}: {error}" if error else "the trial's worker failed")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """The trial's worker (or its node) died and Tune retries it (``max_failures`` in the grid)."""
        reason = "the trial's worker failed"
        try:  # Tune has just pickled the error into the trial's local folder
            with open(trial.pickled_error_file, "rb") as f:
                error = cloudpickle.load(f)
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
        except Exception:  # noqa: BLE001 - the message is informative only
            pass
        spec = trial_spec(trial)
        failures = f"{trial.run_metadata.num_failures}/{trial.max_failures}"
        self.echo(f"retry {failures} {spec['phase']:6s} {_where(spec)}: {reason}")

    def _record(self, trial: Any, error: str | None) -> None:
        spec = trial_spec(trial)
        finished = time.time()
        started = self.started.get(trial.trial_id, finished)
        wall = finished - started
        record: dict[str, Any] = {}
        metrics = points = []
        predictions: dict[str, pd.DataFrame] = {}
        last = trial.last_result or {}
        checkpoint = trial.checkpoint if error is None else None
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                folder = Path(folder)
                record = json.loads((folder / "record.json").read_text())
                metrics = _rows(folder / "metrics.parquet")
                points = _rows(folder / "points.parquet")
                if (folder / "predictions").is_dir():
                    predictions = {p.stem: pd.read_parquet(p) for p in (folder / "predictions").glob("*.parquet")}
            status = record.get("status", "failed")
        elif error is not None:
            status = "failed"
            record = {"error": error, "cpu_s": last.get("cpu_s", math.nan)}
        else:
            status = "early_stopped"
            record = {"cpu_s": last.get("cpu_s", math.nan), "train_s": last.get("train_s", math.nan)}
            metrics = [
                {**_metric_base(spec), "eval_set": "validation", "metric": k[4:], "value": float(v)}
                for k, v in last.items()
                if k.startswith("val_") and isinstance(v, (int, float))
            ]
        selection = {k: float(v) for k, v in last.items() if k.startswith("val_") and isinstance(v, (int, float))}
        n_cpus, n_gpus = self.resources.get("CPU", 0.0), self.resources.get("GPU", 0.0)
        row = {
            **record,
            "trial_id": spec["trial_id"],
            "phase": spec["phase"],
            "cell": spec["cell"],
            "method": spec["label"],
            "method_name": spec["method"],
            "model": spec["model"],
            "dataset": spec["dataset"],
            "task": spec["task"],
            "decision_task": spec["decision_task"],
            "complexity": math.nan if spec["complexity"] is None else float(spec["complexity"]),
            "seed": spec["seed"],
            "status": status,
            "error": record.get("error", "") or "",
            "config": json.dumps(spec["config"], sort_keys=True),
            "wall_s": wall,
            "gpu_s": n_gpus * wall,
            "reserved_cpu_s": n_cpus * wall,
            "reserved_gpu_s": n_gpus * wall,
            "n_cpus": n_cpus,
            "n_gpus": n_gpus,
            "node": record.get("node") or (trial.node_ip or ""),
            "selection": json.dumps(selection, sort_keys=True),
            "started_at": started,
            "finished_at": finished,
        }
        self.results.add(row, metrics, points, predictions)
        self.done += 1
        if status == "ok":
            self.summary.finished.append(spec["trial_id"])
        elif status == "early_stopped":
            self.summary.early_stopped.append(spec["trial_id"])
        else:
            self.summary.failed.append((spec["trial_id"], row["error"]))
        self.echo(_progress_line(self.done, self.total, spec, status, row, metrics))


def trial_spec(trial: Any) -> dict[str, Any]:
    """The ursa-ray spec of a Tune trial; search trials get their sampled hyperparameters and an id."""
    if trial.config.get("hp"):
        return search_trial_spec(trial.config["spec"], trial.config["hp"], trial.trial_id)
    return dict(trial.config["spec"])


def _metric_base(spec: dict[str, Any]) -> dict[str, Any]:
    keys = ("trial_id", "model", "dataset", "seed", "phase")
    return {**{k: spec[k] for k in keys}, "method": spec["label"]}


def _rows(path: Path) -> list[dict[str, Any]]:
    return pd.read_parquet(path).to_dict("records") if path.exists() else []


def _where(spec: dict[str, Any]) -> str:
    where = f"{spec['label']} {spec['model']} {spec['dataset']}"
    if spec["complexity"] is not None:
        where += f" c={spec['complexity']:g}"
    return where + f" seed={spec['seed']}"


def _progress_line(done: int, total: int, spec: dict[str, Any], status: str, row: dict[str, Any], metrics: list) -> str:
    where = _where(spec)
    if status == "failed":
        return f"[{done}/{total}] FAILED {spec['phase']:6s} {where}: {row['error']}"
    wanted = {("test", "accuracy"), ("test", "nll"), ("test", "rmse_truth"), ("test", "coverage_95_epistemic"), ("validation", "nll")}
    shown = " ".join(
        f"{'val_' if m['eval_set'] == 'validation' else ''}{m['metric']}={m['value']:.3f}"
        for m in metrics
        if (m["eval_set"], m["metric"]) in wanted
    )
    return f"[{done}/{total}] {status:6s} {spec['phase']:6s} {where}  {shown}  {row['wall_s']:.1f}s"


class SpecQueue(Searcher):
    """Hands Tune the grid's trial specs one at a time.

    A ``tune.grid_search`` over the specs would do the same, but Tune deep-copies the whole search space
    for every variant it generates: quadratic in the number of trials (minutes before the first trial of
    a 6,800-trial grid starts).  This is linear.
    """

    def __init__(self, specs: list[dict[str, Any]]):
        super().__init__()
        self._specs = specs
        self._next = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str:
        if self._next >= len(self._specs):
            return Searcher.FINISHED
        self._next += 1
        return {"spec": self._specs[self._next - 1]}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Nothing to learn: the queue is fixed."""


def run_trials(
    specs: list[dict[str, Any]],
    grid: Grid,
    results: ResultsDirectory,
    experiment: str,
    summary: RunSummary,
    echo: Echo,
    tune_config: tune.TuneConfig | None = None,
    param_space: dict[str, Any] | None = None,
    stop: Any = None,
) -> None:
    """Run trials on Ray Tune: one per spec (handed out by :class:`SpecQueue`) or a search given
    ``param_space``."""
    resources = trial_resources(grid)
    total = len(specs) if param_space is None else (tune_config.num_samples if tune_config else 1)
    callback = ResultsCallback(results, resources, summary, echo, total)
    trainable = tune.with_resources(run_ursa_trial, tune.PlacementGroupFactory([resources]))
    if param_space is None:
        param_space = {}
        tune_config = tune.TuneConfig(
            search_alg=SpecQueue(specs),
            num_samples=len(specs),
            reuse_actors=True,
            max_concurrent_trials=grid.max_concurrent_trials,
            trial_dirname_creator=lambda t: t.config["spec"]["trial_id"][:80],
        )
    storage = results.location / "ray"  # checkpoints: a local folder, or the same object store as the results
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=experiment,
            storage_path=storage.path,
            storage_filesystem=None if storage.is_local else storage.fs,  # endpoint etc. from the --out URI
            verbose=0,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=grid.max_failures),
            stop=stop,
        ),
    )
    tuner.fit()


def run_grid(grid: Grid, out_dir: str | Path | Location, address: str | None = None, echo: Echo = print) -> RunSummary:
    """Run the grid's search phase (if any) and final phase; resume what an earlier run left unfinished.

    ``out_dir``: a local folder or an object-store URI (``s3://bucket/prefix``; see :class:`Location`)."""
    connect(address)
    check_cluster_fits(grid)
    out = Location.parse(out_dir)
    results = ResultsDirectory(out)
    (out / "grid.yaml").write_text(Path(grid.path).read_text())
    summary = RunSummary()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    overrides: dict[str, dict[str, Any]] = {}
    if grid.search is not None:
        from ursa_ray.tune.search import run_search_phase

        overrides = run_search_phase(grid, results, summary, echo, stamp)
    specs = grid.trial_specs("final", overrides)
    done = results.finished_ids()
    todo = [s for s in specs if s["trial_id"] not in done]
    summary.planned += len(specs)
    summary.skipped += len(specs) - len(todo)
    resources = ", ".join(f"{k}={v:g}" for k, v in trial_resources(grid).items())
    cluster = ray.cluster_resources()
    echo(
        f"final phase: {len(specs)} trials ({len(specs) - len(todo)} already finished) with {resources} each "
        f"on Ray ({cluster.get('CPU', 0):g} CPUs, {cluster.get('GPU', 0):g} GPUs) -> {out}"
    )
    if todo:
        run_trials(todo, grid, results, f"final-{stamp}", summary, echo)
    return summary
