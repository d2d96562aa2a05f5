"""Bad input as a new user gives it (issue 27): grids, data files, results directories and plug-ins that
cannot run.  Each ends before any trial in ONE line on stderr naming the file, the field and what is allowed,
with exit status 2 and nothing written, through ``ursa-ray validate`` and ``ursa-ray run`` alike (both fail
before Ray starts).  Two cases need a run (the last section, one Ray for the module): a request no node can
meet, and a deleted metrics table (reported by ``report``, restored by a rerun)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from ursa_ray import data
from ursa_ray.cli import main
from ursa_ray.grid import MAX_SEED, MAX_YAML_NODES, check_data, load_grid
from ursa_ray.guard import grid_fingerprint, record_grid
from ursa_ray.results import Location

N_TRAIN, N_TEST = 12, 6


def tabular(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(N_TRAIN + N_TEST) % 2
    x = rng.normal(size=(N_TRAIN + N_TEST, 3))
    return {"x_train": x[:N_TRAIN], "y_train": y[:N_TRAIN], "x_test": x[N_TRAIN:], "y_test": y[N_TRAIN:]}


def images(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """uint8 images of ``shape`` per example (any layout), labels 0/1."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(N_TRAIN + N_TEST, *shape), dtype=np.uint8)
    y = np.arange(N_TRAIN + N_TEST) % 2
    return {"x_train": x[:N_TRAIN], "y_train": y[:N_TRAIN], "x_test": x[N_TRAIN:], "y_test": y[N_TRAIN:]}


def npz(folder: Path, name: str = "my.npz", **changes: Any) -> None:
    arrays = {**tabular(), **changes}
    np.savez(folder / name, **arrays)


def entry(path: str = "my.npz", **file: Any) -> dict[str, Any]:
    return {"name": "my_data", "file": {"format": "npz", "path": path, "task": "classification", **file}}


GRID: dict[str, Any] = {
    "name": "bad_input",
    "methods": [{"name": "sgd", "hyperparameters": {"epochs": 1}}],
    "models": [{"name": "mlp", "options": {"widths": [4]}}],
    "datasets": [entry()],
    "seeds": 1,
    "budget": {"batch_size": 8},
    "corruptions": {"types": []},
    "bit_depths": [],
}


def grid_text(**changes: Any) -> str:
    return yaml.safe_dump({**GRID, **changes}, sort_keys=False)


def files(folder: Path) -> set[tuple[str, int]]:
    """Every file under ``folder`` with its size: what "nothing written" compares."""
    return {(str(p.relative_to(folder)), p.lstat().st_size) for p in folder.rglob("*")}


