"""The results directory: Parquet tables written atomically, keyed by trial_id so nothing is duplicated.

Layout (a contract for users and for the ``analysis`` package).  Each table is a Parquet dataset folder that
pandas (``pd.read_parquet(DIR / "trials.parquet")``), pyarrow (``pyarrow.dataset.dataset``), DuckDB
(``read_parquet('DIR/trials.parquet/*.parquet')``) and polars (``pl.read_parquet("DIR/trials.parquet")``)
read as one table:

- ``trials.parquet/``: one row per trial (both phases), see :data:`TRIAL_SCHEMA`;
- ``metrics.parquet/``: long format, one row per (trial, evaluation set, metric);
- ``points.parquet/``: regression trials only, one row per (trial, test point), the anchor as method "blr";
- ``predictions/<trial_id>__<eval_set>.parquet``: posterior-predictive probabilities when the grid sets
  ``save_predictions: true`` (a reference trial's: its pooled predictive on the test and OOD sets);
- ``transfer/<trial_id>.pt``: the adversarial examples a transfer source (the SGD trial of a model, dataset
  and seed) crafted, which the other trials of that model, dataset and seed are scored on;
- ``grid.yaml``: the grid that produced the results (``grid.json``: its fingerprint, ``grid-versions/``: every
  version run in this directory, see :mod:`ursa_ray.guard`); ``ray/``: Ray Tune's own experiment folders;
  ``.lock``: held by the run in progress.

A finished trial adds one part per table, ``<table>.parquet/<trial_id>.parquet`` (append-only: the cost of
adding a trial does not grow with the table); ``compact`` (:meth:`ResultsDirectory.compact`, run at the end of
``ursa-ray run`` and by ``ursa-ray compact DIR``) merges them into ``compacted-NNNNN.parquet`` parts.  Every
part of a table has the table's schema (:data:`SCHEMAS`).  On a local disk each ``<table>.parquet`` is a
symbolic link to ``.tables/<table>.<version>/``, which ``compact`` swaps atomically.

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
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ursa_ray.eval_sets import kinds_by_name
from ursa_ray.spec import TrialSpec

TRIAL_SCHEMA = pa.schema([
    ("trial_id", pa.string()), ("phase", pa.string()), ("cell", pa.string()), ("method", pa.string()),
    ("method_name", pa.string()), ("model", pa.string()), ("dataset", pa.string()), ("task", pa.string()),
    ("decision_task", pa.bool_()), ("complexity", pa.float64()), ("seed", pa.int64()), ("status", pa.string()),
    ("error", pa.string()), ("config", pa.string()), ("wall_s", pa.float64()), ("cpu_s", pa.float64()),
    ("gpu_s", pa.float64()), ("reserved_cpu_s", pa.float64()), ("reserved_gpu_s", pa.float64()),
    ("n_cpus", pa.float64()), ("n_gpus", pa.float64()), ("node", pa.string()), ("node_id", pa.string()),
    ("worker_pid", pa.int64()), ("device", pa.string()), ("precision", pa.string()), ("gpu_ids", pa.string()), ("n_samples", pa.int64()), ("worker_setup_s", pa.float64()),
    ("setup_s", pa.float64()), ("train_s", pa.float64()), ("eval_s", pa.float64()), ("bit_depth_eval_s", pa.float64()),
    ("attack_s", pa.float64()), ("n_params", pa.int64()), ("grad_evals", pa.float64()), ("accept_rate", pa.float64()),
    ("method_stats", pa.string()), ("selection", pa.string()), ("transfer_from", pa.string()),
    ("reference_from", pa.string()), ("seeds_in_trial", pa.int64()), ("started_at", pa.float64()), ("finished_at", pa.float64()),
])  # fmt: skip
METRIC_SCHEMA = pa.schema([
    ("trial_id", pa.string()), ("method", pa.string()), ("model", pa.string()), ("dataset", pa.string()),
    ("seed", pa.int64()), ("phase", pa.string()), ("eval_set", pa.string()), ("eval_kind", pa.string()),
    ("metric", pa.string()), ("value", pa.float64()),
])  # fmt: skip
POINT_SCHEMA = pa.schema([
    ("trial_id", pa.string()), ("method", pa.string()), ("model", pa.string()), ("experiment", pa.string()),
    ("complexity", pa.float64()), ("repetition", pa.int64()), ("point_id", pa.int64()), ("x", pa.list_(pa.float64())),
    ("in_distribution", pa.bool_()), ("truth", pa.float64()), ("mean", pa.float64()), ("std", pa.float64()),
])  # fmt: skip
SCHEMAS = {"trials": TRIAL_SCHEMA, "metrics": METRIC_SCHEMA, "points": POINT_SCHEMA}
TRIAL_COLUMNS, METRIC_COLUMNS, POINT_COLUMNS = (schema.names for schema in SCHEMAS.values())
FINISHED = ("ok", "early_stopped")  # a resumed run does not rerun these; a failed trial is rerun
COMPACTED = "compacted-"  # the name of every part `compact` writes starts with this
ROWS_PER_COMPACTED_PART = 1_000_000
VERSIONS = ".tables"  # local directories: the table folders the `<table>.parquet` links point at


def with_eval_kind(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows, each with its ``eval_kind``: :func:`ursa_ray.eval_sets.eval_kind` of its ``eval_set``
    (:class:`~ursa_ray.eval_sets.UnknownEvalSet` for a name outside the grammar)."""
    rows = list(rows)
    kinds = kinds_by_name(row["eval_set"] for row in rows)
    return [row if row.get("eval_kind") else {**row, "eval_kind": kinds[row["eval_set"]]} for row in rows]


