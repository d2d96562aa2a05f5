"""The results directory is append-only: one part per trial and table, read as one table by pandas, pyarrow,
DuckDB and polars; a rerun replaces a trial's parts; ``compact`` merges parts without changing any reader's
view, even when it is interrupted; resume reads only the finished trial ids."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from ursa_ray import results as results_module
from ursa_ray.results import COMPACTED, METRIC_COLUMNS, TRIAL_COLUMNS, ResultsDirectory

duckdb = pytest.importorskip("duckdb", reason="needs duckdb (pip install -e '.[test]')")
polars = pytest.importorskip("polars", reason="needs polars (pip install -e '.[test]')")

TABLES = ("trials", "metrics", "points")
SORT = {"trials": ["trial_id"], "metrics": ["trial_id", "metric"], "points": ["trial_id", "point_id"]}


def _trial(i: int, status: str = "ok", value: float = 0.0) -> tuple[dict, list[dict], list[dict]]:
    trial_id = f"t{i:03d}"
    record = {"trial_id": trial_id, "status": status, "method": "sgd", "seed": i, "wall_s": 1.0 + i,
              "decision_task": False, "error": "" if status == "ok" else "RuntimeError: boom"}  # fmt: skip
    metrics = [] if status == "failed" else [
        {"trial_id": trial_id, "method": "sgd", "seed": i, "eval_set": "test", "metric": m, "value": value + k}
        for k, m in enumerate(("nll", "accuracy", "ece"))
    ]  # fmt: skip
    anchor = f"blr-c1-s{i % 2}"
    points = [
        {"trial_id": tid, "method": method, "repetition": i % 2, "point_id": p, "x": [p / 10], "mean": value + p}
        for tid, method in ((trial_id, "bd"), (anchor, "blr")) for p in range(3)
    ]  # fmt: skip
    return record, metrics, points


def _fill(path: Path, n: int = 12, failed: tuple[int, ...] = (3, 7)) -> ResultsDirectory:
    results = ResultsDirectory(path)
    for i in range(n):
        results.add(*_trial(i, "failed" if i in failed else "ok", value=float(i)))
    return results


def _views(path: Path) -> dict[str, dict[str, pd.DataFrame]]:
    """Every table as each of the four readers sees it, sorted, as plain frames."""
    views: dict[str, dict[str, pd.DataFrame]] = {}
    for name in TABLES:
        folder = path / f"{name}.parquet"
        frames = {
            "pandas": pd.read_parquet(folder),
            "pyarrow": pads.dataset(folder, format="parquet").to_table().to_pandas(),
            "duckdb": duckdb.sql(f"select * from read_parquet('{folder}/*.parquet')").df(),
            "polars": polars.read_parquet(folder).to_pandas(),
        }
        views[name] = {
            reader: frame.sort_values(SORT[name]).reset_index(drop=True)[
                ["trial_id"] + sorted(set(frame.columns) - {"trial_id"})
            ]
            for reader, frame in frames.items()
        }
    return views


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal rows and values (readers differ in how they type a column of nulls, so compare as Python objects)."""
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)

    def norm(v):
        if hasattr(v, "tolist"):
            v = v.tolist()
        if v is None or (isinstance(v, float) and v != v) or v is pd.NA:
            return None
        return v

    assert [[norm(v) for v in row] for row in a.itertuples(index=False)] == [
        [norm(v) for v in row] for row in b.itertuples(index=False)
    ]


def _check_readers_agree(path: Path, expected: dict[str, pd.DataFrame] | None = None) -> dict[str, pd.DataFrame]:
    views = _views(path)
    for name, by_reader in views.items():
        reference = expected[name] if expected else by_reader["pandas"]
        for reader, frame in by_reader.items():
            try:
                _same(frame, reference)
            except AssertionError:
                raise AssertionError(f"{reader} sees a different {name} table") from None
    return {name: by_reader["pandas"] for name, by_reader in views.items()}


def test_each_trial_adds_its_own_parts_and_every_reader_sees_one_table(tmp_path):
    _fill(tmp_path)
    trial_parts = sorted(p.name for p in (tmp_path / "trials.parquet").iterdir())
    assert trial_parts == [f"t{i:03d}.parquet" for i in range(12)]
    assert sorted(p.name for p in (tmp_path / "points.parquet").iterdir())[:2] == [
        "blr-c1-s0.parquet",
        "blr-c1-s1.parquet",
    ]
    tables = _check_readers_agree(tmp_path)
    assert len(tables["trials"]) == 12 and list(tables["trials"].columns) == ["trial_id"] + sorted(
        set(TRIAL_COLUMNS) - {"trial_id"}
    )
    assert len(tables["metrics"]) == 10 * 3 and set(tables["metrics"].columns) == set(METRIC_COLUMNS)
    assert len(tables["points"]) == 12 * 3 + 2 * 3  # the anchor's rows once per repetition
    (tmp_path / ".tables" / ".t999.parquet.abc.tmp").write_bytes(b"half a file")  # a write cut short
    _check_readers_agree(tmp_path, tables)


