"""The Python API: run a grid and load its results from a notebook or a script.

    import ursa_ray

    summary = ursa_ray.run("grids/quickstart.yaml", out="results/quickstart")   # or a dict, or a Grid
    results = ursa_ray.load("results/quickstart")
    results.composites                       # one row per method: composite scores, intervals and ranks
    results.compare(principle="uncertainty") # paired tests, Friedman/Nemenyi, resolution (pandas frames)
    results.metrics.query("eval_set == 'test'")

``ursa-ray run`` and ``ursa-ray report`` are thin layers over :func:`run` and :func:`load` (plus printing),
so both give the same tables for the same grid.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ursa_ray.grid import Grid, GridError, check_data, load_grid, parse_grid
from ursa_ray.results import Location, ResultsDirectory


def as_grid(grid: str | Path | Mapping[str, Any] | Grid) -> Grid:
    """A validated :class:`Grid` from a grid file's path, a mapping shaped like a grid file, or a Grid.
    Raises :class:`GridError` (one line naming the field) on a bad grid."""
    if isinstance(grid, Grid):
        return grid
    if isinstance(grid, (str, Path)):
        return load_grid(grid)
    if isinstance(grid, Mapping):
        return parse_grid(dict(grid), "<grid dict>")
    raise TypeError(f"grid: expected a path, a mapping or a Grid, got {type(grid).__name__}")


def results_location(grid: Grid, out: str | Path | Location | None) -> Location:
    """Where ``grid``'s results go: ``out`` (a local folder or an object-store URI), else ``results/<grid name>``."""
    given = out if out is not None else Path("results") / grid.name
    try:
        return Location.parse(given)  # a local folder, or an object-store URI (pyarrow.fs.FileSystem.from_uri)
    except (ValueError, OSError) as exc:
        raise GridError(f"--out {given}: {exc}") from exc


def check(grid: str | Path | Mapping[str, Any] | Grid) -> Grid:
    """``grid`` (see :func:`as_grid`) checked as :func:`run` checks it before any trial: the grid, its data files
    (:func:`check_data`) and every trial's hyperparameters (its final specs, built here and kept with the grid);
    :class:`GridError` otherwise.

    Where the platform forks and this process has not imported torch (``ursa-ray run``), it runs in a
    short-lived forked child process, which imports the method, model and dataset registries, and with them
    torch; this process gets the checked grid back and never imports torch: a run's Tune driver stays ~480 MB
    smaller (docs/performance.md, "Driver memory per trial")."""
    if "fork" not in multiprocessing.get_all_start_methods() or "torch" in sys.modules:
        # nothing to save where torch is already imported, and forking a process whose torch thread pools ran
        # deadlocks the child in its first parallel torch operation (a test session, a notebook)
        return _checked(grid)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as child:
        return child.submit(_checked, grid).result()


def _checked(grid: str | Path | Mapping[str, Any] | Grid) -> Grid:
    grid = as_grid(grid)
    check_data(grid)
    grid.trial_specs()  # every hyperparameter resolves before anything starts
    return grid


def run(
    grid: str | Path | Mapping[str, Any] | Grid,
    out: str | Path | Location | None = None,
    address: str | None = None,
    echo: Callable[[str], None] = print,
    allow_grid_change: bool = False,
) -> Any:
    """Run ``grid`` on Ray Tune and return its :class:`~ursa_ray.tune.callback.RunSummary`.

    Everything that can be checked is checked before any trial starts (the grid, its data files, every
    trial's hyperparameters, the results location; :class:`GridError` otherwise).  ``out`` defaults to
    ``results/<grid name>``; running again with the same ``out`` resumes.  ``address``: a Ray cluster
    (default ``RAY_ADDRESS``, else a local Ray).  ``echo`` receives the progress lines.

    A results directory belongs to one grid and one run at a time (:mod:`ursa_ray.guard`): ``out`` written by
    a different grid is refused unless ``allow_grid_change`` (every version of the grid is then kept), and
    ``out`` is locked while the run lasts (local directories; another run on it is refused).  Both are
    checked, like a file or an unwritable place given as ``out``, before Ray starts (:class:`GridError`).
    """
    return run_checked(check(grid), out, address, echo, allow_grid_change)


def run_checked(
    grid: Grid,
    out: str | Path | Location | None = None,
    address: str | None = None,
    echo: Callable[[str], None] = print,
    allow_grid_change: bool = False,
) -> Any:
    """:func:`run` for a grid :func:`check` returned (``ursa-ray run`` checks it first, to name its results)."""
    from ursa_ray.guard import check_grid, check_out_location, record_grid, results_lock

    where = results_location(grid, out)
    check_out_location(where)
    _check_address(address)
    fingerprint = check_grid(where, grid, allow_grid_change)  # a quick refusal before the lock is taken
    with results_lock(where, echo):
        check_grid(where, grid, allow_grid_change)  # again, now that no other run can change it
        _remove_damaged_parts(where, echo)
        from ursa_ray.tune.runner import run_grid  # imports Ray: only when something runs

        summary = run_grid(
            grid, where, address=address, echo=echo, keep_grid=lambda at: record_grid(at, grid, fingerprint)
        )
        _compact(where, echo)
        return summary


