"""The driver: runs a validated grid on Ray Tune (its search phase, if any, then its final phase) and writes each
finished trial into the results directory.

:func:`run_grid` orchestrates the two phases: :mod:`ursa_ray.tune.search` runs the search phase and
:mod:`ursa_ray.tune.trials` holds the trial-running machinery both phases use (:func:`~ursa_ray.tune.trials.run_trials`;
the results callback, Ctrl-C handling and the cluster checks in the modules beside it).  Imports go one way: runner -> search -> trials; neither of those
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
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.callback import RunSummary
from ursa_ray.tune.cluster import check_cluster_fits, connect, describe
from ursa_ray.tune.interrupt import Interrupt
from ursa_ray.tune.progress import Echo
from ursa_ray.tune.search import run_search_phase
from ursa_ray.tune.trainable import request
from ursa_ray.tune.trials import run_trials

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
        specs = [s for s in grid.trial_specs("final", overrides) if s.cell not in not_run]
        done = results.finished_ids()
        todo = [s for s in specs if s.trial_id not in done]
        summary.planned += len(specs)
        summary.skipped += len(specs) - len(todo)
        cluster = ray.cluster_resources()
        echo(
            f"final phase: {len(specs)} trials ({len(specs) - len(todo)} already finished) with {_requests(specs, grid)} "
            f"on Ray ({cluster.get('CPU', 0):g} CPUs, {cluster.get('GPU', 0):g} GPUs) -> {out}"
        )
        if todo:
            run_trials(todo, grid, results, f"final-{stamp}", summary, echo, interrupt)
        summary.interrupted = interrupt.is_set()
        return summary


def _requests(specs: list[TrialSpec], grid: Grid) -> str:
    """The final trials' resources for the phase's banner: ``CPU=1 each`` when they all ask for the same, else
    each distinct request with its trials' methods and models (the first few), e.g. ``per-trial resources
    (2 distinct requests: CPU=1, GPU=0.1 for sgd/mlp, mc_dropout/mlp; CPU=4, GPU=1 for sgd/resnet50)``."""
    pairs: dict[str, list[str]] = {}
    for spec in specs:
        who = pairs.setdefault(describe(request(spec.resources)), [])
        if f"{spec.label}/{spec.model}" not in who:
            who.append(f"{spec.label}/{spec.model}")
    if len(pairs) <= 1:
        return f"{next(iter(pairs), describe(request(grid.resources)))} each"
    shown = []
    for need, who in list(pairs.items())[:4]:
        more = f" and {len(who) - 3} more" if len(who) > 3 else ""
        shown.append(f"{need} for {', '.join(who[:3])}{more}")
    if len(pairs) > 4:
        shown.append(f"{len(pairs) - 4} more")
    return f"per-trial resources ({len(pairs)} distinct requests: {'; '.join(shown)})"