def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """``ursa-ray ARGS`` in this process: exit status 2 and one line ``error: ...`` on stderr; returns it."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: Path, prefix: str, message: str) -> None:
    """``validate`` and ``run`` both refuse ``grid`` in one line starting ``error: <prefix>`` and holding
    ``message``, and neither writes anything (``run``'s --out never appears)."""
    before = files(tmp_path)
    for args in (["validate", str(grid)], ["run", str(grid), "--out", str(tmp_path / "results")]):
        err = one_line_error(capsys, args)
        assert err.startswith(f"error: {prefix}") and message in err, err
        assert files(tmp_path) == before


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # validate: no resource check, no Ray


# --------------------------------------------------------------------------------------------------
# Grid files.


def _bomb() -> str:
    """A "billion laughs" description: 9 levels of 9 aliases, 9^9 (387 million) strings once expanded."""
    lines = ["description:", '  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"  {name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return grid_text() + "\n".join(lines) + "\n"


GRID_FILES: dict[str, tuple[Callable[[], str | bytes], str, str]] = {
    # case: (the file's content, the field after "GRID: ", what the message says)
    "duplicate key": (lambda: grid_text() + "seeds: 2\n", "line ", "key 'seeds' appears twice (first on line"),
    "duplicate nested key": (
        lambda: grid_text().replace(
            "  hyperparameters:\n    epochs: 1\n", "  hyperparameters:\n    epochs: 1\n    epochs: 2\n"
        ),
        "line ",
        "key 'epochs' appears twice",
    ),
    "yaml alias bomb": (_bomb, "line ", f"expands to more than {MAX_YAML_NODES:,} values through its aliases"),
    "nested too deeply": (
        lambda: grid_text() + "description: " + "[" * 5000 + "]" * 5000 + "\n",
        "YAML: ",
        "nested too deeply to read",
    ),
    "not utf-8": (lambda: grid_text().encode() + "description: café\n".encode("latin-1"), "byte ", "not UTF-8 text"),
    "name escapes results/": (lambda: grid_text(name="../../x"), "name: ", "the name is the folder results/<name>"),
    "name with a separator": (lambda: grid_text(name="a/b"), "name: ", "starting with a letter or digit"),
    "huge seed": (
        lambda: grid_text(seeds=[99999999999999999999]),
        "seeds[0]: ",
        f"expected an integer in [0, {MAX_SEED}]",
    ),
    "seed past 2^31": (lambda: grid_text(seeds=[0, 2**31]), "seeds[1]: ", "(2^31 - 1), got 2147483648"),
    "a billion seeds": (
        lambda: grid_text(seeds=10**9),
        "seeds: ",
        "1 cells x 1,000,000,000 seeds = 1,000,000,000 final trials, more than max_trials (100,000)",
    ),
    "nan learning rate": (
        lambda: grid_text().replace("epochs: 1", "epochs: 1\n    lr: .nan"),
        "methods[0].hyperparameters.lr: ",
        "expected a finite number, got nan",
    ),
    "infinite learning rate": (
        lambda: grid_text().replace("epochs: 1", "epochs: 1\n    lr: .inf"),
        "methods[0].hyperparameters.lr: ",
        "expected a finite number, got inf",
    ),
    "nan in a search space": (
        lambda: grid_text(search={"n_trials": 2}).replace(
            "epochs: 1\n", "epochs: 1\n  search:\n    lr: {type: uniform, low: .nan, high: 0.1}\n"
        ),
        "methods[0].search.lr: ",
        "expected a finite number, got nan",
    ),
    "infinite search budget": (
        lambda: grid_text(search={"cpu_seconds": float("inf")}),
        "search.cpu_seconds: ",
        "expected a positive number, got inf",
    ),
    "description not text": (lambda: grid_text(description=[1, 2]), "description: ", "expected a string"),
    "unknown calibration": (
        lambda: grid_text(methods=[{"name": "sgd", "calibrate": "isotonic"}]),
        "methods[0].calibrate: ",
        "expected one of temperature, got 'isotonic'",
    ),
}


@pytest.mark.parametrize("case", list(GRID_FILES))
def test_a_bad_grid_file_is_one_line_and_writes_nothing(case, tmp_path, capsys):
    content, field, message = GRID_FILES[case]
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    text = content()
    grid.write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(tmp_path, capsys, grid, f"{grid}: {field}", message)


def test_a_billion_seeds_validate_in_little_memory(tmp_path, capsys):
    """Validation counts trials without building them: a grid of 10^9 seeds that allows them answers
    with its count, allocating a few MB (tracemalloc peak; the process's peak RSS barely moves)."""
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(seeds=10**9, max_trials=10**9))
    main(["validate", str(grid)])  # imports and loads everything once, outside the measurement
    capsys.readouterr()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    try:
        assert main(["validate", str(grid)]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "1 cells x 1,000,000,000 seeds = 1,000,000,000 final trials" in capsys.readouterr().out
    assert peak < 50 * 2**20, peak
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 2**10


# --------------------------------------------------------------------------------------------------
# Data files.


def _write_png_folder(root: Path, corrupt: bool) -> None:
    for part in ("train", "test"):
        for label in ("a", "b"):
            folder = root / part / label
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.full((4, 4), 40 * i, np.uint8), mode="L").save(folder / f"{i}.png")
    if corrupt:
        (root / "train" / "a" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")


def _id_column_as_label(folder: Path) -> None:
    """A Parquet table whose label is a row id (10^12 and up)."""
    arrays = tabular()
    frame = pd.DataFrame(np.vstack([arrays["x_train"], arrays["x_test"]]), columns=["a", "b", "c"])
    frame["row_id"] = 10**12 + np.arange(N_TRAIN + N_TEST)
    frame["split"] = ["train"] * N_TRAIN + ["test"] * N_TEST
    frame.to_parquet(folder / "t.parquet")


def _symlink_loop(folder: Path) -> None:
    (folder / "loop.npz").symlink_to(folder / "loop.npz")


DATA_FILES: dict[str, tuple[Callable[[Path], None], dict[str, Any], str, str]] = {
    # case: (write the files, the dataset entry, the field after "datasets[0].", what the message says)
    "label 2^40": (
        lambda p: npz(p, y_train=np.r_[0, 1, 2**40, np.zeros(N_TRAIN - 3, int)]),
        entry(),
        "file.path",
        "holds label 1099511627776: at most 100,000 classes",
    ),
    "an id column as the label": (
        _id_column_as_label,
        {
            "name": "tab",
            "file": {"format": "parquet", "path": "t.parquet", "task": "classification", "label": "row_id"},
        },
        "file.label",
        "holds label 1000000000011: at most 100,000 classes",
    ),
    "images channels in 2": (
        lambda p: npz(p, **images((8, 8, 2))),
        entry(),
        "file.path",
        "images have 1 (grayscale) or 3 (RGB) channels",
    ),
    "images of size 0": (lambda p: npz(p, **images((0, 0))), entry(), "file.path", "an example of size 0"),
    "features of size 0": (
        lambda p: npz(p, x_train=np.zeros((N_TRAIN, 0)), x_test=np.zeros((N_TEST, 0))),
        entry(),
        "file.path",
        "an example of size 0",
    ),
    "symlink loop": (_symlink_loop, entry("loop.npz"), "file.path", "cannot resolve 'loop.npz'"),
    # already refused before issue 27; kept so that no change reopens them
    "nan pixels": (
        lambda p: npz(
            p,
            x_train=np.where(np.arange(N_TRAIN * 16).reshape(N_TRAIN, 4, 4) == 5, np.nan, 0.5),
            x_test=np.full((N_TEST, 4, 4), 0.5),
        ),
        entry(),
        "file.path",
        "x_train holds 1 NaN or infinite value(s)",
    ),
    "string labels": (
        lambda p: npz(p, y_train=np.array(["cat", "dog"] * (N_TRAIN // 2))),
        entry(),
        "file.path",
        "y_train must hold numbers, got dtype <U3",
    ),
    "corrupt png": (
        lambda p: _write_png_folder(p / "imgs", corrupt=True),
        {"name": "i", "file": {"format": "image_folder", "path": "imgs", "task": "classification"}},
        "file.path",
        "cannot read image ",
    ),
}


@pytest.mark.parametrize("case", list(DATA_FILES))
def test_a_bad_data_file_is_one_line_and_writes_nothing(case, tmp_path, capsys):
    write, dataset, field, message = DATA_FILES[case]
    write(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(datasets=[dataset]))
    refused(tmp_path, capsys, grid, f"{grid}: datasets[0].{field}: ", message)


def test_a_data_root_in_a_symlink_loop_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("URSA_DATA", raising=False)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(datasets=["mnist"], data_root=str(tmp_path / "loop")))
    refused(
        tmp_path, capsys, grid, f"{grid}: datasets[0]: ", f"place torchvision's MNIST files under {tmp_path / 'loop'}"
    )


def test_channels_last_images_are_read_as_channels_first(tmp_path):
    """(n, H, W, 3) is RGB with its channels last: read as (n, 3, H, W), normalised per channel."""
    arrays = images((5, 7, 3))
    np.savez(tmp_path / "my.npz", **arrays)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(adversarial={"epsilons": [0.1]}))
    loaded = load_grid(grid)
    check_data(loaded)
    ds = data.dataset_spec("my_data", loaded.datasets[0].file).load({}, (), Path(), False, 0)
    assert ds.input_shape == (3, 5, 7)
    pixels = arrays["x_train"].astype(np.float64) / 255
    np.testing.assert_allclose(ds.pixel_mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-6)  # pixels held in float32
    np.testing.assert_allclose(ds.pixel_std, pixels.std(axis=(0, 1, 2)), rtol=1e-6)
    first = (pixels[0].transpose(2, 0, 1) - np.reshape(ds.pixel_mean, (3, 1, 1))) / np.reshape(ds.pixel_std, (3, 1, 1))
    np.testing.assert_allclose(ds.train_x[0].numpy(), first, rtol=1e-5, atol=1e-6)


def test_changed_data_is_another_grid_for_a_results_directory(tmp_path, capsys):
    """The trial ids (and so the grid's fingerprint) hash the dataset's file block and its files' content: a
    results directory of the grid on one file refuses the same grid on another file, or on the same file
    with other content, instead of counting its trials as finished."""
    npz(tmp_path, "a.npz")
    npz(tmp_path, "b.npz", x_train=tabular(seed=2)["x_train"])
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(datasets=[entry("a.npz")]))
    first = load_grid(grid)
    out = Location.parse(tmp_path / "results")
    out.local_path.mkdir()
    record_grid(out, first, grid_fingerprint(first))  # what a finished run leaves
    before = files(tmp_path)

    grid.write_text(grid_text(datasets=[entry("b.npz")]))  # the same name, another file (other data)
    err = one_line_error(capsys, ["run", str(grid), "--out", str(out)])
    assert err.startswith(f"error: {out}: holds the results of another grid"), err
    grid.write_text(grid_text(datasets=[entry("a.npz")]))
    npz(tmp_path, "a.npz", x_train=tabular(seed=1)["x_train"])  # the same file, other content
    err = one_line_error(capsys, ["run", str(grid), "--out", str(out)])
    assert err.startswith(f"error: {out}: holds the results of another grid"), err
    assert {f for f in files(tmp_path) if not f[0].endswith(".npz")} == {f for f in before if not f[0].endswith(".npz")}

    ids = {load_grid(grid).trial_specs()[0].trial_id, first.trial_specs()[0].trial_id}
    assert len(ids) == 2
    npz(tmp_path, "a.npz")  # the content back: the same trial again
    assert load_grid(grid).trial_specs()[0].trial_id == first.trial_specs()[0].trial_id
    moved = tmp_path / "moved"  # the project moved: paths differ, data and ids do not
    moved.mkdir()
    for name in ("grid.yaml", "a.npz"):
        (moved / name).write_bytes((tmp_path / name).read_bytes())
    again = load_grid(moved / "grid.yaml")
    assert again.datasets[0].file["path"] != first.datasets[0].file["path"]
    assert again.trial_specs()[0].trial_id == first.trial_specs()[0].trial_id


# --------------------------------------------------------------------------------------------------
# Results directories.


def _results_directory(tmp_path: Path) -> Path:
    results = tmp_path / "r"
    (results / "trials.parquet").mkdir(parents=True)
    pd.DataFrame({"trial_id": ["x"], "status": ["ok"]}).to_parquet(results / "trials.parquet" / "x.parquet")
    return results


OUTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a table folder": (lambda p: _results_directory(p) / "trials.parquet", "inside the results directory "),
    "a folder in a results directory": (lambda p: _results_directory(p) / "sub", "inside the results directory "),
    # already refused before issue 27
    "a file": (lambda p: (p / "f").write_text("x") and p / "f", "is a file, not a results directory"),
    "read-only": (lambda p: Path("/proc/ursa-ray-results"), "cannot write in /proc"),
}


@pytest.mark.parametrize("case", list(OUTS))
def test_an_out_that_cannot_hold_results_is_one_line_and_writes_nothing(case, tmp_path, capsys):
    make, message = OUTS[case]
    out = make(tmp_path)
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text())
    before = files(tmp_path)
    err = one_line_error(capsys, ["run", str(grid), "--out", str(out)])
    assert err.startswith(f"error: --out {out}: ") and message in err, err
    assert files(tmp_path) == before