def with_eval_kinds(metrics: pd.DataFrame) -> pd.DataFrame:
    """A frame of metric rows with an ``eval_kind`` in every row: rows without one (written before the column,
    or built by hand) get :func:`ursa_ray.eval_sets.eval_kind` of their ``eval_set`` (which refuses a name
    outside the grammar)."""
    kinds = metrics["eval_kind"] if "eval_kind" in metrics else pd.Series(None, index=metrics.index, dtype=object)
    missing = kinds.isna()
    if not missing.any():
        return metrics
    names = metrics.loc[missing, "eval_set"]
    return metrics.assign(eval_kind=kinds.mask(missing, names.map(kinds_by_name(names.unique()))))


def metric_key(spec: TrialSpec) -> dict[str, Any]:
    """The columns of a metrics.parquet row (:data:`METRIC_SCHEMA`) that name its trial, from the trial's spec
    (``method`` is the method's label); a row adds its evaluation set, metric and value."""
    return {
        "trial_id": spec.trial_id,
        "method": spec.label,
        "model": spec.model,
        "dataset": spec.dataset,
        "seed": int(spec.seed),
        "phase": spec.phase,
    }


def trial_row(
    spec: TrialSpec,
    status: str,
    record: Mapping[str, Any],
    *,
    seeds_in_trial: int,
    started_at: float,
    finished_at: float,
    request: Mapping[str, float],
    node_ip: str | None,
    selection: Mapping[str, float],
) -> dict[str, Any]:
    """One trials.parquet row (:data:`TRIAL_SCHEMA`), built by the driver when the trial is recorded.

    ``record``: what the trial's worker measured (``cpu_s``, ``train_s``, ``device``, ``node``, method
    statistics; only ``error`` and ``cpu_s`` for a trial that failed).  The spec gives the trial's identity and
    configuration.  The driver's own measures: a Tune trial that ran ``seeds_in_trial`` seeds (one batched
    computation) from ``started_at`` to ``finished_at`` gives each seed an even share of its wall seconds,
    ``wall_s = (finished_at - started_at) / seeds_in_trial``; its reserved CPU- and GPU-seconds are the Tune
    trial's ``request`` ({"CPU": n, "GPU": m}) times that share, and ``gpu_s`` is the reserved GPU-seconds.
    ``node_ip``: the Tune trial's node, for a record that names none.  ``selection``: the validation metrics
    the trial last reported (what a search selects on)."""
    wall = (finished_at - started_at) / seeds_in_trial
    n_cpus, n_gpus = request.get("CPU", 0.0), request.get("GPU", 0.0)
    return {
        **record,
        "trial_id": spec.trial_id,
        "phase": spec.phase,
        "cell": spec.cell,
        "method": spec.label,
        "method_name": spec.method,
        "model": spec.model,
        "dataset": spec.dataset,
        "task": spec.task,
        "decision_task": spec.decision_task,
        "complexity": spec.complexity_or_nan,
        "seed": spec.seed,
        "status": status,
        "error": record.get("error", "") or "",
        "config": json.dumps(spec.config, sort_keys=True),
        "wall_s": wall,
        "gpu_s": n_gpus * wall,
        "reserved_cpu_s": n_cpus * wall,
        "reserved_gpu_s": n_gpus * wall,
        "n_cpus": n_cpus,
        "n_gpus": n_gpus,
        "gpu_ids": record.get("gpu_ids", "") or "",
        "seeds_in_trial": seeds_in_trial,
        "node": record.get("node") or (node_ip or ""),
        "selection": json.dumps(dict(selection), sort_keys=True),
        "started_at": started_at,
        "finished_at": finished_at,
    }


