"""The driver's side of a finished trial: a :class:`ResultsCallback` writes every trial's rows into the results
directory as soon as Tune reports it complete (or errored), so an interrupted run keeps everything that finished
(a rerun skips finished trial ids), and keeps the run's :class:`RunSummary` and progress lines."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from ray import cloudpickle, tune

from ursa_ray.results import ResultsDirectory, metric_key, trial_row
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.interrupt import RunStopper
from ursa_ray.tune.progress import Echo, Progress
from ursa_ray.tune.trainable import config_specs, request


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
        """Trials that did not finish: final-phase trials (a grid's reference trials among them) planned but
        not recorded, and interrupted search trials."""
        finished = self.recorded["final"] + self.recorded.get("reference", 0)
        return self.planned - self.skipped - finished + self.unfinished_search


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
        spec_table: Sequence[bytes] = (),
    ):
        self.results = results
        self.spec_table = spec_table  # the final phase's packed seed groups (config_specs)
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
        specs = trial_specs(trial, self.spec_table)
        if trial.trial_id not in self.started:  # not again when a failed trial is retried
            self.progress.trial_started(len(specs), specs[0].phase)
        started = self.started.setdefault(trial.trial_id, time.time())
        if trial.trial_id not in self.recorded:
            need = request(specs[0].resources)
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
        specs = trial_specs(trial, self.spec_table)
        where = _where(specs[0])
        if len(specs) > 1:  # a batched trial: its seeds
            where = where.rpartition(" seed=")[0] + " seeds=" + ",".join(str(s.seed) for s in specs)
        self.echo(f"retry {failures} {specs[0].phase:6s} {where}: {reason}")

    def _record(self, trial: Any, error: str | None, stopped_at: float | None = None, why: str = "") -> None:
        """Write the rows of every seed ``trial`` ran (its wall and reserved seconds split evenly over them,
        :func:`~ursa_ray.results.trial_row`)."""
        if trial.trial_id in self.recorded:
            return
        specs = trial_specs(trial, self.spec_table)
        finished = stopped_at or time.time()
        started = min(self.started.get(trial.trial_id, finished), finished)
        last = trial.last_result or {}
        selection = {k: float(v) for k, v in last.items() if k.startswith("val_") and isinstance(v, (int, float))}
        need = request(specs[0].resources)  # the trial's own request (all its seeds are one cell's)
        rows = []
        for spec, (status, record, metrics, points, predictions) in zip(
            specs, self._outcomes(trial, specs, error, last, why), strict=True
        ):
            row = trial_row(
                spec,
                status,
                record,
                seeds_in_trial=len(specs),
                started_at=started,
                finished_at=finished,
                request=need,
                node_ip=trial.node_ip,
                selection=selection,
            )
            rows.append((spec, status, row, metrics, points, predictions))
        self._write(trial, rows)
        if specs[0].phase == "final":
            forget_metric_history(trial)
        for spec, status, row, metrics, _, _ in rows:
            self._count(spec, status, row, metrics)

    def _outcomes(
        self, trial: Any, specs: list[TrialSpec], error: str | None, last: dict[str, Any], why: str
    ) -> list[tuple]:
        """(status, record, metrics, points, predictions) of each seed: read from the trial's checkpoint, or
        (failed, or stopped before its end) made from ``error`` and its ``last`` result."""
        checkpoint = trial.checkpoint if error is None else None
        if checkpoint is None:
            return [self._unfinished_outcome(spec, error, last, why) for spec in specs]
        with checkpoint.as_directory() as folder:
            return [self._read_outcome(Path(folder) / str(i), spec) for i, spec in enumerate(specs)]

    def _write(self, trial: Any, rows: list[tuple]) -> None:
        """Add the seeds' rows to the results directory; a second Ctrl-C waits until they are written."""
        interrupt = self.stopper.interrupt if self.stopper is not None else None
        with interrupt.critical() if interrupt is not None else contextlib.nullcontext():
            for _, _, row, metrics, points, predictions in rows:
                self.results.add(row, metrics, points, predictions)
            self.recorded.add(trial.trial_id)
            self.running.pop(trial.trial_id, None)

    def _count(self, spec: TrialSpec, status: str, row: dict[str, Any], metrics: list) -> None:
        """A recorded seed in the reserved seconds so far, the run's summary and the progress lines."""
        cpu, gpu = self.reserved_recorded
        self.reserved_recorded = (cpu + row["reserved_cpu_s"], gpu + row["reserved_gpu_s"])
        self.done += 1
        self.summary.recorded[spec.phase] = self.summary.recorded.get(spec.phase, 0) + 1
        if status == "ok":
            self.summary.finished.append(spec.trial_id)
        elif status == "early_stopped":
            self.summary.early_stopped.append(spec.trial_id)
        else:
            self.summary.failed.append((spec.trial_id, row["error"]))
            if spec.phase == "search":
                self.summary.search_failed.append(spec.trial_id)
        self.progress.trial_recorded(status, _progress_line(self.done, self.total, spec, status, row, metrics))

    def _read_outcome(self, folder: Path, spec: TrialSpec) -> tuple:
        """(status, record, metrics, points, predictions) of one seed from its checkpoint folder; a transfer
        source's examples are saved before its rows, so a finished source always has its file."""
        record = json.loads((folder / "record.json").read_text())
        metrics = _rows(folder / "metrics.parquet")
        points = _rows(folder / "points.parquet")
        predictions: dict[str, pd.DataFrame] = {}
        if (folder / "predictions").is_dir():
            predictions = {p.stem: pd.read_parquet(p) for p in (folder / "predictions").glob("*.parquet")}
        if (folder / "transfer.pt").exists():
            self.results.transfer_examples(spec.trial_id).write_bytes((folder / "transfer.pt").read_bytes())
        return record.get("status", "failed"), record, metrics, points, predictions

    @staticmethod
    def _unfinished_outcome(spec: TrialSpec, error: str | None, last: dict[str, Any], why: str) -> tuple:
        """A trial with no outcome of its own: failed with ``error``, or stopped before its end (by ASHA, or
        cut short by the search's compute budget: ``why``) with the validation metrics it last reported."""
        if error is not None:
            return "failed", {"error": error, "cpu_s": last.get("cpu_s", math.nan)}, [], [], {}
        record = {"cpu_s": last.get("cpu_s", math.nan), "train_s": last.get("train_s", math.nan), "error": why}
        metrics = [
            {**metric_key(spec), "eval_set": "validation", "metric": k[4:], "value": float(v)}
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


def trial_specs(trial: Any, spec_table: Sequence[bytes]) -> list[TrialSpec]:
    """The ursa-ray specs a Tune trial runs: a search trial's one (its sampled hyperparameters and an id), or
    a final trial's seeds (from the run's ``spec_table``)."""
    return config_specs(trial.config, trial.trial_id, spec_table)


def _rows(path: Path) -> list[dict[str, Any]]:
    return pd.read_parquet(path).to_dict("records") if path.exists() else []


def _where(spec: TrialSpec) -> str:
    where = f"{spec.label} {spec.model} {spec.dataset}"
    if spec.complexity is not None:
        where += f" c={spec.complexity:g}"
    return where + f" seed={spec.seed}"


def _progress_line(
    done: int, total: int | None, spec: TrialSpec, status: str, row: dict[str, Any], metrics: list
) -> str:
    where = _where(spec)
    count = f"[{done}]" if total is None else f"[{done}/{total}]"  # a budgeted search has no fixed count
    if status == "failed":
        return f"{count} FAILED {spec.phase:6s} {where}: {row['error']}"
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
    return f"{count} {status:6s} {spec.phase:6s} {where}  {shown}  {row['wall_s']:.1f}s{why}"
