"""A results directory belongs to one grid and one driver: checks ``ursa-ray run`` makes before Ray starts.

- :func:`check_out_location`: ``--out`` must be a directory this process can write (not a file, not under a
  read-only or virtual filesystem); checked before anything is written.
- :func:`grid_fingerprint` / :func:`claim_for_grid`: the directory remembers the grid that wrote it
  (``grid.json``: its fingerprint, from the sorted final trial ids plus the search settings, so comments and key
  order do not count); a different grid is refused unless ``allow_grid_change``, which keeps every version
  (``grid.yaml``, the latest, and ``grid-versions/<fingerprint>.yaml``).
- :func:`results_lock`: an exclusive lock ``DIR/.lock`` (host, pid, start time) for the whole run: on a local
  disk an ``fcntl.flock`` on it, which dies with its process, so a killed run's lock is taken over atomically;
  on an object store a lease object with an expiry that the live run renews (:mod:`ursa_ray.lease`).

Every refusal is a :class:`ResultsDirError` (a :class:`~ursa_ray.grid.GridError`: one line, exit status 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ursa_ray.grid import Grid, GridError
from ursa_ray.lease import Lease
from ursa_ray.results import Location

LOCK = ".lock"
GRID_RECORD = "grid.json"
VERSIONS = "grid-versions"


class ResultsDirError(GridError):
    """A results directory that ``run`` must not use as it is (exit status 2, nothing written)."""


def check_out_location(where: Location) -> None:
    """ResultsDirError unless ``where`` (a local path) is, or can become, a directory this process writes.

    The probe creates and removes a temporary folder in the directory (or its nearest existing parent):
    permission bits alone do not tell (root ignores them; /proc and read-only mounts refuse anyway)."""
    if not where.is_local:
        return
    path = where.local_path
    if path.exists() and not path.is_dir():
        raise ResultsDirError(f"--out {path}: is a file, not a results directory; choose another --out")
    for parent in path.absolute().parents:  # absolute, not resolved: a table folder is a link into .tables/
        if (parent / "trials.parquet").exists() or (parent / GRID_RECORD).exists():
            raise ResultsDirError(
                f"--out {path}: inside the results directory {parent} (whose tables readers would then fail to "
                "read); choose an --out outside it"
            )
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ResultsDirError(f"--out {path}: {existing} is a file, not a directory; choose another --out")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ursa-ray-probe-", dir=existing))
    except OSError as exc:
        raise ResultsDirError(
            f"--out {path}: cannot write in {existing} ({exc.strerror or exc}); choose another --out"
        ) from None


def grid_fingerprint(grid: Grid) -> str:
    """sha256 of the grid's identity: its sorted final trial ids (which hash every trial's method, model,
    dataset, options, seed and configuration), its search settings and searched spaces.  Comments, key order
    and other cosmetic YAML changes do not change it."""
    identity: dict[str, Any] = {"final_trials": sorted(s.trial_id for s in grid.trial_specs())}
    if grid.search is not None:
        identity["search"] = dataclasses.asdict(grid.search)
        identity["search_spaces"] = {m.label: m.search_space for m in grid.methods if m.search_space}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def recorded_fingerprint(where: Location) -> str | None:
    record = where / GRID_RECORD
    if not record.exists():
        return None
    try:
        return str(json.loads(record.read_text())["fingerprint"])
    except (ValueError, KeyError, TypeError):
        raise ResultsDirError(f"{where}: {GRID_RECORD} is unreadable; is this an ursa-ray results directory?") from None


def check_grid(where: Location, grid: Grid, allow_grid_change: bool = False) -> str:
    """The grid's fingerprint; ResultsDirError when ``where`` holds the results of a different grid (and
    ``allow_grid_change`` is false).  Writes nothing."""
    fingerprint = grid_fingerprint(grid)
    before = recorded_fingerprint(where)  # None: a new directory, or one written before grid.json existed (adopted)
    if before not in (None, fingerprint) and not allow_grid_change:
        raise ResultsDirError(
            f"{where}: holds the results of another grid (its grid.yaml), not of {grid.path}; "
            "use another --out, or --allow-grid-change to add this grid's trials to it"
        )
    return fingerprint


def record_grid(where: Location, grid: Grid, fingerprint: str) -> None:
    """Keep this grid beside the results: ``grid.yaml`` (the latest), ``grid-versions/<fingerprint>.yaml`` and
    ``grid.json`` (the current fingerprint and every earlier one)."""
    record = where / GRID_RECORD
    history: list[str] = []
    if record.exists():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            history = list(json.loads(record.read_text()).get("versions", []))
    elif (where / "grid.yaml").exists() and (where / "grid.yaml").read_text() != grid.source:
        (where / VERSIONS / "earlier.yaml").write_text((where / "grid.yaml").read_text())  # before grid.json existed
        history = ["earlier"]
    (where / VERSIONS / f"{fingerprint}.yaml").write_text(grid.source)
    (where / "grid.yaml").write_text(grid.source)
    versions = [v for v in history if v != fingerprint] + [fingerprint]
    record.write_text(json.dumps({"fingerprint": fingerprint, "versions": versions}, indent=1) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _holder(text: str) -> dict[str, Any]:
    try:
        holder = json.loads(text)
        return holder if isinstance(holder, dict) else {}
    except ValueError:
        return {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a run whose lock is being written or is unreadable"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started_at", 0))))
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {since}"


@contextlib.contextmanager
def results_lock(where: Location, echo: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the results directory's lock for the block (released on return, exception and Ctrl-C alike).

    ResultsDirError when another live run holds it.  A local directory's lock is ``where/.lock`` held with
    ``fcntl.flock`` (:func:`_local_lock`); an object store's is a lease object that the run renews
    (:class:`ursa_ray.lease.Lease`)."""
    if not where.is_local:
        with Lease(where / LOCK, echo).held():
            yield
        return
    directory = where.local_path
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _local_lock(directory / LOCK, echo):
            yield
    finally:
        if created:  # a run refused after the lock (no node fits a trial, say) leaves no empty directory behind
            with contextlib.suppress(OSError):
                directory.rmdir()