class NotAResultsDirectory(FileNotFoundError):
    """A folder (or URI) without ``trials.parquet``: not the results of an ``ursa-ray run``."""


class DamagedPart(ValueError):
    """A table's part file that is not a readable Parquet file (a write cut short by a full disk or a copy
    interrupted, say).  Its message is one line naming the file and how to recover."""

    def __init__(self, part: str, why: str, trial_id: str | None):
        self.part, self.why, self.trial_id = part, why, trial_id
        if trial_id is not None:
            recover = f"`ursa-ray run` on this directory removes it and reruns trial {trial_id}"
        else:
            recover = (
                "it holds rows of several trials, so which to rerun cannot be told: restore it from a copy, "
                "or delete it and rerun the grid into a new --out"
            )
        super().__init__(f"{part}: damaged Parquet part file ({why}); {recover}")


def write_atomic(path: Path, write: Any, staging: Path | None = None) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``.  The temporary file is made in
    ``staging`` (a folder on the same filesystem), else beside ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=staging or path.parent)
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

    @property
    def parent(self) -> Location:
        """The folder holding this file or folder."""
        if self.is_local:
            return Location(self.fs, str(Path(self.path).parent), str(Path(self.uri).parent))
        base, query, rest = self.uri.partition("?")
        return Location(
            self.fs, self.path.rstrip("/").rsplit("/", 1)[0], base.rstrip("/").rsplit("/", 1)[0] + query + rest
        )

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

    def write_parquet(self, frame: pd.DataFrame | pa.Table, staging: Path | None = None) -> None:
        """Atomically for readers; a local file's temporary copy is made in ``staging`` if given (a folder
        on the same filesystem: a dataset folder holds nothing but its parts, which some readers insist on)."""
        table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
        if self.is_local:
            write_atomic(self.local_path, lambda tmp: pq.write_table(table, tmp), staging)
            return
        buffer = io.BytesIO()  # serialised in full before the upload starts: a failure uploads nothing
        pq.write_table(table, buffer)
        self.write_bytes(buffer.getvalue())

    def delete(self) -> None:
        """Remove the file, if there is one."""
        if self.is_local:
            self.local_path.unlink(missing_ok=True)
        elif self.exists():
            self.fs.delete_file(self.path)


def transfer_examples_location(results_uri: str, trial_id: str) -> Location:
    """``transfer/<trial_id>.pt`` in the results directory named by ``results_uri``: the adversarial examples
    the transfer source ``trial_id`` crafted."""
    return Location.parse(results_uri) / "transfer" / f"{trial_id}.pt"