def test_compact_merges_parts_and_no_reader_sees_a_difference(tmp_path):
    results = _fill(tmp_path)
    before = _check_readers_agree(tmp_path)
    report = results.compact()
    assert report == {"trials": (12, 3), "metrics": (10, 1), "points": (14, 3)}  # failed t003, t007 stay parts
    assert sorted(p.name for p in (tmp_path / "trials.parquet").iterdir()) == [
        f"{COMPACTED}00000.parquet",
        "t003.parquet",
        "t007.parquet",
    ]
    _check_readers_agree(tmp_path, before)
    again = ResultsDirectory(tmp_path)
    assert again.compact() == {"trials": (3, 3), "metrics": (1, 1), "points": (3, 3)}  # nothing new
    assert sorted(p.name for p in (tmp_path / ".tables").iterdir()) == [
        "metrics.1",
        "points.1",
        "trials.1",
    ]  # old folders gone
    first = (tmp_path / "trials.parquet" / f"{COMPACTED}00000.parquet").stat()
    for i in range(12, 15):  # a later run adds trials: its compact merges only those, the first merged part stays
        again.add(*_trial(i))
    assert again.compact()["trials"] == (6, 4)
    assert (tmp_path / "trials.parquet" / f"{COMPACTED}00000.parquet").stat().st_ino == first.st_ino
    assert len(_check_readers_agree(tmp_path)["trials"]) == 15


def test_compact_reads_parts_a_few_at_a_time_and_rolls_its_merged_parts(tmp_path, monkeypatch):
    _fill(tmp_path, failed=())
    before = _check_readers_agree(tmp_path)
    monkeypatch.setattr(results_module, "PARTS_PER_READ", 5)  # 12 trial parts: read in batches of 5, 5 and 2
    monkeypatch.setattr(results_module, "ROWS_PER_COMPACTED_PART", 10)
    report = ResultsDirectory(tmp_path).compact()
    assert report["trials"] == (12, 2)  # batches of 5, 5 and 2 rows: 10 in the first merged part, 2 in the next
    assert report["metrics"] == (12, 3)  # batches of 15, 15 and 6 rows: a batch over the limit is a part of its own
    _check_readers_agree(tmp_path, before)


