"""The ``ursa-ray`` command: run, validate, report, and list methods, models and datasets.

Exit status: 0 success (every final trial ok; failed search trials are an ordinary outcome of a search); 1 some
final trials failed, or a cell's search left nothing to run; 2 a bad grid, or a results directory that cannot be used (another
grid's, locked by another run, a file, unwritable, or without results for ``report``: nothing was run or written); 130 interrupted
(rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ursa_ray.grid import Grid, GridError, check_data, load_grid
from ursa_ray.registry import Catalogue


def _check_resources(grid: Grid, address: str | None) -> str:
    """``run``'s resource-fit check (:func:`ursa_ray.tune.cluster.check_cluster_fits`) against the Ray cluster
    at ``address`` (else ``RAY_ADDRESS``) when one is reachable; never starts a local Ray.  Returns the line
    to print; GridError when no node of the cluster fits one trial."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        return "resources: not checked: no Ray cluster given (set RAY_ADDRESS or pass --address to check them)"
    from ursa_ray.tune.cluster import check_cluster_fits, connect, describe, grid_requests, unreachable

    reason = unreachable(address)
    if reason is None:
        try:
            connect(address)
        except ConnectionError as exc:  # something answers there, but not a Ray head
            reason = str(exc)
    if reason is not None:
        return f"resources: not checked: no Ray cluster reachable at {address} ({reason})"
    check_cluster_fits(grid)
    requests = [describe(dict(need)) for need in grid_requests(grid)]
    if len(requests) == 1:
        return f"resources: each trial's {requests[0]} fits a node of the Ray cluster at {address}"
    return f"resources: every trial's request ({'; '.join(requests)}) fits a node of the Ray cluster at {address}"


def _cmd_validate(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid)
    check_data(grid)
    grid.check_cells()
    resources = _check_resources(grid, args.address)
    cells = len(grid.cells())
    search = ""
    if grid.search is not None:
        searched = sum(1 for m in grid.methods if m.search_space)
        limit = "until its budget is spent" if grid.search.n_trials is None else f"up to {grid.search.n_trials} trials"
        search = f"; search phase: {grid.search.algorithm}, {limit} per cell for {searched} method(s)"
    print(
        f"{args.grid}: valid: {len(grid.methods)} methods x {len(grid.models)} models x {len(grid.datasets)} datasets "
        f"-> {cells} cells x {len(grid.seeds):,} seeds = {grid.n_final_trials():,} final trials{search}"
    )
    print(resources)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from ursa_ray import api
    from ursa_ray.tune.progress import Progress

    grid = api.check(args.grid)  # in a child process: this one, Tune's driver, never imports torch
    out = args.out or str(Path("results") / grid.name)
    progress = Progress.for_stdout(args.progress)
    try:
        summary = api.run_checked(
            grid, out, address=args.address, echo=progress, allow_grid_change=args.allow_grid_change
        )
    except KeyboardInterrupt:  # a second Ctrl-C: stopped at once (never in the middle of writing a trial's rows)
        progress.close()
        print(
            "aborted: stopped at once; finished trials are kept; run the same command again to resume", file=sys.stderr
        )
        return 130
    finally:
        progress.close()  # the status line ends before the summary lines (and before a GridError's message)
    search_failed = len(summary.search_failed)
    print(
        f"done: {len(summary.finished)} ok, {len(summary.failed)} failed ({search_failed} of them search trials), "
        f"{len(summary.early_stopped)} early-stopped, {summary.skipped} already finished; results in {out}"
    )
    if summary.budget_stopped:
        print(
            f"search budget spent (search complete) in {len(summary.budget_stopped)} cell(s): {', '.join(summary.budget_stopped)}"
        )
    if summary.interrupted or summary.incomplete > 0:
        what = f"{summary.incomplete} trial(s) did not finish" if summary.incomplete > 0 else "the run did not finish"
        if summary.interrupted and summary.planned == 0 and grid.search is not None:
            what += " (stopped in the search phase: the final phase did not start)"
        print(f"interrupted: {what}; run the same command again to resume", file=sys.stderr)
        return 130
    searched = set(summary.search_failed)
    final_failed = [(trial_id, error) for trial_id, error in summary.failed if trial_id not in searched]
    for trial_id, error in final_failed:
        print(f"  FAILED {trial_id}: {error}", file=sys.stderr)
    for cell, why in summary.failed_cells:
        print(f"FAILED cell {cell}: {why}; its final phase was not run", file=sys.stderr)
    if search_failed:  # a diverging configuration is an expected outcome of a search, not a failure of the run
        print(
            f"{search_failed} search trial(s) failed: recorded with their compute, never selected "
            "(a rerun does not count them as done)"
        )
    if final_failed or summary.failed_cells:
        print(
            f"{len(final_failed)} final trial(s) failed, {len(summary.failed_cells)} cell(s) not run", file=sys.stderr
        )
        return 1
    print(f"next: ursa-ray report {shlex.quote(out)}")
    return 0


