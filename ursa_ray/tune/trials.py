"""The trial-running machinery both phases use: Ray Tune experiments whose finished trials are written into the
results directory as they finish.

:func:`run_trials` runs one Tune experiment (the final phase's specs through :class:`SpecQueue`, or one
search cell's configurations).  A :class:`ResultsCallback` on the driver writes every trial's rows as soon as
Tune reports it complete (or errored), so an interrupted run keeps everything that finished; a rerun skips
finished trial ids.

Ctrl-C (SIGINT) is ours, not Tune's (:class:`Interrupt`): the first asks every phase to stop (the
:class:`RunStopper` ends the running Tune experiment at its next step, trials that did not finish are not
recorded, no later cell or phase starts), a second aborts at once, though never in the middle of writing
a trial's rows.

The dependency goes one way: :mod:`ursa_ray.tune.runner` (the driver: :func:`~ursa_ray.tune.runner.run_grid`)
and :mod:`ursa_ray.tune.search` (the search phase) import this module; it imports neither.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from ray import cloudpickle, tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import Searcher
from ray.tune.stopper import NoopStopper

from ursa_ray.grid import Grid, GridError
from ursa_ray.results import Location, ResultsDirectory, transfer_examples_location
from ursa_ray.tune.progress import Progress
from ursa_ray.tune.trainable import config_specs, pack, placement, request, run_ursa_trial

Echo = Callable[[str], None]


def unreachable(address: str) -> str | None:
    """Why no Ray cluster answers at ``address``, or None when its head accepts a TCP connection within 3 s
    (``ray.init`` would otherwise retry an absent head for minutes).  ``auto``: the cluster ``ray start`` left on
    this machine; ``ray://host:port``: a Ray Client server."""
    import socket

    from ray._private.services import canonicalize_bootstrap_address  # covered by tests/test_ray_internals.py

    try:
        head = canonicalize_bootstrap_address(address.removeprefix("ray://"))
    except ValueError as exc:
        return str(exc)
    if head is None:
        return "no running cluster found"
    host, _, port = head.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return None


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


def grid_requests(grid: Grid) -> dict[tuple[tuple[str, float], ...], list[tuple[str, str]]]:
    """Every distinct request of the grid's trials (both phases: a cell's search and final trials ask for the
    same), as sorted (resource, amount) pairs, each with the (method label, model) pairs that ask for it."""
    out: dict[tuple[tuple[str, float], ...], list[tuple[str, str]]] = {}
    for cell in grid.cells():
        method, model = cell["method"], cell["model"]
        key = tuple(sorted(request(grid.resources_for(method, model)).items()))
        pairs = out.setdefault(key, [])
        if (method.label, model.name) not in pairs:
            pairs.append((method.label, model.name))
    return out


