"""Results on an object store: `ursa-ray run --out s3://...` and `ursa-ray report s3://...` against a local S3
server (moto), reached only at 127.0.0.1.

The first run is a subprocess with its own local Ray, so its Ray workers inherit the S3 credentials set here
(the session Ray of conftest.py started before they were set); the rerun, which has no trial left to run, and
the report are in-process, on the session Ray. The URIs carry ``allow_delayed_open=true``:
pyarrow then stores small files with one PUT instead of a multipart upload, whose completion this moto
release answers with an XML root element that pyarrow's AWS SDK rejects (getmoto/moto#10055).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from light_evaluation import LIGHT_EVALUATION  # quicker trials: no corruption sets or bit depths, one small attack

from analysis.tables import load_results
from ursa_ray.cli import main
from ursa_ray.results import Location, ResultsDirectory

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (pip install -e '.[test]')")
pafs = pytest.importorskip("pyarrow.fs")

BUCKET = "ursa-results"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never look for credentials or a region beyond these variables
}
GRID = {
    "name": "object_store",
    "methods": ["sgd"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": ["digits"],
    "seeds": 2,
    "resources": {"cpu": 1},
    "budget": {"epochs": 2, "batch_size": 128},
    "save_predictions": True,
    **LIGHT_EVALUATION,  # the tests claim where results are stored, not what the trials score
}


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with one empty bucket; yields the endpoint's query string for URIs."""
    with pytest.MonkeyPatch.context() as env:
        for key, value in S3_ENV.items():
            env.setenv(key, value)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"{host}:{port}"
            pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir(BUCKET)
            yield f"endpoint_override={endpoint}&scheme=http&allow_delayed_open=true"
        finally:
            server.stop()


def _keys(location: Location) -> list[str]:
    infos = location.fs.get_file_info(pafs.FileSelector(location.path, recursive=True, allow_not_found=True))
    return sorted(i.path[len(location.path) + 1 :] for i in infos if i.type == pafs.FileType.File)


def test_location_names_local_paths_and_uris(tmp_path):
    local = Location.parse(tmp_path / "out")
    assert (
        local.is_local
        and local.path == str(tmp_path / "out")
        and str(local / "trials.parquet") == str(tmp_path / "out" / "trials.parquet")
    )
    assert Location.parse(f"file://{tmp_path}/out").path == local.path
    remote = Location.parse("s3://bucket/runs/a?endpoint_override=127.0.0.1:1&scheme=http")
    assert not remote.is_local and remote.path == "bucket/runs/a" and remote.name == "a"
    child = remote / "figures" / "x.png"
    assert child.path == "bucket/runs/a/figures/x.png"
    assert child.uri == "s3://bucket/runs/a/figures/x.png?endpoint_override=127.0.0.1:1&scheme=http"
    with pytest.raises(ValueError):
        _ = remote.local_path


def test_results_directory_writes_whole_objects_only(s3):
    uri = f"s3://{BUCKET}/unit/results?{s3}"
    results = ResultsDirectory(uri)
    assert results.trials().empty and results.finished_ids() == set()
    results.add(
        {"trial_id": "t1", "status": "ok"}, [{"trial_id": "t1", "eval_set": "test", "metric": "nll", "value": 0.5}]
    )
    results.add(
        {"trial_id": "t1", "status": "ok"}, [{"trial_id": "t1", "eval_set": "test", "metric": "nll", "value": 0.4}]
    )  # replaces
    results.add({"trial_id": "t2", "status": "failed"})
    # one part per trial and table, no temporary or partial objects
    assert _keys(results.location) == [
        "metrics.parquet/t1.parquet",
        "trials.parquet/t1.parquet",
        "trials.parquet/t2.parquet",
    ]
    again = ResultsDirectory(uri)
    assert again.finished_ids() == {"t1"}
    assert again.read("metrics")["value"].tolist() == [0.4]
    assert again.compact() == {"trials": (2, 2), "metrics": (1, 1)}  # t2 failed: kept; t1 alone merged into one