# --------------------------------------------------------------------------------------------------
# Plug-ins.


PLUGINS = {
    "sys.exit(0) on import": ("import sys\nsys.exit(0)\n", "cannot load: SystemExit: 0"),
    "KeyboardInterrupt on import": ("raise KeyboardInterrupt\n", "cannot load: KeyboardInterrupt"),
    "ImportError on import": ("import no_such_package_27\n", "cannot load: ModuleNotFoundError: No module named"),
}


@pytest.mark.parametrize("case", list(PLUGINS))
def test_a_plugin_that_exits_or_breaks_on_import_is_a_broken_plugin(case, tmp_path, capsys, monkeypatch):
    source, message = PLUGINS[case]
    module = f"plugin27_{list(PLUGINS).index(case)}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)  # import paths are found from the current directory
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__: nothing written at all
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(methods=[f"{module}:Method"]))
    refused(
        tmp_path,
        capsys,
        grid,
        f"{grid}: methods[0].name: plug-in method '{module}:Method' (import path) is broken: ",
        message,
    )


@pytest.mark.slow
def test_the_command_exits_2_on_a_plugin_calling_sys_exit_0(tmp_path):
    """The real command (its own process): ``sys.exit(0)`` in a plug-in is not a silent success."""
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(methods=["quits:Method"]))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ursa_ray.cli", "validate", str(grid)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "is broken: cannot load: SystemExit: 0" in done.stderr, done.stderr