def _remove_damaged_parts(where: Location, echo: Callable[[str], None]) -> None:
    """Before Ray starts: remove every trial whose own part file is damaged (truncated, say), so that this run
    reruns it; GridError (one line, nothing changed) when a damaged part holds several trials' rows."""
    from ursa_ray.guard import ResultsDirError

    results = ResultsDirectory(where)
    damaged = results.damaged_parts()
    shared = [part for part in damaged if part.trial_id is None]
    if shared:
        raise ResultsDirError(str(shared[0]))
    for part in damaged:
        results.remove_trial(part.trial_id)
        echo(f"{part.part}: damaged ({part.why}): removed with the rest of trial {part.trial_id}'s rows; it is rerun")


def _check_address(address: str | None) -> None:
    """GridError (one line, before anything is written) when ``address`` (else ``RAY_ADDRESS``) names a Ray cluster
    whose head does not answer within 3 s: ``ray.init`` would retry it for minutes."""
    import os

    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        return
    from ursa_ray.tune.cluster import unreachable  # imports Ray: only when a cluster is named

    reason = unreachable(address)
    if reason is not None:
        raise GridError(
            f"--address {address}: no Ray cluster answers there ({reason}); start one (`ray start --head`), "
            "or leave out --address and RAY_ADDRESS for a local Ray"
        )


def compact(out: str | Path | Location, echo: Callable[[str], None] = print) -> dict[str, tuple[int, int]]:
    """Merge the part files of the results directory ``out`` into a few large ones
    (:meth:`~ursa_ray.results.ResultsDirectory.compact`), holding its lock; every reader sees the same tables
    before and after.  :class:`~ursa_ray.results.NotAResultsDirectory` when ``out`` has no results."""
    from ursa_ray.guard import results_lock
    from ursa_ray.results import NotAResultsDirectory

    where = Location.parse(out)
    if not (where / "trials.parquet").exists():
        raise NotAResultsDirectory(f"{out}: no trials.parquet; is this an ursa-ray results directory?")
    with results_lock(where, echo):
        return _compact(where, echo)


def _compact(where: Location, echo: Callable[[str], None]) -> dict[str, tuple[int, int]]:
    report = ResultsDirectory(where).compact()
    merged = {name: parts for name, parts in report.items() if parts[0] != parts[1]}
    if merged:
        echo(f"compacted {where}: " + ", ".join(f"{name} {a} -> {b} part files" for name, (a, b) in merged.items()))
    return report


@dataclass(frozen=True)
class BenchmarkResults:
    """The tables of a results directory (see :mod:`ursa_ray.results` for their columns) and the composite
    table the report prints first (:func:`analysis.composites.composite_scores`: composites with their 95%
    intervals and ranks; empty without classification test metrics)."""

    trials: pd.DataFrame
    metrics: pd.DataFrame
    points: pd.DataFrame
    composites: pd.DataFrame
    interval: str = "t"
    """The per-cell interval the results' grid asks for (``statistics.interval`` of its grid.yaml), which
    ``composites`` and :meth:`compare` use unless told otherwise, as the report does."""

    def compare(self, principle: str | None = None, alpha: float = 0.05, interval: str | None = None) -> Any:
        """The statistical comparison behind the report (:class:`analysis.statistics.Comparison`: ``cells``,
        ``composites``, ``pairs``, ``friedman``, ``ranks``, ``resolution`` as pandas frames) for one
        ``principle`` (``accuracy``, ``uncertainty``, ``ood``, ``decision``, ``robustness``, ``test_time``) or
        all; ``alpha``: level of the tests, 1 − alpha of the intervals; ``interval``: ``t`` or ``bootstrap``
        (default: the grid's, :attr:`interval`).  docs/statistics.md explains each table."""
        from analysis.statistics import compare

        chosen = self.interval if interval is None else interval
        return compare(self.metrics, self.trials, principle=principle, alpha=alpha, interval=chosen)


def load(out: str | Path | Location) -> BenchmarkResults:
    """The results of a run: ``out`` as given to :func:`run` (a local folder or an object-store URI), with the
    interval its grid asks for (``statistics``; :class:`~ursa_ray.grid.GridError` if its grid.yaml's block is
    bad)."""
    from analysis.composites import composite_scores
    from analysis.report import recorded_interval
    from analysis.tables import load_results

    tables = load_results(out)
    interval = recorded_interval(Location.parse(out))
    has_test = not tables.metrics.empty and (tables.metrics["eval_set"] == "test").any()
    composites = composite_scores(tables.metrics, tables.trials, interval=interval) if has_test else pd.DataFrame()
    return BenchmarkResults(tables.trials, tables.metrics, tables.points, composites, interval)