def _check_tables(results: str) -> None:
    """NotAResultsDirectory when the metrics table of ``results`` is missing (deleted) though trials finished:
    a report would show nothing without a word; a rerun restores it (:meth:`ResultsDirectory.finished_ids`)."""
    from ursa_ray.results import FINISHED, Location, NotAResultsDirectory, ResultsDirectory, is_uri

    directory = ResultsDirectory(Location.parse(results if is_uri(results) else Path(results)))
    if not directory.folder("trials").exists() or directory.folder("metrics").exists():
        return
    trials = directory.read("trials", ["status"])
    finished = int(trials["status"].isin(FINISHED).sum())
    if finished:
        raise NotAResultsDirectory(
            f"{results}: metrics.parquet is missing though {finished} trial(s) finished; run the same "
            f"`ursa-ray run GRID --out {results}` again to restore it (every trial reruns)"
        )


def _cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import write_report
    from ursa_ray.results import DamagedPart, NotAResultsDirectory

    if not 0 < args.alpha < 1:
        print(f"error: --alpha {args.alpha}: must be between 0 and 1 (exclusive), e.g. 0.05", file=sys.stderr)
        return 2
    try:
        _check_tables(args.results)
        text = write_report(args.results, cost=args.cost, alpha=args.alpha)
    except (NotAResultsDirectory, DamagedPart, GridError) as exc:  # GridError: grid.yaml's statistics block
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    from ursa_ray.api import compact
    from ursa_ray.results import DamagedPart, NotAResultsDirectory

    try:
        compact(args.results)
    except (NotAResultsDirectory, DamagedPart) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _listing(catalogue: Catalogue, describe: Callable[[str, Any], list[str]]) -> int:
    """Print every entry of ``catalogue``: ``describe(name, item)`` (a first line, then indented lines) with
    the entry's origin as the first indented line, or ``NAME: BROKEN (origin): why`` for a broken plug-in."""
    for entry in catalogue.entries:
        if entry.problem is not None:
            print(f"{entry.name}: BROKEN ({entry.origin}): {entry.problem}")
            continue
        first, *rest = describe(entry.name, entry.item)
        print(first)
        for line in (f"origin: {entry.origin}", *rest):
            print(f"    {line}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from ursa_ray.methods import catalogue

    def describe(name: str, method: Any) -> list[str]:
        return [
            f"{name}: {method.description}",
            *(h.describe() for h in method.hyperparameters),
            *(f"constraint: {c.rule}" for c in method.constraints),
        ]

    return _listing(catalogue(), describe)


def _cmd_models(args: argparse.Namespace) -> int:
    from ursa_ray.models import catalogue

    def describe(name: str, spec: Any) -> list[str]:
        return [f"{name} ({', '.join(spec.tasks)}): {spec.description}", *(h.describe() for h in spec.options)]

    return _listing(catalogue(), describe)


def _cmd_datasets(args: argparse.Namespace) -> int:
    from ursa_ray.data import catalogue

    def describe(name: str, spec: Any) -> list[str]:
        ood = f"; OOD sets: {', '.join(spec.ood_sets)}" if spec.ood_sets else ""
        return [f"{name} ({spec.task}): {spec.description}{ood}", *(h.describe() for h in spec.options)]

    return _listing(catalogue(), describe)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ursa-ray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a grid on Ray Tune (resumes an earlier run in the same --out)")
    run.add_argument("grid", help="grid YAML file, e.g. grids/quickstart.yaml")
    run.add_argument(
        "--out", help="results directory or object-store URI, e.g. s3://bucket/prefix (default results/<grid name>)"
    )
    run.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    run.add_argument(
        "--allow-grid-change",
        action="store_true",
        help="add a changed grid's trials to a results directory another grid wrote (every grid version is kept "
        "in DIR/grid-versions/)",
    )
    run.add_argument(
        "--progress",
        choices=("auto", "line", "log"),
        default="auto",
        help="how progress is shown: 'line', one status line rewritten in place (done, failed, running and "
        "pending trials, elapsed time, estimated time left), with failures and retries printed above it; 'log', "
        "one line per finished trial (for logs and CI); 'auto' (default): line when stdout is a terminal, else log",
    )
    run.set_defaults(func=_cmd_run)
    validate = sub.add_parser("validate", help="check a grid without running anything")
    validate.add_argument("grid")
    validate.add_argument(
        "--address",
        help="Ray cluster whose nodes must fit one trial's resources (default: RAY_ADDRESS; "
        "without either, resources are not checked and no Ray is started)",
    )
    validate.set_defaults(func=_cmd_validate)
    report = sub.add_parser("report", help="print the composite table and write DIR/report.md")
    report.add_argument("results", help="results directory or object-store URI (as given to run --out)")
    report.add_argument("--cost", action="store_true", help="print the search + inference cost report too")
    report.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="level of every test, 1 - alpha of every interval (default 0.05; docs/statistics.md)",
    )
    report.set_defaults(func=_cmd_report)
    compact = sub.add_parser(
        "compact", help="merge a results directory's part files into a few large ones (readers see the same tables)"
    )
    compact.add_argument("results", help="results directory (as given to run --out)")
    compact.set_defaults(func=_cmd_compact)
    for name, func, text in (
        ("methods", _cmd_methods, "list inference methods and their hyperparameters"),
        ("models", _cmd_models, "list models and their options"),
        ("datasets", _cmd_datasets, "list datasets and their OOD sets"),
    ):
        sub.add_parser(name, help=text).set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
