"""The driver: runs a validated grid on Ray Tune (its search phase, if any, then its final phase) and writes each
finished trial into the results directory.

:func:`run_grid` orchestrates the two phases: :mod:`ursa_ray.tune.search` runs the search phase and
:mod:`ursa_ray.tune.trials` holds the trial-running machinery both phases use (:func:`~ursa_ray.tune.trials.run_trials`,
the results callback, Ctrl-C handling).  Imports go one way: runner -> search -> trials; neither of those
imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from ursa_ray.grid import Grid
from ursa_ray.results import Location, ResultsDirectory
from ursa_ray.tune.search import run_search_phase
from ursa_ray.tune.trials import (
    Echo,
    Interrupt,
    RunSummary,
    check_cluster_fits,
    connect,
    run_trials,
    trial_resources,
)

__all__ = ["run_grid"]


def run_grid(
    grid: Grid,
    out_dir: str | Path | Location,
    address: str | None = None,
    echo: Echo = print,
    keep_grid: Callable[[Location], None] | None = None,
) -> RunSummary:
    """Run the grid's search phase (if any) and final phase; resume what an earlier run left unfinished.

    Ctrl-C stops the run where it is (``summary.interrupted``): no later search cell and no final phase
    starts.  A cell whose search left nothing to select (every search trial failed) has no final trials.

    ``out_dir``: a local folder or an object-store URI (``s3://bucket/prefix``; see :class:`Location`).
    ``keep_grid(out)`` saves the grid beside the results once the cluster is known to fit (default: ``grid.yaml``;
    :func:`ursa_ray.api.run` also records its fingerprint and versions, :func:`ursa_ray.guard.record_grid`)."""
    interrupt = Interrupt()
    with interrupt.catching():
        connect(address)
        check_cluster_fits(grid)
        out = Location.parse(out_dir)
        results = ResultsDirectory(out)
        if keep_grid is not None:
            keep_grid(out)
        else:
            (out / "grid.yaml").write_text(grid.source)
        summary = RunSummary()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        overrides: dict[str, dict[str, Any]] = {}
        if grid.search is not None:
            overrides = run_search_phase(grid, results, summary, echo, stamp, interrupt)
        if interrupt.is_set():
            summary.interrupted = True
            return summary
        not_run = {cell for cell, _ in summary.failed_cells}
        specs = [s for s in grid.trial_specs("final", overrides) if s["cell"] not in not_run]
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
            run_trials(todo, grid, results, f"final-{stamp}", summary, echo, interrupt)
        summary.interrupted = interrupt.is_set()
        return summary
