"""Whether two results directories of the same grid hold the same results: a refactoring's behaviour check
(issue 46: the quickstart before and after, each run from its own code).

    PYTHONPATH=/work/main ursa-ray run grids/quickstart.yaml --out /tmp/q_before
    PYTHONPATH=.          ursa-ray run grids/quickstart.yaml --out /tmp/q_after
    python benchmarks/compare_runs.py /tmp/q_before /tmp/q_after

Compares the trial ids, trials.parquet's columns except those that time or place a trial (:data:`TIMING_COLUMNS`,
and in ``method_stats`` its durations, the keys ending in ``_s``), metrics.parquet's rows except the timed metrics
(:data:`TIMED_METRICS`), points.parquet and, with ``--predictions``, each saved prediction table, value for value.
Prints one line per table and exits 1 when any differs.  Run it on two runs
of the same code first: what differs there is not deterministic and is named with ``--ignore-metric`` or
``--ignore-column`` (and why) before comparing two codes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

TIMING_COLUMNS = (
    "wall_s",
    "cpu_s",
    "gpu_s",
    "reserved_cpu_s",
    "reserved_gpu_s",
    "worker_setup_s",
    "setup_s",
    "train_s",
    "eval_s",
    "bit_depth_eval_s",
    "attack_s",
    "started_at",
    "finished_at",
    "node",
    "node_id",
    "worker_pid",
)
"""trials.parquet's columns that time a trial or say where it ran: they differ between any two runs."""
TIMED_METRICS = ("cpu_s", "eval_s", "setup_s", "train_s", "predict_s_per_example", "s_per_sample")
"""metrics.parquet's metrics that are durations (the cost rows)."""
METRIC_KEYS = ["trial_id", "phase", "eval_set", "eval_kind", "metric"]


def _untimed_stats(text: str | None) -> str | None:
    """A trial's ``method_stats`` (JSON) without its durations, the keys ending in ``_s`` (``temperature_fit_s``)."""
    if text is None:
        return None
    return json.dumps({k: v for k, v in json.loads(text).items() if not k.endswith("_s")}, sort_keys=True)


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


def _same(name: str, before: pd.DataFrame, after: pd.DataFrame) -> bool:
    """Whether two frames are equal (NaN equal to NaN, dtypes too); prints the first differing column."""
    if list(before.columns) != list(after.columns) or len(before) != len(after):
        print(f"{name}: DIFFERENT shape or columns: {before.shape} {list(before.columns)} vs {after.shape}")
        return False
    for column in before.columns:
        try:
            pd.testing.assert_series_equal(before[column], after[column], check_exact=True)
        except AssertionError as exc:
            print(f"{name}: DIFFERENT in column {column!r}: {str(exc).splitlines()[0]}")
            return False
    print(f"{name}: identical ({len(before):,} rows, {len(before.columns)} columns)")
    return True


def compare_trials(before: Path, after: Path, ignore: tuple[str, ...]) -> bool:
    a, b = (pd.read_parquet(d / "trials.parquet") for d in (before, after))
    ids_same = sorted(a["trial_id"]) == sorted(b["trial_id"])
    print(f"trial ids: {'identical' if ids_same else 'DIFFERENT'} ({len(a)} and {len(b)} trials)")
    drop = [c for c in (*TIMING_COLUMNS, *ignore) if c in a.columns]
    keep = [c for c in a.columns if c not in drop]
    a, b = (f.assign(method_stats=f["method_stats"].map(_untimed_stats)) for f in (a, b))
    return ids_same and _same(
        "trials.parquet (non-timing columns)", _sorted(a[keep], ["trial_id"]), _sorted(b[keep], ["trial_id"])
    )


def compare_metrics(before: Path, after: Path, ignore: tuple[str, ...]) -> bool:
    a, b = (pd.read_parquet(d / "metrics.parquet") for d in (before, after))
    a, b = (f[~f["metric"].isin((*TIMED_METRICS, *ignore))] for f in (a, b))
    return _same("metrics.parquet (untimed metrics)", _sorted(a, METRIC_KEYS), _sorted(b, METRIC_KEYS))


def compare_points(before: Path, after: Path) -> bool:
    a, b = (pd.read_parquet(d / "points.parquet") for d in (before, after))
    keys = ["trial_id", "experiment", "point_id"]
    return _same("points.parquet", _sorted(a, keys), _sorted(b, keys))


def compare_predictions(before: Path, after: Path) -> bool:
    names = sorted(p.name for p in (before / "predictions").glob("*.parquet"))
    if names != sorted(p.name for p in (after / "predictions").glob("*.parquet")):
        print("predictions/: DIFFERENT file names")
        return False
    differ = [
        n
        for n in names
        if not pd.read_parquet(before / "predictions" / n).equals(pd.read_parquet(after / "predictions" / n))
    ]
    print(
        f"predictions/: {len(names) - len(differ)} of {len(names)} tables identical"
        + (f"; differ: {differ[:5]}" if differ else "")
    )
    return not differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--ignore-metric", action="append", default=[], help="a metric that differs between two runs of one code"
    )
    parser.add_argument("--ignore-column", action="append", default=[], help="a trials.parquet column that does")
    parser.add_argument("--predictions", action="store_true", help="also compare each saved prediction table")
    args = parser.parse_args(argv)
    same = [
        compare_trials(args.before, args.after, tuple(args.ignore_column)),
        compare_metrics(args.before, args.after, tuple(args.ignore_metric)),
        compare_points(args.before, args.after),
    ]
    if args.predictions:
        same.append(compare_predictions(args.before, args.after))
    print("SAME" if all(same) else "DIFFERENT")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
