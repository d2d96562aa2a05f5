"""The driver's cost on a large grid, through the real driver path (no asserts: the machine is shared and noisy).

Three figures, each a function of its own (``--only`` picks them):

* **writing** (:func:`results_writing`): ``--writes`` synthetic trials (a trials row and 30 metric rows each)
  added through the real :class:`~ursa_ray.results.ResultsDirectory`: the cost of adding trial ``--writes``
  against adding trial 100 (target ≤ 1.5 at trial 100,000), the writing time per trial in each tenth of the
  run (linear total: flat), and the ``compact`` that follows.
* **driver** (:func:`driver_cost`): a grid of ``--trials`` trivial trials (a trainable that writes a finished
  trial's outcome folder and reports it, nothing else) run by :func:`ursa_ray.tune.trials.run_trials` on a local
  Ray: Tune, the results callback, the results directory, the progress output, as in ``ursa-ray run``.
  Printed: the driver process's CPU time (``time.process_time``: every thread of the driver, Ray's own included)
  per trial in a window of trials near trial 1,000 and in the last window, and their ratio (target: at trial
  20,000 ≤ 1.5× that at trial 1,000), with and without the time spent writing results
  (``ResultsDirectory.add``, measured around each call); trials per second; the driver's peak resident memory
  (``ru_maxrss``); what Tune's experiment-state snapshots cost (:meth:`TuneController.save_to_dir`, timed); and
  the time from the last trial recorded to ``run_trials`` returning (Tune's final snapshot and clean-up).
* **overhead** (:func:`ray_overhead`): ``--overhead-trials`` trials each busy for ``--overhead-seconds``
  (target figure: ~10 s) on the local Ray's slots (one CPU each): the grid's wall time ÷ (Σ in-trial
  time ÷ slots).  Target ≤ 1.15.

    python benchmarks/bench_driver.py --writes 10000 --trials 2000   # quick: a few minutes on 2 cores
    python benchmarks/bench_driver.py --trials 20000 --only driver
    python benchmarks/bench_driver.py --only overhead
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ursa_ray.tune.trials as trials_module
from ursa_ray.api import check
from ursa_ray.results import ResultsDirectory
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.callback import RunSummary
from ursa_ray.tune.cluster import connect
from ursa_ray.tune.interrupt import Interrupt
from ursa_ray.tune.progress import Progress
from ursa_ray.tune.trials import run_trials

GRID = {
    "name": "driver-bench",
    "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}}],
    "models": [{"name": "mlp", "options": {"widths": [8]}}],
    "datasets": ["digits"],
    "seeds": [0],
    "resources": {"cpu": 1},
    "save_predictions": False,
}


def trivial_trial(param: dict[str, Any], spec_table: Any = ()) -> None:
    """A Tune trainable that does (almost) nothing: the outcome folder of a finished trial with no metrics,
    reported as ``run_ursa_trial`` reports it.  A spec's ``config["busy_s"]``: seconds to busy-loop first (0: none)."""
    import json
    import os
    import tempfile
    import time

    from ray import tune

    from ursa_ray.tune.trainable import config_specs

    started, started_cpu = time.monotonic(), time.process_time()
    specs = config_specs(param, "", spec_table)
    busy = float(specs[0].config.get("busy_s", 0.0))
    while time.monotonic() - started < busy:
        pass
    in_trial_s, cpu_s = time.monotonic() - started, time.process_time() - started_cpu
    with tempfile.TemporaryDirectory(prefix="ursa-") as folder:
        for i, _ in enumerate(specs):
            os.makedirs(os.path.join(folder, str(i)))
            record = {"status": "ok", "error": "", "cpu_s": cpu_s, "train_s": in_trial_s, "worker_pid": os.getpid()}
            with open(os.path.join(folder, str(i), "record.json"), "w") as f:
                json.dump(record, f)
        tune.report({"status": "ok", "cpu_s": cpu_s}, checkpoint=tune.Checkpoint.from_directory(folder))