# --------------------------------------------------------------------------------------------------
# Through a run (one Ray for these).


def test_a_request_no_node_can_meet_is_one_line_and_writes_nothing(ray_session, tmp_path, capsys):
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text(resources={"cpu": 1, "gpu": 64}))
    before = files(tmp_path)
    err = one_line_error(capsys, ["run", str(grid), "--out", str(tmp_path / "results")])
    assert err.startswith(f"error: {grid}: resources: ") and "which no node of the Ray cluster has" in err, err
    assert files(tmp_path) == before


@pytest.mark.slow
def test_a_deleted_metrics_table_is_reported_and_restored_by_a_rerun(ray_session, tmp_path, capsys):
    npz(tmp_path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(grid_text())
    out = tmp_path / "results"
    assert main(["run", str(grid), "--out", str(out)]) == 0
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert not metrics.empty
    (out / "metrics.parquet").unlink()  # a link to the table's folder: the table is gone for every reader

    err = one_line_error(capsys, ["report", str(out)])
    assert err == (
        f"error: {out}: metrics.parquet is missing though 1 trial(s) finished; run the same "
        f"`ursa-ray run GRID --out {out}` again to restore it (every trial reruns)\n"
    )
    assert main(["run", str(grid), "--out", str(out)]) == 0
    assert "1 ok, 0 failed" in capsys.readouterr().out
    restored = pd.read_parquet(out / "metrics.parquet")
    key = ["eval_set", "metric"]
    assert (
        restored.sort_values(key)[key]
        .reset_index(drop=True)
        .equals(metrics.sort_values(key)[key].reset_index(drop=True))
    )
    assert main(["report", str(out)]) == 0