def describe(need: Mapping[str, float]) -> str:
    """A request as ``CPU=1, GPU=0.25``."""
    return ", ".join(f"{k}={v:g}" for k, v in need.items())


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
    """GridError when no alive node (nor any node type the autoscaler may add) has the resources that some
    trial of the grid asks for (Ray would wait forever), checked for each distinct request
    (:func:`grid_requests`).  The one-line message names the method and model asking for it, or says "each
    trial" when every trial of the grid asks for the same."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")] + launchable_node_resources()
    requests = grid_requests(grid)
    for key, pairs in requests.items():
        need = dict(key)
        if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
            continue
        offered = "; ".join(
            ", ".join(f"{k}={v:g}" for k, v in sorted(node.items()) if k in ("CPU", "GPU") or k in need)
            for node in nodes
        )
        short = {k: v for k, v in need.items() if not any(node.get(k, 0.0) >= v for node in nodes)}
        which = describe(short) or describe(need)
        if len(requests) == 1:
            who = "each trial"
        else:
            label, model = pairs[0]
            others = len(pairs) - 1
            who = f"method {label!r} on model {model!r}" + (
                f" (and {others} other method/model pair{'s' if others > 1 else ''})" if others else ""
            )
        raise GridError(
            f"{grid.path}: resources: {who} asks for {which}, which no node of the Ray cluster has "
            f"(nodes offer: {offered or 'nothing'})"
        )


@dataclass
class RunSummary:
    """What a run did.  ``planned``/``skipped`` count final-phase trials; ``finished``, ``failed`` (id, error)
    and ``early_stopped`` hold the trial ids of both phases recorded by this run."""

    planned: int = 0
    skipped: int = 0
    finished: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    early_stopped: list[str] = field(default_factory=list)
    recorded: dict[str, int] = field(default_factory=lambda: {"search": 0, "final": 0})
    search_failed: list[str] = field(default_factory=list)
    """Search trials (ids) that failed: recorded, never selected."""
    failed_cells: list[tuple[str, str]] = field(default_factory=list)
    """(cell, why) for cells whose search left no configuration to select: their final phase was not run."""
    budget_stopped: list[str] = field(default_factory=list)
    """Cells whose search this run ended by spending its compute budget."""
    interrupted: bool = False
    unfinished_search: int = 0
    """Search trials that were running when Ctrl-C stopped the run (not recorded: a rerun replaces them)."""

    @property
    def incomplete(self) -> int:
        """Trials that did not finish: final trials planned but not recorded, and interrupted search trials."""
        return self.planned - self.skipped - self.recorded["final"] + self.unfinished_search


class Interrupt:
    """Ctrl-C during a run.  The first SIGINT only sets a flag: the running Tune experiment stops at its next
    step (:class:`RunStopper`), and no later cell or phase starts.  A second SIGINT raises KeyboardInterrupt,
    deferred while a trial's rows are being written (:meth:`critical`), so no file is ever half-written."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.announced = False
        self._critical = 0
        self._abort_pending = False

    def is_set(self) -> bool:
        return self.event.is_set()

    def __reduce__(self) -> tuple:  # Tune pickles its run config (stopper included): a copy is a fresh Interrupt
        return (Interrupt, ())

    @contextlib.contextmanager
    def catching(self) -> Iterator[Interrupt]:
        """Handle SIGINT (main thread only) instead of Tune, whose own handler would end one experiment and
        let the driver carry on to the next cell and phase."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.getsignal(signal.SIGINT)
        tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
            if tune_handler is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.event.is_set():
            self.event.set()  # nothing printed here: a handler must not write to a stream the driver may be using
            return
        if self._critical:
            self._abort_pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A block a second Ctrl-C does not cut short (writing one trial's rows)."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
            if self._abort_pending and not self._critical:
                self._abort_pending = False
                raise KeyboardInterrupt


class RunStopper(tune.Stopper):
    """Ends a Tune experiment when Ctrl-C was pressed, or (search phase) when the cell's compute budget is spent.

    Tune asks :meth:`stop_all` at every step of its loop (about every 0.1 s), so the budget is checked while
    trials run, counting their reserved seconds so far (:meth:`ResultsCallback.reserved`)."""

    def __init__(self, interrupt: Interrupt, echo: Echo, budget: Any = None):
        self.interrupt, self.echo, self.budget = interrupt, echo, budget
        self.callback: ResultsCallback | None = None
        self.reason: str | None = None  # "interrupt" or "budget" once it stopped the experiment
        self.stopped_at: float | None = None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def __reduce__(self) -> tuple:
        """Tune's experiment-state snapshots pickle the run config, this stopper with it (its echo and live
        callback cannot be pickled).  ursa-ray never restores a Tune experiment (a rerun resumes from its own
        results), so a snapshot holds a stopper that never stops."""
        return (NoopStopper, ())

    def stop_all(self) -> bool:
        if self.reason is not None:
            return True
        now = time.time()
        if self.interrupt.is_set():
            self.reason, self.stopped_at = "interrupt", now
            if not self.interrupt.announced:
                self.interrupt.announced = True
                self.echo(
                    "interrupted: stopping; finished trials are kept, running ones are not recorded "
                    "(Ctrl-C again to abort at once)"
                )
        elif (
            self.budget is not None and self.callback is not None and self.budget.exhausted(self.callback.reserved(now))
        ):
            self.reason, self.stopped_at = "budget", now
        return self.reason is not None


class ResultsCallback(tune.Callback):
    """Writes each trial's rows when Tune reports it finished or errored, and tells the run's
    :class:`~ursa_ray.tune.progress.Progress` (``echo`` when it is one; else one line per trial to ``echo``).

    Trials still running when the experiment ends are settled in :meth:`on_experiment_end`: cut short by a
    search's compute budget, they are recorded as early_stopped with the compute they used; stopped by Ctrl-C,
    they are not recorded (a rerun replaces them)."""

    def __init__(
        self,
        results: ResultsDirectory,
        summary: RunSummary,
        echo: Echo,
        total: int | None,
        stopper: RunStopper | None = None,
    ):
        self.results = results
        self.summary = summary
        self.echo = echo
        self.progress = echo if isinstance(echo, Progress) else Progress(echo)
        self.total = total
        self.stopper = stopper
        self.started: dict[str, float] = {}
        self.running: dict[str, tuple[float, float, float]] = {}  # not yet recorded: (started, CPUs, GPUs)
        self.recorded: set[str] = set()
        self.reserved_recorded = (0.0, 0.0)  # reserved CPU- and GPU-seconds of the trials recorded so far
        self.done = 0

    def reserved(self, now: float) -> tuple[float, float]:
        """Reserved CPU- and GPU-seconds of this experiment's trials: those recorded plus those running until
        ``now``, each at its own request (a sum over the running trials only)."""
        cpu, gpu = self.reserved_recorded
        for started, n_cpus, n_gpus in self.running.values():
            cpu += n_cpus * max(0.0, now - started)
            gpu += n_gpus * max(0.0, now - started)
        return cpu, gpu

    def setup(self, **info: Any) -> None:
        self.progress.begin(self.total)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        specs = trial_specs(trial)
        if trial.trial_id not in self.started:  # not again when a failed trial is retried
            self.progress.trial_started(len(specs), specs[0]["phase"])
        started = self.started.setdefault(trial.trial_id, time.time())
        if trial.trial_id not in self.recorded:
            need = request(specs[0]["resources"])
            self.running[trial.trial_id] = (started, need.get("CPU", 0.0), need.get("GPU", 0.0))

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.progress.tick()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, error=None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.stopper is not None and self.stopper.interrupt.is_set():
            return  # a worker lost to Ctrl-C is an interrupted trial, not a failed one: a rerun runs it
        error = trial.get_error()
        self._record(trial, error=f"{type(error).__name__}: {error}" if error else "the trial's worker failed")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Settle the trials that were running when the experiment stopped (Tune calls no per-trial hook then)."""
        stopper = self.stopper
        for trial in trials:
            if trial.trial_id in self.recorded or trial.trial_id not in self.started:
                continue  # recorded, or never started (nothing reserved)
            last = trial.last_result or {}
            if last.get("status") in ("ok", "failed") and trial.checkpoint is not None:
                self._record(trial, error=None)  # it had reported its outcome: record it as it is
            elif stopper is not None and stopper.reason == "budget":
                budget = stopper.budget.describe() if stopper.budget is not None else "budget"
                self._record(
                    trial, error=None, stopped_at=stopper.stopped_at, why=f"cut short by the search's {budget}"
                )
            elif trial.config.get("hp"):  # a search trial stopped by Ctrl-C (final ones count in RunSummary.incomplete)
                self.summary.unfinished_search += 1
        self.progress.end()

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """The trial's worker (or its node) died and Tune retries it (``max_failures`` in the grid)."""
        reason = "the trial's worker failed"
        try:  # Tune has just pickled the error into the trial's local folder
            with open(trial.pickled_error_file, "rb") as f:
                error = cloudpickle.load(f)
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
        except Exception:  # noqa: BLE001 - the message is informative only
            pass
        failures = f"{trial.run_metadata.num_failures}/{trial.max_failures}"
        specs = trial_specs(trial)
        where = _where(specs[0])
        if len(specs) > 1:  # a batched trial: its seeds
            where = where.rpartition(" seed=")[0] + " seeds=" + ",".join(str(s["seed"]) for s in specs)
        self.echo(f"retry {failures} {specs[0]['phase']:6s} {where}: {reason}")

    def _record(self, trial: Any, error: str | None, stopped_at: float | None = None, why: str = "") -> None:
        """Write the rows of every seed ``trial`` ran (its wall and reserved seconds split evenly over them)."""
        if trial.trial_id in self.recorded:
            return
        specs = trial_specs(trial)
        finished = stopped_at or time.time()
        started = min(self.started.get(trial.trial_id, finished), finished)
        wall = (finished - started) / len(specs)
        last = trial.last_result or {}
        checkpoint = trial.checkpoint if error is None else None
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                outcomes = [self._read_outcome(Path(folder) / str(i), spec) for i, spec in enumerate(specs)]
        else:
            outcomes = [self._unfinished_outcome(spec, error, last, why) for spec in specs]
        selection = {k: float(v) for k, v in last.items() if k.startswith("val_") and isinstance(v, (int, float))}
        need = request(specs[0]["resources"])  # the trial's own request (all its seeds are one cell's)
        n_cpus, n_gpus = need.get("CPU", 0.0), need.get("GPU", 0.0)
        rows = []
        for spec, (status, record, metrics, points, predictions) in zip(specs, outcomes, strict=True):
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
                "gpu_ids": record.get("gpu_ids", "") or "",
                "seeds_in_trial": len(specs),
                "node": record.get("node") or (trial.node_ip or ""),
                "selection": json.dumps(selection, sort_keys=True),
                "started_at": started,
                "finished_at": finished,
            }
            rows.append((spec, status, row, metrics, points, predictions))
        interrupt = self.stopper.interrupt if self.stopper is not None else None
        with interrupt.critical() if interrupt is not None else contextlib.nullcontext():
            for _, _, row, metrics, points, predictions in rows:
                self.results.add(row, metrics, points, predictions)
            self.recorded.add(trial.trial_id)
            self.running.pop(trial.trial_id, None)
        if specs[0]["phase"] == "final":
            forget_metric_history(trial)
        for spec, status, row, metrics, _, _ in rows:
            cpu, gpu = self.reserved_recorded
            self.reserved_recorded = (cpu + row["reserved_cpu_s"], gpu + row["reserved_gpu_s"])
            self.done += 1
            self.summary.recorded[spec["phase"]] = self.summary.recorded.get(spec["phase"], 0) + 1
            if status == "ok":
                self.summary.finished.append(spec["trial_id"])
            elif status == "early_stopped":
                self.summary.early_stopped.append(spec["trial_id"])
            else:
                self.summary.failed.append((spec["trial_id"], row["error"]))
                if spec["phase"] == "search":
                    self.summary.search_failed.append(spec["trial_id"])
            self.progress.trial_recorded(status, _progress_line(self.done, self.total, spec, status, row, metrics))

    def _read_outcome(self, folder: Path, spec: dict[str, Any]) -> tuple:
        """(status, record, metrics, points, predictions) of one seed from its checkpoint folder; a transfer
        source's examples are saved before its rows, so a finished source always has its file."""
        record = json.loads((folder / "record.json").read_text())
        metrics = _rows(folder / "metrics.parquet")
        points = _rows(folder / "points.parquet")
        predictions: dict[str, pd.DataFrame] = {}
        if (folder / "predictions").is_dir():
            predictions = {p.stem: pd.read_parquet(p) for p in (folder / "predictions").glob("*.parquet")}
        if (folder / "transfer.pt").exists():
            self.results.transfer_examples(spec["trial_id"]).write_bytes((folder / "transfer.pt").read_bytes())
        return record.get("status", "failed"), record, metrics, points, predictions

    @staticmethod
    def _unfinished_outcome(spec: dict[str, Any], error: str | None, last: dict[str, Any], why: str) -> tuple:
        """A trial with no outcome of its own: failed with ``error``, or stopped before its end (by ASHA, or
        cut short by the search's compute budget: ``why``) with the validation metrics it last reported."""
        if error is not None:
            return "failed", {"error": error, "cpu_s": last.get("cpu_s", math.nan)}, [], [], {}
        record = {"cpu_s": last.get("cpu_s", math.nan), "train_s": last.get("train_s", math.nan), "error": why}
        metrics = [
            {**_metric_base(spec), "eval_set": "validation", "metric": k[4:], "value": float(v)}
            for k, v in last.items()
            if k.startswith("val_") and isinstance(v, (int, float))
        ]
        return "early_stopped", record, metrics, [], {}