def trivial_specs(n: int, busy_s: float = 0.0) -> tuple[Any, list[TrialSpec]]:
    """The benchmark grid and ``n`` copies of its one spec, each a trial of its own (one seed, its own id); the
    grid is checked in a child process, as ``ursa-ray run`` checks it: the driver does not import torch."""
    grid = check(dict(GRID))
    base = grid.trial_specs()[0]
    specs = [
        dataclasses.replace(
            base, seed=i, trial_id=f"bench-{i:06d}", vectorize_seeds=1, config={**base.config, "busy_s": busy_s}
        )
        for i in range(n)
    ]
    return grid, specs


def resident_mb() -> float:
    """The driver's resident memory now (``/proc/self/statm``), in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


class Timeline:
    """Per recorded trial: the driver's CPU and wall clock just after its rows were written, and the CPU
    time spent in ``ResultsDirectory.add`` so far (wrapped around the results directory's ``add``;
    ``write=False``: rows are not written at all, to time the rest of the driver alone)."""

    def __init__(self, results: ResultsDirectory, write: bool = True, window: int = 0):
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.add_cpu: list[float] = []
        self.rss_mb: list[float] = []  # the driver's resident memory just after each trial's rows were written
        self._in_add = 0.0
        add = results.add if write else (lambda *args, **kwargs: None)

        def timed_add(*args: Any, **kwargs: Any) -> None:
            before = time.process_time()
            add(*args, **kwargs)
            now = time.process_time()
            self._in_add += now - before
            self.cpu.append(now)
            self.wall.append(time.monotonic())
            self.add_cpu.append(self._in_add)
            self.rss_mb.append(resident_mb())
            if window and len(self.rss_mb) % window == 0:  # as it goes: a run stopped early still says something
                print(f"  trial {len(self.rss_mb)}: resident {self.rss_mb[-1]:.0f} MB", flush=True)

        results.add = timed_add  # type: ignore[method-assign]

    def per_trial(self, first: int, last: int) -> tuple[float, float, float]:
        """(driver CPU s, of it in ``add``, wall s) per trial over trials ``first``..``last`` (1-based)."""
        n = last - first
        cpu = (self.cpu[last - 1] - self.cpu[first - 1]) / n
        add = (self.add_cpu[last - 1] - self.add_cpu[first - 1]) / n
        return cpu, add, (self.wall[last - 1] - self.wall[first - 1]) / n


class Snapshots:
    """Times Tune's experiment-state snapshots (``TuneController.save_to_dir``) and Python's garbage
    collections, and counts the steps of Tune's loop (``TuneController.step``) in this process."""

    def __init__(self) -> None:
        import gc

        from ray.tune.execution.tune_controller import TuneController

        self.seconds: list[float] = []
        self.resident_step_mb: list[float] = []  # the driver's resident memory after each snapshot less before it
        self.steps = 0
        self.gc_s = 0.0
        self._gc_started = 0.0

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                self._gc_started = time.process_time()
            else:
                self.gc_s += time.process_time() - self._gc_started

        gc.callbacks.append(on_gc)
        save, step = TuneController.save_to_dir, TuneController.step

        def timed(controller: Any) -> None:
            before, resident_before = time.process_time(), resident_mb()
            save(controller)
            self.seconds.append(time.process_time() - before)
            self.resident_step_mb.append(resident_mb() - resident_before)
            if self.resident_step_mb[-1] >= 5:
                print(
                    f"  Tune snapshot {len(self.seconds)} with {len(controller.get_trials())} trials: "
                    f"{self.seconds[-1]:.2f} CPU-s, resident memory {resident_before:.0f} -> {resident_mb():.0f} MB",
                    flush=True,
                )

        def counted(controller: Any) -> None:
            self.steps += 1
            step(controller)

        TuneController.save_to_dir = timed  # type: ignore[method-assign]
        TuneController.step = counted  # type: ignore[method-assign]


