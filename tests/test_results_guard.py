"""A results directory belongs to one grid and one driver (issue 20, item 5): every refusal is one line and exit
status 2, before Ray starts.  No test here runs a trial: a refused run never gets as far as Ray, and the
accepted cases are checked through :mod:`ursa_ray.guard` directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from ursa_ray.cli import main
from ursa_ray.grid import load_grid
from ursa_ray.guard import ResultsDirError, check_grid, grid_fingerprint, record_grid, results_lock
from ursa_ray.results import Location

GRID = {
    "name": "guarded",
    "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}}],
    "models": [{"name": "mlp", "options": {"widths": [8]}}],
    "datasets": ["digits"],
    "seeds": 1,
    "budget": {"epochs": 1},
}


def _grid_file(tmp_path, name, raw=GRID, text=None):
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
    return path


def _results_of(tmp_path, grid_path):
    """A results directory as a run of ``grid_path`` leaves it (no trial run)."""
    out = tmp_path / "results"
    where = Location.parse(out)
    record_grid(where, load_grid(grid_path), grid_fingerprint(load_grid(grid_path)))
    return out


def _one_error_line(capsys):
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_a_changed_grid_is_refused_and_nothing_is_written(tmp_path, capsys):
    first = _grid_file(tmp_path, "a.yaml")
    out = _results_of(tmp_path, first)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    changed = _grid_file(tmp_path, "b.yaml", {**GRID, "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.1}}]})
    assert main(["run", str(changed), "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert str(out) in line and "--allow-grid-change" in line and "--out" in line
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # grid.yaml unchanged, no trials, no lock left behind
    assert not (out / "trials.parquet").exists() and not (out / ".lock").exists()


def test_the_same_grid_with_comments_and_another_key_order_is_the_same_grid(tmp_path):
    first = _grid_file(tmp_path, "a.yaml")
    out = _results_of(tmp_path, first)
    text = "# a comment\n" + yaml.safe_dump(dict(reversed(list(GRID.items()))), sort_keys=False) + "# the end\n"
    same = load_grid(_grid_file(tmp_path, "same.yaml", text=text))
    assert same.source != load_grid(first).source
    assert check_grid(Location.parse(out), same) == grid_fingerprint(load_grid(first))


def test_allow_grid_change_keeps_every_version(tmp_path):
    first = _grid_file(tmp_path, "a.yaml")
    out = _results_of(tmp_path, first)
    changed = load_grid(_grid_file(tmp_path, "b.yaml", {**GRID, "seeds": [0, 1]}))
    where = Location.parse(out)
    with pytest.raises(ResultsDirError):
        check_grid(where, changed)
    fingerprint = check_grid(where, changed, allow_grid_change=True)
    record_grid(where, changed, fingerprint)
    versions = {p.stem: p.read_text() for p in (out / "grid-versions").iterdir()}
    assert versions == {grid_fingerprint(load_grid(first)): first.read_text(), fingerprint: changed.source}
    assert (out / "grid.yaml").read_text() == changed.source
    assert json.loads((out / "grid.json").read_text())["versions"] == [grid_fingerprint(load_grid(first)), fingerprint]


def test_a_directory_locked_by_a_live_run_is_refused(tmp_path, capsys):
    grid = _grid_file(tmp_path, "a.yaml")
    out = tmp_path / "results"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        holder = {"host": socket.gethostname(), "pid": sleeper.pid, "started_at": time.time()}
        (out / ".lock").write_text(json.dumps(holder))
        assert main(["run", str(grid), "--out", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"pid {sleeper.pid}" in line and str(out) in line
        assert json.loads((out / ".lock").read_text()) == holder  # not taken from a live run
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_the_lock_of_a_killed_run_is_taken_over_with_a_message(tmp_path):
    out = tmp_path / "results"
    code = (
        "import os, signal\n"
        "from ursa_ray.guard import results_lock\n"
        "from ursa_ray.results import Location\n"
        f"with results_lock(Location.parse({str(out)!r})):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ}, timeout=120)
    assert child.returncode == -signal.SIGKILL
    dead = json.loads((out / ".lock").read_text())["pid"]
    lines: list[str] = []
    with results_lock(Location.parse(out), lines.append):
        assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()
    assert len(lines) == 1 and "stale lock" in lines[0] and f"pid {dead}" in lines[0]
    assert not (out / ".lock").exists()  # released at the end


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_drivers_starting_together_on_a_stale_lock_take_it_over_one_at_a_time(tmp_path):
    """Issue 27.5: two drivers starting together on a killed run's lock both held it in 2 of 20 tries (each
    read the stale holder, removed the lock and created its own).  Here 8 threads (each its own open file, as
    separate processes would have) start at one barrier on a stale lock, 25 times: at no moment do two hold it,
    and at least one gets it every time.  Catches a takeover that is not atomic (the old unlink-and-recreate)."""
    import socket
    import threading

    dead = _dead_pid()
    for repetition in range(25):
        out = tmp_path / f"r{repetition}"
        out.mkdir()
        (out / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead, "started_at": 0.0}))
        barrier, guard = threading.Barrier(8), threading.Lock()
        holding, most, took, refused = [0], [0], [], []

        def driver(i: int) -> None:
            barrier.wait()
            try:
                with results_lock(Location.parse(out), echo=lambda line: None):
                    with guard:
                        holding[0] += 1
                        most[0] = max(most[0], holding[0])
                    time.sleep(0.02)
                    with guard:
                        holding[0] -= 1
                    took.append(i)
            except ResultsDirError:
                refused.append(i)

        threads = [threading.Thread(target=driver, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert most[0] == 1 and len(took) >= 1 and len(took) + len(refused) == 8, (repetition, most, took, refused)
        assert not (out / ".lock").exists()


def test_the_lock_is_released_on_an_exception(tmp_path):
    out = Location.parse(tmp_path / "results")
    with pytest.raises(KeyboardInterrupt), results_lock(out):
        raise KeyboardInterrupt
    assert not (tmp_path / "results" / ".lock").exists()


@pytest.mark.parametrize("which", ["empty", "missing"])
def test_report_on_a_folder_without_results_is_one_line(tmp_path, capsys, which):
    folder = tmp_path / "nothing"
    if which == "empty":
        folder.mkdir()
    assert main(["report", str(folder)]) == 2
    assert _one_error_line(capsys) == f"error: {folder}: no trials.parquet; is this an ursa-ray results directory?"
    assert not folder.exists() or not any(folder.iterdir())


@pytest.mark.parametrize("which", ["file", "under a file", "proc"])
def test_run_out_on_a_file_or_an_unwritable_place_is_one_line(tmp_path, capsys, which):
    grid = _grid_file(tmp_path, "a.yaml")
    file = tmp_path / "results.txt"
    file.write_text("not a directory")
    out = {"file": file, "under a file": file / "results", "proc": "/proc/ursa-ray-results"}[which]
    assert main(["run", str(grid), "--out", str(out)]) == 2
    assert str(out) in _one_error_line(capsys)
    assert file.read_text() == "not a directory" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a.yaml",
        "results.txt",
    ]


def test_a_lease_on_a_store_without_conditional_writes_is_best_effort_and_says_so(tmp_path, monkeypatch):
    """Stores pyarrow reaches without preconditions (GCS, Azure, HDFS) get a lease that is written, read back
    and kept if still its own, with a warning; here on a local path through the same pyarrow calls."""
    from ursa_ray.lease import BestEffortStore, Lease, LeaseRefused

    monkeypatch.setattr(BestEffortStore, "settle_s", 0.01)
    lock = Location.parse(tmp_path / "lease.json")
    lines: list[str] = []
    with Lease(lock, lines.append, store=BestEffortStore(lock)).held():
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(LeaseRefused, match="in use by another ursa-ray run"):
            with Lease(lock, lines.append, store=BestEffortStore(lock)).held():
                pass
    assert not lock.exists()
    assert len(lines) == 2 and all("no conditional writes" in line for line in lines)