@contextlib.contextmanager
def _local_lock(lock: Path, echo: Callable[[str], None]) -> Iterator[None]:
    """Hold ``lock`` (host, pid, start time inside) with an exclusive ``fcntl.flock`` for the block.

    The kernel releases a flock when its process dies, and only one process can take it, so taking over a
    killed run's lock is atomic: of several drivers starting together on a stale lock exactly one gets it.
    After taking the flock the file must still be the one at ``lock`` (a releasing run unlinks it while
    holding its flock), else the attempt starts again.  A record naming a live process of this host (an
    ursa-ray older than the flock) or another host (whose liveness cannot be seen here) is respected as
    before.  Local filesystems (and NFS with its lock manager) only."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}
    for _ in range(100):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(_read(fd))
            os.close(fd)
            raise _in_use(lock, holder) from None
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # released (unlinked) between our open and our flock: take the new file
    else:
        raise ResultsDirError(f"{lock.parent}: could not take its lock {lock}; try again")
    try:
        holder = _holder(_read(fd))
        if holder:
            stale = (
                holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) and not _alive(holder["pid"])
            )
            if not stale:
                raise _in_use(lock, holder)
            echo(f"{lock.parent}: taking over the stale lock of {_describe(holder)} (that process no longer exists)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()  # while the flock is held: a run waiting on this file sees it gone and retries
    finally:
        os.close(fd)


def _read(fd: int) -> str:
    return os.pread(fd, 65536, 0).decode(errors="replace")


def _in_use(lock: Path, holder: dict[str, Any]) -> ResultsDirError:
    return ResultsDirError(
        f"{lock.parent}: in use by another ursa-ray run ({_describe(holder)}); wait for it to end, "
        f"use another --out, or remove {lock} if that process is not an ursa-ray run"
    )


__all__ = [
    "ResultsDirError",
    "check_grid",
    "check_out_location",
    "grid_fingerprint",
    "record_grid",
    "results_lock",
]