@pytest.mark.parametrize("where", ["building the merged folder", "after swapping, before removing the old folder"])
def test_an_interrupted_compact_changes_no_reader_view_and_the_next_one_finishes(tmp_path, monkeypatch, where):
    results = _fill(tmp_path)
    before = _check_readers_agree(tmp_path)
    if where == "building the merged folder":
        real, writes = pq.ParquetWriter.write_table, []

        def interrupted(self, *args, **kwargs):
            real(self, *args, **kwargs)
            writes.append(1)
            if len(writes) == 3:
                raise KeyboardInterrupt  # Ctrl-C after some parts are merged

        monkeypatch.setattr(results_module, "PARTS_PER_READ", 2)
        monkeypatch.setattr(results_module.pq.ParquetWriter, "write_table", interrupted)
    else:
        monkeypatch.setattr(results_module.shutil, "rmtree", lambda path: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        results.compact()
    monkeypatch.undo()
    assert len(list((tmp_path / ".tables").iterdir())) == 4  # one folder left over beside the three tables'
    _check_readers_agree(tmp_path, before)
    ResultsDirectory(tmp_path).compact()
    assert sorted(p.name for p in (tmp_path / ".tables").iterdir()) == ["metrics.1", "points.1", "trials.1"]
    _check_readers_agree(tmp_path, before)


@pytest.mark.parametrize("compacted", [False, True])
def test_a_rerun_replaces_a_failed_trial_in_every_reader(tmp_path, compacted):
    results = _fill(tmp_path)
    results.add(*_trial(5, "failed"))  # an ok trial replaced: it was compacted (rare), its rows go
    if compacted:
        results.compact()
    results = ResultsDirectory(tmp_path)  # a new run resumes
    assert results.finished_ids() == {f"t{i:03d}" for i in range(12)} - {"t003", "t005", "t007"}
    results.add(*_trial(3, "ok", value=100.0))
    results.add(*_trial(5, "ok", value=200.0))
    tables = _check_readers_agree(tmp_path)
    trials, metrics, points = tables["trials"], tables["metrics"], tables["points"]
    assert trials["trial_id"].is_unique and len(trials) == 12
    assert trials.set_index("trial_id").loc[["t003", "t005", "t007"], "status"].tolist() == ["ok", "ok", "failed"]
    assert sorted(metrics.loc[metrics["trial_id"] == "t005", "value"]) == [200.0, 201.0, 202.0]  # one set: the rerun's
    assert sorted(points.loc[points["trial_id"] == "t003", "mean"]) == [100.0, 101.0, 102.0]
    assert len(points[points["trial_id"] == "blr-c1-s1"]) == 3  # the shared anchor rows still once
    assert sorted(results.trials()["trial_id"]) == sorted(trials["trial_id"])  # the driver's own view agrees


def test_resume_reads_the_finished_ids_without_reading_any_metric(tmp_path):
    _fill(tmp_path)
    for part in (tmp_path / "metrics.parquet").iterdir():
        part.write_bytes(b"not parquet")  # any read of the metrics would fail
    assert ResultsDirectory(tmp_path).finished_ids() == {f"t{i:03d}" for i in range(12)} - {"t003", "t007"}


def test_a_directory_of_the_older_single_file_layout_is_adopted(tmp_path):
    record, metrics, points = _trial(0)
    pd.DataFrame([record]).to_parquet(tmp_path / "trials.parquet")  # as ursa-ray wrote it before parts
    pd.DataFrame(metrics).to_parquet(tmp_path / "metrics.parquet")
    (tmp_path / "points.parquet").mkdir()
    pd.DataFrame(points[:3]).to_parquet(tmp_path / "points.parquet" / "t000.parquet")
    results = ResultsDirectory(tmp_path)
    assert results.finished_ids() == {"t000"}
    results.add(*_trial(1))
    tables = _check_readers_agree(tmp_path)
    assert sorted(tables["trials"]["trial_id"]) == ["t000", "t001"] and len(tables["metrics"]) == 6
    assert all((tmp_path / f"{name}.parquet").is_symlink() for name in TABLES)


def test_a_column_outside_the_schema_is_refused(tmp_path):
    with pytest.raises(ValueError, match="trials rows have columns outside the trials table's schema: colour"):
        ResultsDirectory(tmp_path).add({"trial_id": "t", "status": "ok", "colour": "red"})
    assert not (tmp_path / "trials.parquet").exists() or not os.listdir(tmp_path / "trials.parquet")


def test_compact_cli_merges_and_refuses_a_folder_without_results(tmp_path, capsys):
    from ursa_ray.cli import main

    _fill(tmp_path / "out")
    assert main(["compact", str(tmp_path / "out")]) == 0
    assert "trials 12 -> 3 part files" in capsys.readouterr().out
    assert main(["compact", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no trials.parquet" in err
    shutil.rmtree(tmp_path / "out" / ".tables")  # links to nowhere: still refused with one line
    assert main(["compact", str(tmp_path / "out")]) == 2


def _truncate(part: Path) -> None:
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])


def _error_line(capsys) -> str:
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in printed.out + printed.err, (
        printed.err
    )
    return lines[0]


def test_a_truncated_part_is_named_in_one_line_and_run_reruns_its_trial(tmp_path, capsys, monkeypatch):
    """Issue 27.8: a truncated part file made report, compact and run end in a traceback with exit 1.  Now report
    and compact name the file in one line (exit 2, nothing changed), and run, before Ray starts, removes the
    damaged trial's rows so that it is rerun (the rest stays finished).  Catches reading the parts unchecked."""
    import yaml

    import ursa_ray.tune.runner
    from ursa_ray.cli import main
    from ursa_ray.tune.callback import RunSummary

    out = tmp_path / "results"
    _fill(out, n=6, failed=())
    _truncate(out / "metrics.parquet" / "t004.parquet")
    before = sorted(p.name for p in (out / "metrics.parquet").iterdir())
    for command in ("report", "compact"):
        assert main([command, str(out)]) == 2
        line = _error_line(capsys)
        assert f"{out}/metrics.parquet/t004.parquet: damaged Parquet part file" in line and "reruns trial t004" in line
    assert sorted(p.name for p in (out / "metrics.parquet").iterdir()) == before

    seen = []
    monkeypatch.setattr(
        ursa_ray.tune.runner,
        "run_grid",
        lambda grid, where, **kw: seen.append(ResultsDirectory(where).finished_ids()) or RunSummary(),
    )
    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump({"name": "g", "methods": ["sgd"], "models": ["mlp"], "datasets": ["digits"], "seeds": 1})
    )
    assert main(["run", str(grid), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "metrics.parquet/t004.parquet: damaged" in printed.out and "it is rerun" in printed.out
    assert seen == [{f"t{i:03d}" for i in range(6)} - {"t004"}]  # what the run was handed: t004 unfinished
    assert not any((out / f"{name}.parquet" / "t004.parquet").exists() for name in TABLES)
    assert ResultsDirectory(out).damaged_parts() == []


def test_a_damaged_compacted_part_stops_run_before_ray_in_one_line(tmp_path, capsys, monkeypatch):
    """A compacted part holds many trials' rows: run cannot tell which to rerun, so it refuses (exit 2) naming
    the file and how to recover, and changes nothing."""
    import yaml

    import ursa_ray.tune.runner
    from ursa_ray.cli import main

    out = tmp_path / "results"
    _fill(out, n=6, failed=()).compact()
    part = next((out / "trials.parquet").glob(f"{COMPACTED}*.parquet"))
    _truncate(part)
    monkeypatch.setattr(ursa_ray.tune.runner, "run_grid", lambda *a, **kw: pytest.fail("Ray must not start"))
    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump({"name": "g", "methods": ["sgd"], "models": ["mlp"], "datasets": ["digits"], "seeds": 1})
    )
    assert main(["run", str(grid), "--out", str(out)]) == 2
    line = _error_line(capsys)
    assert f"trials.parquet/{part.name}: damaged Parquet part file" in line and "restore it from a copy" in line
    assert main(["report", str(out)]) == 2
    assert part.name in _error_line(capsys)
