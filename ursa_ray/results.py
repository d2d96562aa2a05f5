"""The results directory: Parquet tables written atomically, keyed by trial_id so nothing is duplicated.

Layout (a contract for users and for the ``analysis`` package):

- ``trials.parquet``: one row per trial (both phases), see :data:`TRIAL_COLUMNS`;
- ``metrics.parquet``: long format, one row per (trial, evaluation set, metric);
- ``points.parquet``: regression trials only, one row per (trial, test point), the anchor as method "blr";
- ``predictions/<trial_id>__<eval_set>.parquet``: posterior-predictive probabilities when the grid sets
  ``save_predictions: true``;
- ``grid.yaml``: the grid that produced the results; ``ray/``: Ray Tune's own experiment folders.

Every file is written to a temporary name in the same directory and renamed into place, so a reader
never sees half a file and an interrupted run leaves the previous complete version.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

TRIAL_COLUMNS = [
    "trial_id", "phase", "cell", "method", "method_name", "model", "dataset", "task", "complexity", "seed",
    "status", "error", "config", "wall_s", "cpu_s", "gpu_s", "reserved_cpu_s", "reserved_gpu_s",
    "n_cpus", "n_gpus", "node", "node_id", "device", "n_samples", "setup_s", "train_s", "eval_s", "n_params",
    "grad_evals", "accept_rate", "method_stats", "selection", "started_at", "finished_at",
]
METRIC_COLUMNS = ["trial_id", "method", "model", "dataset", "seed", "phase", "eval_set", "metric", "value"]
POINT_COLUMNS = [
    "trial_id", "method", "experiment", "complexity", "repetition", "point_id", "x", "in_distribution",
    "truth", "mean", "std",
]
TABLES = {"trials": TRIAL_COLUMNS, "metrics": METRIC_COLUMNS, "points": POINT_COLUMNS}


def write_atomic(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))


class ResultsDirectory:
    """Reads and extends one results directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.tables = {name: self._read(name) for name in TABLES}

    def _read(self, name: str) -> pd.DataFrame:
        file = self.path / f"{name}.parquet"
        if file.exists():
            return pd.read_parquet(file)
        return pd.DataFrame(columns=TABLES[name])

    def finished_ids(self) -> set[str]:
        """Trials with status ok or early_stopped: a resumed run does not rerun them."""
        trials = self.tables["trials"]
        if trials.empty:
            return set()
        return set(trials.loc[trials["status"].isin(["ok", "early_stopped"]), "trial_id"])

    def add(
        self,
        record: dict[str, Any],
        metrics: Iterable[dict[str, Any]] = (),
        points: Iterable[dict[str, Any]] = (),
        predictions: dict[str, pd.DataFrame] | None = None,
    ) -> None:
        """Add (or replace) one trial's rows and rewrite the affected tables atomically."""
        trial_id = record["trial_id"]
        for name, rows in (("trials", [record]), ("metrics", list(metrics)), ("points", list(points))):
            if name != "trials" and not rows and self.tables[name].empty:
                continue
            table = self.tables[name]
            ids = {trial_id} | {row["trial_id"] for row in rows}
            keep = table[~table["trial_id"].isin(ids)] if not table.empty else table
            new = pd.DataFrame(rows, columns=TABLES[name] if name != "trials" else None)
            if name == "trials":
                new = new.reindex(columns=list(dict.fromkeys(TRIAL_COLUMNS + list(new.columns))))
            frames = [f for f in (keep, new) if not f.empty]
            self.tables[name] = pd.concat(frames, ignore_index=True) if frames else new
            write_parquet(self.tables[name], self.path / f"{name}.parquet")
        for eval_set, frame in (predictions or {}).items():
            write_parquet(frame, self.path / "predictions" / f"{trial_id}__{eval_set}.parquet")
