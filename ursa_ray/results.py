"""The results directory: Parquet tables written atomically, keyed by trial_id so nothing is duplicated.

Layout (a contract for users and for the ``analysis`` package):

- ``trials.parquet``: one row per trial (both phases), see :data:`TRIAL_COLUMNS`;
- ``metrics.parquet``: long format, one row per (trial, evaluation set, metric);
- ``points.parquet``: regression trials only, one row per (trial, test point), the anchor as method "blr";
  a Parquet dataset folder with one part file per trial id (``points.parquet/<trial_id>.parquet``), so a
  finished trial writes only its own rows however large the table grows; ``pandas.read_parquet`` reads the
  folder as one table;
- ``predictions/<trial_id>__<eval_set>.parquet``: posterior-predictive probabilities when the grid sets
  ``save_predictions: true``;
- ``transfer/<trial_id>.pt``: the adversarial examples a transfer source (the SGD trial of a model, dataset
  and seed) crafted, which the other trials of that model, dataset and seed are scored on;
- ``grid.yaml``: the grid that produced the results (``grid.json``: its fingerprint, ``grid-versions/``: every
  version run in this directory, see :mod:`ursa_ray.guard`); ``ray/``: Ray Tune's own experiment folders;
  ``.lock``: held by the run in progress.

Where the directory lives (:class:`Location`): a local path, or any URI that
``pyarrow.fs.FileSystem.from_uri`` accepts, such as ``s3://bucket/prefix`` (a custom endpoint and other
filesystem options go in the URI's query: ``s3://bucket/prefix?endpoint_override=host:9000&scheme=http``).

Writes are atomic for readers, so a reader never sees half a file and an interrupted run leaves the previous
complete version:

- local paths (plain paths and ``file://`` URIs): every file is written to a temporary name in the same
  directory and renamed into place;
- object stores (``s3://``, ``gs://``, ...): each file is serialised in memory first, then written with one
  ``open_output_stream`` straight to its final key. An object store makes an object visible only when its
  upload completes (one PUT, or the completion of a multipart upload), and an overwrite replaces the whole
  object, so readers see the previous object or the new one, never part of one. Nothing is renamed: object
  stores have no atomic rename.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.fs as pafs

TRIAL_COLUMNS = [
    "trial_id", "phase", "cell", "method", "method_name", "model", "dataset", "task", "decision_task",
    "complexity", "seed", "status", "error", "config", "wall_s", "cpu_s", "gpu_s", "reserved_cpu_s", "reserved_gpu_s",
    "n_cpus", "n_gpus", "node", "node_id", "worker_pid", "device", "n_samples", "worker_setup_s", "setup_s", "train_s",
    "eval_s", "bit_depth_eval_s", "n_params", "grad_evals", "accept_rate", "method_stats", "selection",
    "transfer_from", "started_at", "finished_at",
]
METRIC_COLUMNS = ["trial_id", "method", "model", "dataset", "seed", "phase", "eval_set", "metric", "value"]
POINT_COLUMNS = [
    "trial_id", "method", "model", "experiment", "complexity", "repetition", "point_id", "x", "in_distribution",
    "truth", "mean", "std",
]
TABLES = {"trials": TRIAL_COLUMNS, "metrics": METRIC_COLUMNS, "points": POINT_COLUMNS}
REWRITTEN = ("trials", "metrics")  # rewritten whole per trial; points are written per trial


class NotAResultsDirectory(FileNotFoundError):
    """A folder (or URI) without ``trials.parquet``: not the results of an ``ursa-ray run``."""


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


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # a scheme of two or more letters: not a Windows drive


def is_uri(location: str | Path) -> bool:
    return isinstance(location, str) and bool(_URI.match(location))


@dataclass(frozen=True)
class Location:
    """A file or folder on a pyarrow filesystem: ``fs`` and the ``path`` on it; ``uri`` is how to name it again
    (an absolute local path, or the URI with its query, e.g. ``s3://bucket/prefix/trials.parquet?endpoint_override=...``)."""

    fs: pafs.FileSystem
    path: str
    uri: str

    @classmethod
    def parse(cls, location: str | Path | Location) -> Location:
        """A local path (made absolute), or a URI that ``pyarrow.fs.FileSystem.from_uri`` accepts."""
        if isinstance(location, Location):
            return location
        if is_uri(location):
            fs, path = pafs.FileSystem.from_uri(str(location))
            if isinstance(fs, pafs.LocalFileSystem):  # file:///abs/path: a plain local path
                return cls.parse(Path(path))
            return cls(fs, path.rstrip("/"), str(location))
        path = Path(location).resolve()
        return cls(pafs.LocalFileSystem(), str(path), str(path))

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.uri} is not on the local filesystem")
        return Path(self.path)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def __truediv__(self, name: str) -> Location:
        path = f"{self.path.rstrip('/')}/{name}"
        if self.is_local:
            return Location(self.fs, str(Path(self.path) / name), str(Path(self.uri) / name))
        base, query, rest = self.uri.partition("?")
        return Location(self.fs, path, f"{base.rstrip('/')}/{name}{query}{rest}")

    def __str__(self) -> str:
        return self.uri

    def exists(self) -> bool:
        if self.is_local:
            return self.local_path.exists()
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def read_parquet(self) -> pd.DataFrame:
        """A Parquet file, or a folder of Parquet part files read as one table."""
        if self.is_local:
            return pd.read_parquet(self.local_path)
        return pd.read_parquet(self.path, filesystem=self.fs)

    def read_bytes(self) -> bytes:
        if self.is_local:
            return self.local_path.read_bytes()
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        if self.is_local:
            return self.local_path.read_text()
        with self.fs.open_input_stream(self.path) as f:
            return f.read().decode()

    def write_bytes(self, data: bytes) -> None:
        """Atomically for readers (see the module docstring)."""
        if self.is_local:
            write_atomic(self.local_path, lambda tmp: Path(tmp).write_bytes(data))
            return
        with self.fs.open_output_stream(self.path) as f:  # one upload to the final key, visible once complete
            f.write(data)

    def write_text(self, text: str) -> None:
        if self.is_local:
            write_atomic(self.local_path, lambda tmp: Path(tmp).write_text(text))
        else:
            self.write_bytes(text.encode())

    def write_parquet(self, frame: pd.DataFrame) -> None:
        if self.is_local:
            write_atomic(self.local_path, lambda tmp: frame.to_parquet(tmp, index=False))
            return
        buffer = io.BytesIO()  # serialised in full before the upload starts: a failure uploads nothing
        frame.to_parquet(buffer, index=False)
        self.write_bytes(buffer.getvalue())