def forget_metric_history(trial: Any) -> None:
    """Drop what Tune keeps of a recorded final trial's results beyond its last one: running statistics of every
    numeric result key (``run_metadata.metric_analysis``, and the last-5 and last-10 deques of ``metric_n_steps``),
    about 17 KB a trial in the driver for as long as the experiment lasts.  Only Tune's own analysis of the
    experiment (best trial by a metric) reads them; the final phase has no metric, and ursa-ray reads its
    results directory.  (Tune internals: tests/test_ray_internals.py.)"""
    metadata = getattr(trial, "run_metadata", None)
    if metadata is not None:
        metadata.metric_analysis, metadata.metric_n_steps = {}, {}


def trial_specs(trial: Any) -> list[dict[str, Any]]:
    """The ursa-ray specs a Tune trial runs: a search trial's one (its sampled hyperparameters and an id), or
    a final trial's seeds."""
    return config_specs(trial.config, trial.trial_id)


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


def _progress_line(
    done: int, total: int | None, spec: dict[str, Any], status: str, row: dict[str, Any], metrics: list
) -> str:
    where = _where(spec)
    count = f"[{done}]" if total is None else f"[{done}/{total}]"  # a budgeted search has no fixed count
    if status == "failed":
        return f"{count} FAILED {spec['phase']:6s} {where}: {row['error']}"
    wanted = {
        ("test", "accuracy"),
        ("test", "nll"),
        ("test", "rmse_truth"),
        ("test", "coverage_95_epistemic"),
        ("validation", "nll"),
    }
    shown = " ".join(
        f"{'val_' if m['eval_set'] == 'validation' else ''}{m['metric']}={m['value']:.3f}"
        for m in metrics
        if (m["eval_set"], m["metric"]) in wanted
    )
    why = f"  ({row['error']})" if row["error"] else ""
    return f"{count} {status:6s} {spec['phase']:6s} {where}  {shown}  {row['wall_s']:.1f}s{why}"