def _run(command: list[str], cwd, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, **S3_ENV, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def test_run_resume_and_report_on_an_s3_uri(s3, ray_session, tmp_path, monkeypatch, capsys):
    grid_file = tmp_path / "object_store.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    uri = f"s3://{BUCKET}/runs/tiny?{s3}"
    run = ["run", str(grid_file), "--out", uri]
    first = _run([sys.executable, "-m", "ursa_ray.cli", *run], tmp_path, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "final phase: 2 trials (0 already finished)" in first.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["object_store.yaml"]  # nothing written locally

    out = Location.parse(uri)
    keys = _keys(out)
    assert "grid.yaml" in keys
    assert {k.split("/")[0] for k in keys if k.endswith(".parquet") and "/" in k} >= {
        "trials.parquet",
        "metrics.parquet",
    }
    assert yaml.safe_load((out / "grid.yaml").read_text()) == GRID
    assert sum(k.startswith("ray/final-") and k.endswith("/record.json") for k in keys) == 2  # Tune's checkpoints
    trials = (out / "trials.parquet").read_parquet()
    assert len(trials) == 2 and (trials["status"] == "ok").all() and sorted(trials["seed"]) == [0, 1]
    assert set(trials["method"]) == {"sgd"} and trials["trial_id"].is_unique
    metrics = (out / "metrics.parquet").read_parquet()
    assert set(metrics["trial_id"]) == set(trials["trial_id"])
    accuracy = metrics[(metrics["eval_set"] == "test") & (metrics["metric"] == "accuracy")]
    assert len(accuracy) == 2 and (accuracy["value"] > 0.3).all()
    assert not metrics.duplicated(["trial_id", "eval_set", "metric"]).any()
    for trial_id in trials["trial_id"]:
        assert f"predictions/{trial_id}__test.parquet" in keys
    assert not [k for k in keys if ".tmp" in k]

    monkeypatch.chdir(tmp_path)  # in-process from here on: still nothing written locally (checked last)
    code = main(run)  # (the s3 fixture set this process's credentials)
    again = capsys.readouterr()
    assert code == 0, again.out + again.err
    assert "(2 already finished)" in again.out
    assert not re.search(r"^\[\d+/\d+\]", again.out, re.M)  # no trial ran
    rerun = (out / "trials.parquet").read_parquet()
    pd.testing.assert_frame_equal(rerun, trials)

    assert len(load_results(uri).trials) == 2
    assert main(["report", uri]) == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# ursa-ray report: tiny")
    assert "## Composite scores" in report and "## Compute cost" in report
    links = re.findall(r"\]\((figures/[^)]+)\)", report)
    assert links, report
    keys = set(_keys(out))
    for link in links:
        assert link in keys, link
    assert sorted(p.name for p in tmp_path.iterdir()) == ["object_store.yaml"]


def _add_trials(results: ResultsDirectory, ids: range, value: float = 0.0, failed: tuple[int, ...] = ()) -> None:
    for i in ids:
        status = "failed" if i in failed else "ok"
        metrics = [] if status == "failed" else [
            {"trial_id": f"t{i:03d}", "eval_set": "test", "metric": m, "value": value + i + k} for k, m in enumerate(("nll", "ece"))
        ]  # fmt: skip
        results.add({"trial_id": f"t{i:03d}", "status": status, "seed": i}, metrics)


def _tables(uri: str) -> dict[str, pd.DataFrame]:
    results = ResultsDirectory(uri)
    return {
        name: results.read(name)
        .sort_values(["trial_id", *(["metric"] if name == "metrics" else [])])
        .reset_index(drop=True)
        for name in ("trials", "metrics")
    }


def test_compact_on_an_object_store_follows_a_manifest(s3, monkeypatch):
    """Issue 26.13: on an object store every trial left one object per table for good.  compact now merges them
    into compacted parts named by a manifest that readers follow: a few objects per table, the same tables for
    ursa-ray's readers at every step (an interrupted compact included) and for plain Parquet readers after it,
    and reruns replace a trial's rows once.  Catches the old no-op compact and a reader that ignores the manifest."""
    uri = f"s3://{BUCKET}/compact/results?{s3}"
    results = ResultsDirectory(uri)
    _add_trials(results, range(30), failed=(4, 9))
    before = _tables(uri)
    assert results.compact() == {"trials": (30, 3), "metrics": (28, 1)}  # the failed trials' parts stay as they are
    keys = _keys(results.location)
    assert sorted(keys) == ["metrics.parquet/_manifest.json", "metrics.parquet/compacted-00000.parquet",
                            "trials.parquet/_manifest.json", "trials.parquet/compacted-00000.parquet",
                            "trials.parquet/t004.parquet", "trials.parquet/t009.parquet"]  # fmt: skip
    after = _tables(uri)
    for name in before:
        pd.testing.assert_frame_equal(after[name], before[name])
        plain = pd.read_parquet(f"{BUCKET}/compact/results/{name}.parquet", filesystem=results.location.fs)
        assert len(plain) == len(before[name])  # a plain reader of the folder: the same rows, once

    rerun = ResultsDirectory(uri)  # a rerun of a compacted trial and of a failed one
    _add_trials(rerun, [2, 4], value=100.0)
    metrics = _tables(uri)["metrics"]
    assert metrics.loc[metrics["trial_id"] == "t002", "value"].tolist() == [103.0, 102.0]  # ece, nll: once each
    assert metrics.loc[metrics["trial_id"] == "t004", "value"].tolist() == [105.0, 104.0]
    expected = _tables(uri)

    # a compact cut short after its manifest, before deleting what it replaced: readers see each row once,
    # and the next write finishes it
    _add_trials(rerun, range(30, 36))
    expected = _tables(uri)
    monkeypatch.setattr(ResultsDirectory, "_settle", staticmethod(lambda folder: None))
    ResultsDirectory(uri).compact()
    monkeypatch.undo()
    assert "trials.parquet/t031.parquet" in _keys(results.location)  # replaced, not yet deleted
    for name, frame in _tables(uri).items():
        pd.testing.assert_frame_equal(frame, expected[name])
    ResultsDirectory(uri).add({"trial_id": "t040", "status": "ok"})
    assert "trials.parquet/t031.parquet" not in _keys(results.location)
    assert len(_tables(uri)["trials"]) == len(expected["trials"]) + 1


def test_object_store_lock_is_a_lease_that_one_run_holds_at_a_time(s3):
    """Issue 26.13: object-store results were not locked.  The lock is a lease object: a second run is refused
    in one line while the first holds it, the holder renews it (a short lease outlives its length), and it is
    deleted at the end.  Catches an unlocked object store and a lease that is not renewed."""
    import json
    import time

    from ursa_ray.grid import GridError
    from ursa_ray.guard import results_lock
    from ursa_ray.lease import Lease

    where = Location.parse(f"s3://{BUCKET}/leased/results?{s3}")
    lock = where / ".lock"
    lines: list[str] = []
    with Lease(lock, lines.append, lease_s=0.9).held() as lease:
        assert lease.store.atomic  # S3 through boto3: conditional writes
        first = json.loads(lock.read_text())["expires_at"]
        time.sleep(1.5)  # longer than the lease: only a renewal keeps it
        with pytest.raises(GridError, match=r"in use by another ursa-ray run \(pid \d+ on "):
            with results_lock(where, lines.append):
                pass
        assert json.loads(lock.read_text())["expires_at"] > first
    assert not lock.exists() and lines == []
    with results_lock(where, lines.append):
        assert lock.exists()
    assert not lock.exists()


def test_drivers_starting_together_on_an_expired_lease_take_it_one_at_a_time(s3):
    """An expired lease (its holder killed) is taken over with a conditional write: of 6 drivers starting
    together, one holds it at a time, 8 times over.  Catches a takeover that reads, then writes unconditionally."""
    import json
    import socket
    import threading
    import time

    from ursa_ray.lease import Lease, LeaseRefused

    for repetition in range(8):
        lock = Location.parse(f"s3://{BUCKET}/expired/r{repetition}?{s3}") / ".lock"
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 1, "started_at": 0.0, "expires_at": 1.0}))
        barrier, guard = threading.Barrier(6), threading.Lock()
        holding, most, took, refused = [0], [0], [], []

        def driver(i: int) -> None:
            barrier.wait()
            try:
                with Lease(lock, lambda line: None).held():
                    with guard:
                        holding[0] += 1
                        most[0] = max(most[0], holding[0])
                    time.sleep(0.05)
                    with guard:
                        holding[0] -= 1
                    took.append(i)
            except LeaseRefused:
                refused.append(i)

        threads = [threading.Thread(target=driver, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert most[0] == 1 and took and len(took) + len(refused) == 6, (repetition, most, took, refused)