def transfer_examples_location(results_uri: str, trial_id: str) -> Location:
    """``transfer/<trial_id>.pt`` in the results directory named by ``results_uri``: the adversarial examples
    the transfer source ``trial_id`` crafted."""
    return Location.parse(results_uri) / "transfer" / f"{trial_id}.pt"


class ResultsDirectory:
    """Reads and extends one results directory: a local path or an object-store URI (see :class:`Location`)."""

    def __init__(self, path: str | Path | Location):
        self.location = Location.parse(path)
        self.tables = {name: self._read(name) for name in REWRITTEN}

    def _read(self, name: str) -> pd.DataFrame:
        file = self.location / f"{name}.parquet"
        if file.exists():
            return file.read_parquet()
        return pd.DataFrame(columns=TABLES[name])

    def finished_ids(self) -> set[str]:
        """Trials with status ok or early_stopped: a resumed run does not rerun them."""
        trials = self.tables["trials"]
        if trials.empty:
            return set()
        return set(trials.loc[trials["status"].isin(["ok", "early_stopped"]), "trial_id"])

    def transfer_examples(self, trial_id: str) -> Location:
        """Where a transfer source trial's crafted adversarial examples are kept: ``transfer/<trial_id>.pt``."""
        return transfer_examples_location(self.location.uri, trial_id)

    def add(
        self,
        record: dict[str, Any],
        metrics: Iterable[dict[str, Any]] = (),
        points: Iterable[dict[str, Any]] = (),
        predictions: dict[str, pd.DataFrame] | None = None,
    ) -> None:
        """Add (or replace) one trial's rows: rewrite trials and metrics atomically, and write each trial id's
        point rows (the anchor's have their own id) as its own part of ``points.parquet``."""
        trial_id = record["trial_id"]
        for part_id, rows in pd.DataFrame(list(points), columns=POINT_COLUMNS).groupby("trial_id", sort=False):
            (self.location / "points.parquet" / f"{part_id}.parquet").write_parquet(rows)
        for name, rows in (("trials", [record]), ("metrics", list(metrics))):
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
            (self.location / f"{name}.parquet").write_parquet(self.tables[name])
        for eval_set, frame in (predictions or {}).items():
            (self.location / "predictions" / f"{trial_id}__{eval_set}.parquet").write_parquet(frame)