def run_bench_grid(
    specs: list[dict[str, Any]], grid: Any, out: Path, echo: Any, write: bool = True, window: int = 0
) -> tuple[Timeline, RunSummary, float]:
    """Run ``specs`` through :func:`run_trials` with the trivial trainable; (timeline, summary, seconds from the
    last trial recorded to ``run_trials`` returning)."""
    from ray import cloudpickle

    if trivial_trial.__module__ != "__main__":  # imported: the workers cannot import this script by name
        cloudpickle.register_pickle_by_value(sys.modules[trivial_trial.__module__])
    results = ResultsDirectory(out)
    timeline = Timeline(results, write, window)
    summary = RunSummary()
    real = trials_module.run_ursa_trial
    trials_module.run_ursa_trial = trivial_trial  # run_trials wraps this module's name
    try:
        run_trials(specs, grid, results, f"bench-{time.strftime('%H%M%S')}", summary, echo, Interrupt())
    finally:
        trials_module.run_ursa_trial = real
    return timeline, summary, time.monotonic() - timeline.wall[-1]


def driver_cost(n_trials: int, window: int, echo: Any, write: bool = True) -> dict[str, float]:
    """The driver figure (see the module docstring)."""
    grid, specs = trivial_specs(n_trials)
    snapshots = Snapshots()
    started_cpu, started = time.process_time(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ub", dir="/tmp") as out:
        timeline, summary, tail_s = run_bench_grid(specs, grid, Path(out), echo, write, window)
    wall = time.monotonic() - started
    echo.close()
    recorded = len(timeline.cpu)
    window = min(window, recorded // 4)
    early_end = min(max(1000, 2 * window), recorded - window)  # the window ending at trial ~1,000
    early = timeline.per_trial(early_end - window + 1, early_end)
    late = timeline.per_trial(recorded - window + 1, recorded)
    figures = {
        "trials": recorded,
        "ok": len(summary.finished),
        "early_window_end": early_end,
        "cpu_ms_early": 1e3 * early[0],
        "cpu_ms_late": 1e3 * late[0],
        "ratio": late[0] / early[0],
        "add_ms_early": 1e3 * early[1],
        "add_ms_late": 1e3 * late[1],
        "ratio_without_add": (late[0] - late[1]) / (early[0] - early[1]),
        "wall_ms_early": 1e3 * early[2],
        "wall_ms_late": 1e3 * late[2],
        "trials_per_s": recorded / (timeline.wall[-1] - started),
        "driver_cpu_s": time.process_time() - started_cpu,
        "wall_s": wall,
        "tail_s": tail_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps_per_trial": snapshots.steps / recorded,
        "gc_s": snapshots.gc_s,
        "snapshots": len(snapshots.seconds),
        "snapshot_s_total": sum(snapshots.seconds),
        "snapshot_s_last": snapshots.seconds[-1] if snapshots.seconds else float("nan"),
    }
    print(
        f"driver: {recorded} trivial trials ({figures['ok']} ok) in {wall:.0f} s, {figures['trials_per_s']:.1f} trials/s "
        f"until the last was recorded, then {tail_s:.1f} s to return{'' if write else ' (results not written)'}"
    )
    print(
        f"  driver CPU per trial, trials {early_end - window + 1}-{early_end}: {figures['cpu_ms_early']:.2f} ms "
        f"({figures['add_ms_early']:.2f} ms of it writing results); trials {recorded - window + 1}-{recorded}: "
        f"{figures['cpu_ms_late']:.2f} ms ({figures['add_ms_late']:.2f} ms writing results)"
    )
    print(
        f"  late ÷ early: {figures['ratio']:.2f} (target ≤ 1.5 at trial 20,000 vs 1,000); without writing results: "
        f"{figures['ratio_without_add']:.2f}; wall per trial {figures['wall_ms_early']:.1f} -> {figures['wall_ms_late']:.1f} ms"
    )
    print(
        f"  driver peak RSS {figures['peak_rss_mb']:.0f} MB (torch imported: {'torch' in sys.modules}); driver CPU {figures['driver_cpu_s']:.0f} s in all; Tune "
        f"experiment-state snapshots: {figures['snapshots']}, {figures['snapshot_s_total']:.1f} CPU-s in all, the last "
        f"{figures['snapshot_s_last']:.2f} s, resident memory +{sum(snapshots.resident_step_mb):.0f} MB across "
        f"them; {figures['steps_per_trial']:.1f} Tune steps per trial; garbage "
        f"collection {figures['gc_s']:.1f} CPU-s in all"
    )
    trend = [
        f"{end}: {1e3 * timeline.per_trial(end - window + 1, end)[0]:.1f}"
        for end in range(early_end, recorded + 1, max(window, (recorded - early_end) // 8 or 1))
    ]
    print(f"  driver CPU ms per trial, by window ending at trial: {', '.join(trend)}")
    half = recorded // 2
    slope_kb = 1024 * (timeline.rss_mb[-1] - timeline.rss_mb[half - 1]) / (recorded - half)
    figures["rss_kb_per_trial"] = slope_kb
    rss = [f"{end}: {timeline.rss_mb[end - 1]:.0f}" for end in range(window, recorded + 1, max(window, recorded // 8))]
    print(
        f"  driver resident MB by trial: {', '.join(rss)}; growth {slope_kb:.1f} KB a trial over the second half "
        f"(trials {half}-{recorded}): {slope_kb * 1e5 / 2**20:.2f} GB at 100,000 trials"
    )
    return figures


def synthetic_trial(i: int, n_metrics: int = 30) -> tuple[dict, list[dict]]:
    """A finished trial's trials row and ``n_metrics`` metric rows, as the driver writes them."""
    trial_id = f"trial-{i:06d}"
    record = {
        "trial_id": trial_id, "phase": "final", "cell": "sgd|mlp|digits", "method": "sgd", "method_name": "sgd",
        "model": "mlp", "dataset": "digits", "task": "classification", "decision_task": False, "seed": i,
        "status": "ok", "error": "", "config": "{}", "wall_s": 1.0, "cpu_s": 1.0, "started_at": 0.0, "finished_at": 1.0,
    }  # fmt: skip
    base = {"trial_id": trial_id, "method": "sgd", "model": "mlp", "dataset": "digits", "seed": i, "phase": "final"}
    metrics = [{**base, "eval_set": "test", "metric": f"metric_{k}", "value": 0.1 * k} for k in range(n_metrics)]
    return record, metrics


def results_writing(n_trials: int, window: int = 100) -> None:
    """Adding trial ``n_trials`` vs adding trial 100 through the real ResultsDirectory (target ≤ 1.5×), the
    writing time per trial over each tenth of the run (linear: flat), and one compact at the end."""
    from ursa_ray.results import ResultsDirectory

    with tempfile.TemporaryDirectory(prefix="ub", dir="/tmp") as folder:
        results = ResultsDirectory(folder)
        costs = []
        for i in range(n_trials):
            record, metrics = synthetic_trial(i)
            tick = time.perf_counter()
            results.add(record, metrics)
            costs.append(time.perf_counter() - tick)
        early = statistics.median(costs[50 : 50 + window])  # trials 51-150: around trial 100
        late = statistics.median(costs[-window:])
        print(f"results writing, {n_trials:,} trials with 30 metric rows each (median of {window} adds):")
        print(
            f"  adding trial ~100: {early * 1e3:.2f} ms; adding trial {n_trials:,}: {late * 1e3:.2f} ms; "
            f"ratio {late / early:.2f} (target <= 1.5)"
        )
        tenth = max(1, n_trials // 10)
        per_trial = [sum(costs[k : k + tenth]) / len(costs[k : k + tenth]) * 1e3 for k in range(0, n_trials, tenth)][
            :10
        ]
        print(
            f"  writing ms per trial in each tenth of the run: {' '.join(f'{c:.2f}' for c in per_trial)}; "
            f"last / first {per_trial[-1] / per_trial[0]:.2f} (linear total: ~1)"
        )
        print(f"  total {sum(costs):.1f} s")
        tick = time.perf_counter()
        report = results.compact()
        print(
            f"  compact: {time.perf_counter() - tick:.1f} s, "
            + ", ".join(f"{name} {a:,} -> {b} part files" for name, (a, b) in report.items())
        )


def ray_overhead(n_trials: int, seconds: float, echo: Any) -> dict[str, float]:
    """The overhead figure: grid wall ÷ (Σ in-trial seconds ÷ slots), trials busy for ``seconds`` each."""
    import ray

    grid, specs = trivial_specs(n_trials, busy_s=seconds)
    slots = int(ray.cluster_resources().get("CPU", 1) // grid.resources["cpu"])
    with tempfile.TemporaryDirectory(prefix="ub", dir="/tmp") as out:
        started = time.monotonic()
        timeline, summary, tail_s = run_bench_grid(specs, grid, Path(out), echo)
        wall = time.monotonic() - started
        import pandas as pd

        trials = pd.read_parquet(Path(out) / "trials.parquet")
    echo.close()
    in_trial = float(trials["train_s"].sum())  # the trivial trial's busy seconds
    cpu = float(trials["cpu_s"].sum())
    ratio = wall / (in_trial / slots)
    gaps = statistics.median(trials["wall_s"] - trials["train_s"])
    print(
        f"overhead: {len(trials)} trials of ~{seconds:g} s on {slots} slots: grid wall {wall:.1f} s, Σ in-trial "
        f"{in_trial:.1f} s (CPU {cpu:.1f} s): wall ÷ (Σ in-trial ÷ slots) = {ratio:.3f} (target ≤ 1.15); median "
        f"trial wall (driver's view) - in-trial {gaps:.2f} s; {tail_s:.1f} s from the last trial recorded to return"
    )
    return {"ratio": ratio, "wall_s": wall, "in_trial_s": in_trial, "slots": slots, "tail_s": tail_s}


FIGURES = {
    "writing": lambda args, echo: results_writing(args.writes),
    "driver": lambda args, echo: driver_cost(args.trials, args.window, echo, write=not args.skip_results),
    "overhead": lambda args, echo: ray_overhead(args.overhead_trials, args.overhead_seconds, echo),
}
"""The figures ``--only`` can pick, in the order they run: name -> function of the parsed arguments and the echo."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated figures: {', '.join(FIGURES)}")
    parser.add_argument("--writes", type=int, default=100_000, help="trials of the writing figure (quick: 10000)")
    parser.add_argument("--trials", type=int, default=20000, help="trivial trials of the driver figure (quick: 2000)")
    parser.add_argument("--window", type=int, default=500, help="trials per window of the driver figure")
    parser.add_argument("--overhead-trials", type=int, default=24, help="trials of the overhead figure")
    parser.add_argument("--overhead-seconds", type=float, default=10.0, help="seconds each overhead trial is busy")
    parser.add_argument(
        "--tune-scheduler",
        action="store_true",
        help="Tune's own FIFOScheduler (it scans every trial at every step) instead of ursa-ray's, for comparison",
    )
    parser.add_argument(
        "--skip-results", action="store_true", help="driver figure: do not write results (time the rest of the driver)"
    )
    parser.add_argument("--progress", choices=("auto", "line", "log"), default="auto", help="as ursa-ray run's")
    args = parser.parse_args()
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    if not only or only - set(FIGURES):
        parser.error(f"--only: expected some of {', '.join(FIGURES)}, got {args.only!r}")
    if args.trials < 8:
        parser.error("--trials: at least 8")
    progress = Progress.for_stdout(args.progress)
    quiet = progress.live is None  # log mode: no line per trivial trial
    echo = Progress(lambda line: None) if quiet else progress
    if args.tune_scheduler:
        from ray.tune.schedulers import FIFOScheduler

        trials_module.QueueOrderScheduler = FIFOScheduler  # type: ignore[misc]
    connect(None)
    try:
        for name, figure in FIGURES.items():
            if name in only:
                figure(args, echo)
    finally:
        progress.close()


if __name__ == "__main__":
    main()