def rows_table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """``rows`` as an Arrow table with the ``name`` table's schema (:data:`SCHEMAS`; a missing column is null),
    so that every part of a table has the same schema.  ValueError for a column the schema lacks."""
    schema = SCHEMAS[name]
    unknown = sorted({key for row in rows for key in row} - set(schema.names))
    if unknown:
        raise ValueError(f"{name} rows have columns outside the {name} table's schema: {', '.join(unknown)}")
    columns = [pa.array([row.get(f.name) for row in rows], type=f.type, from_pandas=True) for f in schema]  # NaN: null
    return pa.Table.from_arrays(columns, schema=schema)


class ResultsDirectory:
    """Reads and extends one results directory: a local path or an object-store URI (see :class:`Location`).

    Each table is a Parquet dataset folder, ``<table>.parquet/``.  :meth:`add` writes one trial's rows as parts
    of their own, ``<table>.parquet/<trial_id>.parquet``, each written atomically; a rerun of the trial
    replaces its parts whole, so readers never see two versions of a trial, and adding a trial costs the same
    however large the tables have grown.  :meth:`compact` merges the parts into a few large ones.

    On a local disk ``<table>.parquet`` is a symbolic link to the table's current folder,
    ``.tables/<table>.<version>``: :meth:`compact` builds the merged folder beside it and swaps the link in one
    atomic rename, so readers see the old folder or the new one and an interrupted compact changes nothing.
    """

    def __init__(self, path: str | Path | Location):
        self.location = Location.parse(path)
        self._trials: pa.Table | None = None  # the trials table, once something asked for it (the search phase)
        self._added_trials: dict[str, dict[str, Any]] = {}  # trial rows added since it was read
        self._compacted: dict[str, dict[str, str]] = {}  # per table: trial id -> the compacted part holding its rows
        self._ready: set[str] = set()  # tables whose folder exists in the current layout

    def folder(self, name: str) -> Location:
        """The ``name`` table's dataset folder (``trials``, ``metrics`` or ``points``)."""
        return self.location / f"{name}.parquet"

    def read(self, name: str, columns: list[str] | None = None) -> pd.DataFrame:
        """The ``name`` table (only ``columns``, if given) with its schema's columns; empty when nothing wrote it.
        Metric rows written before the ``eval_kind`` column get it here, from their ``eval_set`` (when read)."""
        folder = self.folder(name)
        if not folder.exists():
            return SCHEMAS[name].empty_table().select(columns or SCHEMAS[name].names).to_pandas()
        frame = pa.concat_tables(_batches(folder, name, columns)).to_pandas()
        if name == "metrics" and {"eval_set", "eval_kind"} <= set(frame):
            return with_eval_kinds(frame)
        return frame

    def trials(self) -> pd.DataFrame:
        """The trials table, including the rows this object added (read from disk once, then kept up to date)."""
        if self._trials is None:
            folder = self.folder("trials")
            self._trials = (
                pa.concat_tables(_batches(folder, "trials")) if folder.exists() else TRIAL_SCHEMA.empty_table()
            )
        if self._added_trials:
            replaced = pa.array(list(self._added_trials), pa.string())
            kept = self._trials.filter(pa.compute.invert(pa.compute.is_in(self._trials["trial_id"], replaced)))
            self._trials = pa.concat_tables([kept, rows_table("trials", list(self._added_trials.values()))])
            self._added_trials = {}
        return self._trials.to_pandas()

    def finished_ids(self) -> set[str]:
        """Trials with status ok or early_stopped: a resumed run does not rerun them.  Reads two columns.
        Empty when the metrics table is missing (deleted by hand): every finished trial writes metric rows, so
        the rerun reruns every trial and restores it."""
        trials = self.trials() if self._trials is not None else self.read("trials", ["trial_id", "status"])
        finished = set(trials.loc[trials["status"].isin(FINISHED), "trial_id"])
        return finished if self.folder("metrics").exists() else set()

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
        """Add (or replace) one trial's rows: its trials row, metric rows and point rows, each table's as one part
        named by the trial id.  Point rows may also carry other ids (the anchor's, shared by the trials of one
        repetition, whose rows are the same whoever writes them): those parts are written once."""
        trial_id = record["trial_id"]
        tables = {"trials": [record], "metrics": with_eval_kind(metrics), "points": list(points)}
        for name, rows in tables.items():
            by_id: dict[str, list[dict[str, Any]]] = {trial_id: []}
            for row in rows:
                by_id.setdefault(row["trial_id"], []).append(row)
            if not rows and not self.folder(name).exists():
                continue
            folder = self._writable_folder(name)
            compacted = self._compacted_ids(name)
            for part_id, part_rows in by_id.items():
                if part_id in compacted:
                    if part_id != trial_id:
                        continue  # shared rows, already kept
                    self._release(name, part_id)  # a rerun of a trial whose rows were compacted
                part = folder / f"{part_id}.parquet"
                if part_rows:
                    part.write_parquet(rows_table(name, part_rows), self._staging)
                elif part_id == trial_id and name != "trials":
                    part.delete()  # the rerun has no such rows: the earlier run's go
        if self._trials is not None:  # else trials() reads the parts just written: no copy of every row kept
            self._added_trials[trial_id] = record
        for eval_set, frame in (predictions or {}).items():
            (self.location / "predictions" / f"{trial_id}__{eval_set}.parquet").write_parquet(frame)

    def damaged_parts(self) -> list[DamagedPart]:
        """Every part file of every table that is not a whole Parquet file: each part's size and its first and
        last bytes are checked (the ``PAR1`` magic at both ends and a footer that fits), one small read per
        part, without reading its rows.  A trial's own part names the trial (``trial_id``); a compacted part,
        or one shared by several trials (a regression anchor's points), names none."""
        damaged = []
        for name in SCHEMAS:
            folder = self.folder(name)
            if folder.exists():
                damaged += [
                    _damaged(folder, path, why)
                    for path in _part_files(folder)
                    if (why := _parquet_damage(folder.fs, path)) is not None
                ]
        return damaged

    def remove_trial(self, trial_id: str) -> None:
        """Delete ``trial_id``'s rows from every table (its own parts, and its rows in compacted parts), so that
        a run counts it unfinished and reruns it."""
        for name in SCHEMAS:
            if self.folder(name).exists():
                if trial_id in self._compacted_ids(name):
                    self._release(name, trial_id)
                (self.folder(name) / f"{trial_id}.parquet").delete()
        self._trials, self._added_trials = None, {}

    def compact(self) -> dict[str, tuple[int, int]]:
        """Merge each table's parts written since the last compact into parts of at most
        :data:`ROWS_PER_COMPACTED_PART` rows (``compacted-NNNNN.parquet``; earlier ones are kept as they are, so a
        compact costs what was added since) without changing what any reader sees.  A failed trial's parts stay
        as they are, so that its rerun replaces them cheaply.  Returns, per table, (parts before, parts after).

        Safe to interrupt, and to run while nothing writes to the directory (``ursa-ray run`` holds its lock).
        An object store has no atomic rename: there a manifest says which parts count (:meth:`_compact_object_store`)."""
        for damaged in self.damaged_parts():
            raise damaged
        if not self.location.is_local:
            return self._compact_object_store()
        trials = self.read("trials", ["trial_id", "status"])
        failed = set(trials.loc[~trials["status"].isin(FINISHED), "trial_id"])
        report = {}
        for name in SCHEMAS:
            link = self.folder(name).local_path
            if not (link.exists() or link.is_symlink()):
                continue
            current = self._writable_folder(name).local_path.resolve()
            for leftover in (self.location.local_path / VERSIONS).glob(f"{name}.*"):
                if leftover != current:  # from a compact that was interrupted before its swap
                    shutil.rmtree(leftover)
            for stale in (self.location.local_path / VERSIONS).glob(".*.tmp"):  # from a write cut short
                stale.unlink()
            parts = sorted(p for p in current.glob("*.parquet") if not p.name.startswith("."))
            done = [p for p in parts if p.name.startswith(COMPACTED)]  # merged by an earlier compact: kept as they are
            kept = [p for p in parts if p not in done and p.stem in failed]
            merged = [p for p in parts if p not in done and p.stem not in failed]
            if not merged:
                report[name] = (len(parts), len(parts))
                continue
            version = self._new_version(name)
            index = max((int(p.stem[len(COMPACTED) :]) for p in done), default=-1)
            writer, rows, written = None, 0, 0
            for batch in _batches(self.folder(name), name, files=[str(p) for p in merged]):
                if batch.num_rows == 0:
                    continue
                if writer is None or rows + batch.num_rows > ROWS_PER_COMPACTED_PART:
                    if writer is not None:
                        writer.close()
                    index, rows, written = index + 1, 0, written + 1
                    writer = pq.ParquetWriter(version / f"{COMPACTED}{index:05d}.parquet", SCHEMAS[name])
                writer.write_table(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
            for part in done + kept:
                os.link(part, version / part.name)
            _point(link, version)
            shutil.rmtree(current)
            report[name] = (len(parts), len(done) + written + len(kept))
        self._compacted = {}
        return report

    def _compact_object_store(self) -> dict[str, tuple[int, int]]:
        """Compact on an object store, where nothing can be renamed: each table's new ``compacted-NNNNN.parquet``
        parts are uploaded whole, then the table's manifest (``<table>.parquet/_manifest.json``, :data:`MANIFEST`)
        is written naming every compacted part and the parts they replace, then those parts are deleted and
        the manifest rewritten without them.  Readers that follow the manifest (every ursa-ray reader, through
        :func:`_part_files`) see each row once at every step; an interrupted compact is finished by the next
        write or compact (:meth:`_settle`).  A plain Parquet reader of the folder sees the same rows except
        while a compact runs."""
        trials = self.read("trials", ["trial_id", "status"])
        failed = set(trials.loc[~trials["status"].isin(FINISHED), "trial_id"])
        report = {}
        for name in SCHEMAS:
            folder = self.folder(name)
            if not folder.exists():
                continue
            self._settle(folder)
            parts = _part_files(folder)
            names = [p.rsplit("/", 1)[-1] for p in parts]
            done = [n for n in names if n.startswith(COMPACTED)]
            merged = [
                p
                for p, n in zip(parts, names, strict=True)
                if n not in done and n.removesuffix(".parquet") not in failed
            ]
            if not merged:
                report[name] = (len(parts), len(parts))
                continue
            index = max((int(n[len(COMPACTED) :].removesuffix(".parquet")) for n in done), default=-1)
            written: list[str] = []
            pending: list[pa.Table] = []
            for batch in [*_batches(folder, name, files=merged), None]:
                rows = sum(t.num_rows for t in pending)
                if pending and (batch is None or rows + batch.num_rows > ROWS_PER_COMPACTED_PART):
                    index += 1
                    written.append(f"{COMPACTED}{index:05d}.parquet")
                    (folder / written[-1]).write_parquet(pa.concat_tables(pending))
                    pending = []
                if batch is not None and batch.num_rows:
                    pending.append(batch)
            replaced = [p.rsplit("/", 1)[-1] for p in merged]
            _write_manifest(folder, done + written, replaced)
            self._settle(folder)
            report[name] = (len(parts), len(parts) - len(merged) + len(written))
        self._compacted = {}
        return report

    @staticmethod
    def _settle(folder: Location) -> None:
        """Finish an object-store table's interrupted compact: delete the parts its manifest says were replaced
        and any compacted part it does not list (uploaded by a compact cut short before its manifest)."""
        manifest = _read_manifest(folder)
        if manifest is None:
            return
        listed, replaced = set(manifest["compacted"]), set(manifest["replaced"])
        infos = folder.fs.get_file_info(pafs.FileSelector(folder.path))
        for info in infos:
            if info.base_name in replaced or (info.base_name.startswith(COMPACTED) and info.base_name not in listed):
                folder.fs.delete_file(info.path)
        if replaced:
            _write_manifest(folder, manifest["compacted"], [])

    def _writable_folder(self, name: str) -> Location:
        """The table's folder, made ready for parts: created if new; a table written by an older ursa-ray (one
        Parquet file, or a plain folder of parts) is moved into the current layout first."""
        folder = self.folder(name)
        if name in self._ready:
            return folder
        if folder.is_local:
            link = folder.local_path
            if not link.is_symlink():
                version = self._new_version(name)
                if link.exists():  # one file, or a folder of parts: merged with the table's schema
                    pq.write_table(pa.concat_tables(_batches(folder, name)), version / f"{COMPACTED}00000.parquet")
                aside = link.with_name(f".{link.name}.old")
                if link.is_dir():
                    os.replace(link, aside)  # a folder cannot be renamed over: moved aside, then replaced
                _point(link, version)
                shutil.rmtree(aside, ignore_errors=True)
        elif folder.fs.get_file_info(folder.path).type == pafs.FileType.File:  # an older single-file table
            old = pa.concat_tables(_batches(folder, name))
            folder.delete()
            (folder / f"{COMPACTED}00000.parquet").write_parquet(old)
        else:
            self._settle(folder)  # a compact cut short: finished before anything is added
        self._ready.add(name)
        return folder

    def _new_version(self, name: str) -> Path:
        versions = self.location.local_path / VERSIONS
        versions.mkdir(parents=True, exist_ok=True)
        numbers = [int(p.suffix[1:]) for p in versions.glob(f"{name}.*") if p.suffix[1:].isdigit()]
        version = versions / f"{name}.{max(numbers, default=-1) + 1}"
        version.mkdir()
        return version

    def _compacted_ids(self, name: str) -> dict[str, str]:
        """Trial id -> the compacted part holding its rows in the ``name`` table (read once: ids only)."""
        if name not in self._compacted:
            folder = self.folder(name)
            found: dict[str, str] = {}
            if folder.exists():
                for path in _part_files(folder):
                    base = path.rsplit("/", 1)[-1]
                    if base.startswith(COMPACTED):
                        ids = pq.read_table(path, columns=["trial_id"], filesystem=folder.fs)["trial_id"]
                        found.update(dict.fromkeys(pa.compute.unique(ids).to_pylist(), base))
            self._compacted[name] = found
        return self._compacted[name]

    def _release(self, name: str, trial_id: str) -> None:
        """Rewrite the compacted part holding ``trial_id``'s rows without them (atomically)."""
        part = self.folder(name) / self._compacted[name].pop(trial_id)
        table = pq.read_table(part.path, filesystem=part.fs)
        part.write_parquet(table.filter(pa.compute.not_equal(table["trial_id"], trial_id)), self._staging)

    @property
    def _staging(self) -> Path | None:
        """Where a local part's temporary copy is written: ``.tables/``, outside every table's folder."""
        return self.location.local_path / VERSIONS if self.location.is_local else None


PARTS_PER_READ = 1_000  # reading every part of a large table as one dataset holds ~50 KB a part in memory


def _batches(
    folder: Location, name: str, columns: list[str] | None = None, files: list[str] | None = None
) -> Iterator[pa.Table]:
    """The ``name`` table at ``folder`` (a dataset folder, or an older single file), or only its part
    ``files``, with the table's schema, read :data:`PARTS_PER_READ` parts at a time (at least one table).
    :class:`DamagedPart` names a part that cannot be read."""
    files = _part_files(folder) if files is None else files
    yield SCHEMAS[name].empty_table().select(columns or SCHEMAS[name].names)
    for start in range(0, len(files), PARTS_PER_READ):
        some = files[start : start + PARTS_PER_READ]
        try:
            yield pads.dataset(some, filesystem=folder.fs, schema=SCHEMAS[name], format="parquet").to_table(
                columns=columns
            )
        except (pa.ArrowInvalid, OSError) as exc:
            raise _first_damaged(folder, some, exc) from None


def _part_files(folder: Location) -> list[str]:
    """The paths of a table's part files, sorted (an older single-file table: that file).  On an object store
    with a manifest (:meth:`ResultsDirectory._compact_object_store`), only the compacted parts it lists and no
    part it says they replaced."""
    if folder.fs.get_file_info(folder.path).type == pafs.FileType.File:
        return [folder.path]
    infos = folder.fs.get_file_info(pafs.FileSelector(folder.path))
    names = {
        i.base_name: i.path
        for i in infos
        if i.base_name.endswith(".parquet") and not i.base_name.startswith((".", "_"))
    }
    manifest = None if folder.is_local else _read_manifest(folder)
    if manifest is not None:
        listed, replaced = set(manifest["compacted"]), set(manifest["replaced"])
        names = {n: p for n, p in names.items() if n not in replaced and (n in listed or not n.startswith(COMPACTED))}
    return sorted(names.values())


MANIFEST = "_manifest.json"
"""Object stores: ``<table>.parquet/_manifest.json``, {"compacted": [part names], "replaced": [part names]}, the
table's compacted parts and the parts they replaced that are not deleted yet (a leading ``_`` hides it from
Parquet readers' folder discovery)."""


def _read_manifest(folder: Location) -> dict[str, list[str]] | None:
    manifest = folder / MANIFEST
    return json.loads(manifest.read_text()) if manifest.exists() else None


def _write_manifest(folder: Location, compacted: list[str], replaced: list[str]) -> None:
    (folder / MANIFEST).write_text(json.dumps({"compacted": sorted(compacted), "replaced": sorted(replaced)}))


def _parquet_damage(fs: pafs.FileSystem, path: str) -> str | None:
    """Why the file at ``path`` is not a whole Parquet file (from its size and its first and last 8 bytes:
    ``PAR1``, then at the end a footer length and ``PAR1``), or None when it looks whole."""
    with fs.open_input_file(path) as f:
        size = f.size()
        if size < 12:
            return f"{size} bytes, shorter than any Parquet file"
        head, tail = f.read_at(4, 0), f.read_at(8, size - 8)
    if head != b"PAR1" or tail[4:] != b"PAR1":
        return "no Parquet magic at its " + ("start" if head != b"PAR1" else "end: truncated")
    if int.from_bytes(tail[:4], "little") + 12 > size:
        return "its footer is longer than the file: truncated"
    return None


def _first_damaged(folder: Location, files: list[str], error: Exception) -> DamagedPart:
    """The first of ``files`` that pyarrow cannot read, as a DamagedPart (``error`` if none can be singled out)."""
    for path in files:
        try:
            pq.read_table(path, filesystem=folder.fs)
        except (pa.ArrowInvalid, OSError) as exc:
            return _damaged(folder, path, _first_line(exc))
    return DamagedPart(folder.uri, _first_line(error), None)


def _damaged(folder: Location, path: str, why: str) -> DamagedPart:
    """The damaged part ``path`` of the table at ``folder``, naming its trial when it is one trial's own part:
    not a compacted part, and named by a trial of the trials table (a regression anchor's points part is not)."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".parquet")
    trial_id = None
    if not stem.startswith(COMPACTED):
        trials = folder.parent / "trials.parquet"
        own = trials / f"{stem}.parquet"
        if own.exists():
            trial_id = stem
        else:  # its trials row may be compacted
            for part in _part_files(trials) if trials.exists() else []:
                if part.rsplit("/", 1)[-1].startswith(COMPACTED) and _parquet_damage(trials.fs, part) is None:
                    ids = pq.read_table(part, columns=["trial_id"], filesystem=trials.fs)["trial_id"]
                    if stem in set(ids.to_pylist()):
                        trial_id = stem
                        break
    return DamagedPart(_display(folder, path), why, trial_id)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _display(folder: Location, path: str) -> str:
    """A part file as the user named its directory: a local path, or the URI with its query."""
    if folder.is_local:
        return str(folder.local_path / path.rsplit("/", 1)[-1])
    return (folder / path.rsplit("/", 1)[-1]).uri


def _point(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target`` in one atomic rename (readers see the old link or the new)."""
    swap = link.with_name(f".{link.name}.{os.getpid()}.swap")
    swap.unlink(missing_ok=True)
    os.symlink(os.path.relpath(target, link.parent), swap)
    os.replace(swap, link)