def seed_groups(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The final phase's Tune trials: ``specs`` grouped into runs of up to ``spec["vectorize_seeds"]`` seeds
    of one cell, configuration and resource request (a batched computation, see
    :func:`ursa_ray.trial.run_trials_batched`; the Tune trial asks for one seed's ``resources``),
    in the order of each group's first seed; a spec with ``vectorize_seeds`` 1 is a trial of its own."""
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    order: list[list[dict[str, Any]]] = []
    for spec in specs:
        size = int(spec.get("vectorize_seeds", 1))
        key = json.dumps(
            [spec["cell"], spec["config"], spec.get("transfer_source", False), spec["resources"]],
            sort_keys=True,
            default=str,
        )
        open_groups = groups.setdefault(key, [])
        if size > 1 and open_groups and len(open_groups[-1]) < size:
            open_groups[-1].append(spec)
            continue
        group = [spec]
        open_groups.append(group)
        order.append(group)
    return order


class SpecQueue(Searcher):
    """Hands Tune the final phase's trials (groups of specs, :func:`seed_groups`) one at a time.

    A ``tune.grid_search`` over the specs would do the same, but Tune deep-copies the whole search space
    for every variant it generates: quadratic in the number of trials (minutes before the first trial of
    a 6,800-trial grid starts).  This is linear.

    Reference trials (phase ``reference``) go before everything, and a trial of their cell
    (``reference_from``) waits for its reference as a transfer attack's trial waits for its source; each
    spec with ``reference`` settings gets ``references_dir``, the ``references/`` folder of ``results_uri``.
    The transfer attack's order: transfer sources (``transfer_source``) go first, trials that need none
    next, and a trial scored on a source's examples (``transfer_from``) waits until its seeds' sources are
    complete (``suggest`` returns None meanwhile; Tune asks again), then gets ``transfer_examples``, the
    location of the file its source saved under ``results_uri``, when there is one (a failed source saves
    none).  Tune calls the searcher's ``on_trial_complete`` before the callbacks' and never suggests in
    between, so the source's file is written before the waiting trial is handed out.
    """

    def __init__(self, groups: list[list[dict[str, Any]]], results_uri: str):
        super().__init__()

        def rank(group: list[dict[str, Any]]) -> int:
            if group[0]["phase"] == "reference":
                return -1
            return 0 if group[0].get("transfer_source") else 2 if "transfer_from" in group[0] else 1

        self._groups = sorted(groups, key=rank)
        self._results_uri = results_uri
        self._unfinished_sources = {
            s["trial_id"] for g in groups for s in g if s.get("transfer_source") or s["phase"] == "reference"
        }
        self._running: dict[str, list[str]] = {}  # Tune trial id -> its specs' trial ids
        self._next = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._next >= len(self._groups):
            return Searcher.FINISHED
        group = self._groups[self._next]
        if any(
            spec.get("transfer_from") in self._unfinished_sources
            or spec.get("reference_from") in self._unfinished_sources
            for spec in group
        ):
            return None
        self._next += 1
        self._running[trial_id] = [spec["trial_id"] for spec in group]
        return {"specs": pack([self._with_examples(spec) for spec in group])}

    def _with_examples(self, spec: dict[str, Any]) -> dict[str, Any]:
        if "reference" in spec:  # where its cell's reference is stored (by fingerprint)
            spec = {**spec, "references_dir": (Location.parse(self._results_uri) / "references").uri}
        if "transfer_from" not in spec:
            return spec
        saved = transfer_examples_location(self._results_uri, spec["transfer_from"])
        return {**spec, "transfer_examples": saved.uri} if saved.exists() else spec

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """A finished (or failed) transfer source releases the trials waiting for it."""
        self._unfinished_sources.difference_update(self._running.pop(trial_id, []))


class LiveFIFOScheduler(FIFOScheduler):
    """Tune's first-in-first-out scheduler without its scan of every trial at every step.

    Tune asks the scheduler which trial to start at every step of its loop (several steps per trial), and
    ``FIFOScheduler`` answers by scanning every trial of the experiment, finished ones included, for the first
    pending one (then for a paused one): the driver's time per trial grew with the trials already run.  This
    one keeps the trials not yet finished, in the order Tune added them (a retried trial goes last, as Tune
    moves it to the end of its list), and drops a finished one when it meets it: the same choice, in time
    that depends on the trials alive (running, pending) only.
    """

    def __init__(self) -> None:
        super().__init__()
        self._alive: dict[Trial, None] = {}  # insertion-ordered

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._alive.pop(trial, None)
        self._alive[trial] = None

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        paused = None
        for trial in list(self._alive):
            if trial.status in (Trial.TERMINATED, Trial.ERROR):
                del self._alive[trial]
            elif trial.status == Trial.PENDING:
                return trial
            elif paused is None and trial.status == Trial.PAUSED:
                paused = trial
        return paused


def run_trials(
    specs: list[dict[str, Any]],
    grid: Grid,
    results: ResultsDirectory,
    experiment: str,
    summary: RunSummary,
    echo: Echo,
    interrupt: Interrupt | None = None,
    tune_config: tune.TuneConfig | None = None,
    param_space: dict[str, Any] | None = None,
    budget: Any = None,
    total: int | None = None,
) -> RunStopper:
    """Run trials on Ray Tune: the specs, several seeds of a cell per Tune trial where they batch
    (:func:`seed_groups`, handed out by :class:`SpecQueue`), or a search given
    ``param_space`` (``total`` trials at most, shown in the progress lines; ``budget``, a
    :class:`~ursa_ray.tune.search.ComputeBudget`, ends it early).  Returns the stopper, whose ``reason`` says
    whether Ctrl-C or the budget ended the experiment.

    What Tune does in the driver per trial does not grow with the trials run so far (docs/performance.md, "The
    driver on large grids"): the final phase's trials come from :class:`SpecQueue` and are chosen by
    :class:`LiveFIFOScheduler`, and Tune snapshots its experiment state every 10 minutes
    (``TUNE_GLOBAL_CHECKPOINT_S``, set in :mod:`ursa_ray.tune`), not every 10 s."""
    stopper = RunStopper(interrupt or Interrupt(), echo, budget)
    callback = ResultsCallback(results, summary, echo, len(specs) if param_space is None else total, stopper)
    stopper.callback = callback
    trainable = tune.with_resources(run_ursa_trial, placement)  # each trial's own request, from its config
    if param_space is None:
        param_space = {}
        groups = seed_groups(specs)
        tune_config = tune.TuneConfig(
            search_alg=SpecQueue(groups, results.location.uri),
            num_samples=len(groups),
            reuse_actors=True,
            max_concurrent_trials=grid.max_concurrent_trials,
            scheduler=LiveFIFOScheduler(),
            trial_dirname_creator=lambda t: config_specs(t.config, t.trial_id)[0]["trial_id"][:80],
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
            stop=stopper,
        ),
    )
    with _pending_trials(param_space):
        tuner.fit()
    return stopper


@contextlib.contextmanager
def _pending_trials(param_space: dict[str, Any]) -> Iterator[None]:
    """Let Tune keep as many final-phase trials pending (placement groups requested, workers starting) as it
    does for a grid search, ``max(200, 1.1 × cluster CPUs)``: with a searcher of its own (:class:`SpecQueue`)
    Tune keeps one, so workers would start one after another and short trials run one at a time however many
    fit.  ``TUNE_MAX_PENDING_TRIALS_PG`` set by the user wins; the search phase keeps Tune's choice."""
    if param_space or "TUNE_MAX_PENDING_TRIALS_PG" in os.environ:
        yield
        return
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(200, int(1.1 * ray.cluster_resources().get("CPU", 1.0))))
    try:
        yield
    finally:
        os.environ.pop("TUNE_MAX_PENDING_TRIALS_PG", None)
