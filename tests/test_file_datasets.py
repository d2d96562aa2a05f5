"""Datasets read from files a grid names (.npz, Parquet, an image folder): small files written in each real
format, loaded through the same path as a trial (the grid's trial spec → ``data.dataset_spec``), every bad
file reported in one line by ``validate`` and ``run`` before anything is written, and one run through Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from ursa_ray import data
from ursa_ray.cli import main
from ursa_ray.grid import check_data, load_grid
from ursa_ray.trial import run_trial

RNG_SEED = 0
N_TRAIN, N_TEST, N_FEATURES, N_CLASSES = 60, 30, 4, 3
SCALES = np.array([1.0, 10.0, 0.1, 100.0])


def tabular(n_train: int = N_TRAIN, n_test: int = N_TEST, seed: int = RNG_SEED) -> dict[str, np.ndarray]:
    """Features on very different scales and labels 0..2 (each class in training)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 1.0, (n_train + n_test, N_FEATURES)) * SCALES
    y = np.arange(n_train + n_test) % N_CLASSES
    return {"x_train": x[:n_train], "y_train": y[:n_train], "x_test": x[n_train:], "y_test": y[n_train:]}


def write_grid(folder: Path, entry: dict[str, Any], **extra: Any) -> Path:
    grid = {
        "name": "from_files",
        "methods": [{"name": "sgd", "hyperparameters": {"epochs": 1}}],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": [entry],
        "seeds": 1,
        "resources": {"cpu": 1},
        "budget": {"batch_size": 32},
        "corruptions": {"types": ["gaussian_noise"], "severities": [1], "n_examples": 10},
        "adversarial": {"n_examples": 10, "attack_samples": 1, "pgd_steps": 2},
        "bit_depths": [],
        **extra,
    }
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def npz_entry(path: str = "my.npz", **file: Any) -> dict[str, Any]:
    return {"name": "my_data", "file": {"format": "npz", "path": path, "task": "classification", **file}}


def first_spec(grid_path: Path) -> dict[str, Any]:
    grid = load_grid(grid_path)
    check_data(grid)
    return grid.trial_specs()[0]


def load_as_trial(grid_path: Path) -> data.base.Dataset:
    """The dataset exactly as a trial resolves and loads it from its spec."""
    spec = first_spec(grid_path)
    return data.dataset_spec(spec.dataset, spec.dataset_file).load(
        spec.dataset_options, tuple(spec.ood), data.base.data_root(spec.data_root), spec.download, 0
    )


# --------------------------------------------------------------------------------------------------
# Loading each format.


def test_npz_tabular_is_standardised_with_training_statistics_only(tmp_path):
    arrays = tabular()
    np.savez(tmp_path / "my.npz", **arrays)
    np.savez(tmp_path / "ood.npz", x_test=np.full((7, N_FEATURES), 1000.0), x_train=np.zeros((2, 9)))
    ds = load_as_trial(write_grid(tmp_path, npz_entry(ood={"far": "ood.npz"})))
    mean, std = arrays["x_train"].mean(0), arrays["x_train"].std(0)
    assert ds.task == "classification" and ds.n_outputs == N_CLASSES and ds.input_shape == (N_FEATURES,)
    assert ds.train_x.shape == (N_TRAIN, N_FEATURES) and ds.test_x.shape == (N_TEST, N_FEATURES)
    np.testing.assert_allclose(ds.train_x.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(ds.train_x.std(0, unbiased=False), 1.0, atol=1e-5)
    np.testing.assert_allclose(ds.test_x, (arrays["x_test"] - mean) / std, rtol=1e-5, atol=1e-5)
    assert set(ds.ood) == {"far"} and ds.ood["far"].shape == (7, N_FEATURES)  # the OOD file's test part only
    np.testing.assert_allclose(ds.ood["far"][0], (1000.0 - mean) / std, rtol=1e-5)
    assert ds.train_y.dtype == torch.int64 and ds.train_y.tolist() == arrays["y_train"].tolist()
    assert ds.pixel_mean is None and ds.pixel_std is None  # tabular: no pixels, so no attacks or corruptions


def test_npz_images_get_per_channel_pixel_statistics(tmp_path):
    rng = np.random.default_rng(RNG_SEED)
    images = rng.integers(0, 256, (40, 3, 6, 6), dtype=np.uint8)
    images[:, 2] //= 4  # a darker third channel
    labels = np.arange(40) % 2
    np.savez(tmp_path / "img.npz", x_train=images[:30], y_train=labels[:30], x_test=images[30:], y_test=labels[30:])
    grid = write_grid(tmp_path, npz_entry("img.npz"), adversarial={"epsilons": [0.1], "n_examples": 10})
    ds = load_as_trial(grid)
    pixels = images[:30].astype(np.float64) / 255.0
    assert ds.input_shape == (3, 6, 6)
    np.testing.assert_allclose(ds.pixel_mean, pixels.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(ds.pixel_std, pixels.std(axis=(0, 2, 3)), rtol=1e-6)
    restored = ds.test_x * torch.tensor(ds.pixel_std).view(1, 3, 1, 1) + torch.tensor(ds.pixel_mean).view(1, 3, 1, 1)
    np.testing.assert_allclose(restored, images[30:] / 255.0, atol=1e-5)


def test_npz_grayscale_images_of_shape_n_h_w_get_one_channel(tmp_path, capsys):
    rng = np.random.default_rng(RNG_SEED)
    images = rng.uniform(0.0, 1.0, (20, 5, 7))  # floats in [0, 1]
    labels = np.arange(20) % 2
    np.savez(tmp_path / "g.npz", x_train=images[:15], y_train=labels[:15], x_test=images[15:], y_test=labels[15:])
    grid = write_grid(tmp_path, npz_entry("g.npz"))
    assert main(["validate", str(grid)]) == 2  # images need the grid's epsilons (pixel units)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {grid}: adversarial.epsilons: ") and "'my_data'" in err and "\n" not in err
    grid = write_grid(tmp_path, npz_entry("g.npz"), adversarial={"epsilons": [0.1], "n_examples": 5})
    ds = load_as_trial(grid)
    assert ds.input_shape == (1, 5, 7) and len(ds.pixel_mean) == 1
    assert ds.pixel_mean[0] == pytest.approx(images[:15].mean(), rel=1e-6)


N_STEPS, N_STEP_FEATURES = 6, 3


def sequences(
    n_train: int = N_TRAIN, n_test: int = N_TEST, steps: int = N_STEPS, seed: int = RNG_SEED, pad: float = 0.0
):
    """Sequences (n, steps, 3) of 2..steps real steps (``lengths_*``), every step past a length set to ``pad``
    (zeros, as Keras's pad_sequences writes), features on different scales; labels 0..2."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = rng.normal(5.0, 1.0, (n, steps, N_STEP_FEATURES)) * SCALES[:N_STEP_FEATURES]
    lengths = rng.integers(2, steps + 1, n)
    lengths[0] = steps  # one full-length sequence
    x[np.arange(steps) >= lengths[:, None]] = pad
    y = np.arange(n) % N_CLASSES
    return {
        "x_train": x[:n_train],
        "y_train": y[:n_train],
        "lengths_train": lengths[:n_train],
        "x_test": x[n_train:],
        "y_test": y[n_train:],
        "lengths_test": lengths[n_train:],
    }


def test_npz_sequences_are_padded_with_nan_and_standardised_over_real_steps(tmp_path):
    arrays = sequences(pad=1.0e6)  # padding that would swamp the statistics if it were counted
    np.savez(tmp_path / "seq.npz", **arrays)
    ood = sequences(n_train=0, n_test=5, steps=N_STEPS + 3, seed=1)  # longer sequences, NaN padded, no lengths
    ood_x = ood["x_test"].copy()
    ood_x[np.arange(N_STEPS + 3) >= ood["lengths_test"][:, None]] = np.nan
    np.savez(tmp_path / "ood.npz", x_test=ood_x)
    lstm = [{"name": "lstm", "options": {"hidden": 4}}]  # padded sequences: a model that reads them
    grid = write_grid(tmp_path, npz_entry("seq.npz", layout="sequence", ood={"longer": "ood.npz"}), models=lstm)
    spec = first_spec(grid)
    assert not data.dataset_spec(spec.dataset, spec.dataset_file).images
    ds = load_as_trial(grid)
    assert ds.input_shape == (N_STEPS, N_STEP_FEATURES) and ds.pixel_mean is None  # no pixels: no attacks
    real = np.arange(N_STEPS) < arrays["lengths_train"][:, None]
    steps = arrays["x_train"][real]  # (real steps, features)
    mean, std = steps.mean(0), steps.std(0)
    for part in ("train", "test"):
        x, lengths = getattr(ds, f"{part}_x").numpy(), arrays[f"lengths_{part}"]
        padding = np.arange(N_STEPS) >= lengths[:, None]
        assert np.isnan(x[padding]).all() and not np.isnan(x[~padding]).any()
        np.testing.assert_allclose(x[~padding], (arrays[f"x_{part}"][~padding] - mean) / std, rtol=1e-5, atol=1e-5)
    assert ds.ood["longer"].shape == (5, N_STEPS + 3, N_STEP_FEATURES)
    ood_real = ~np.isnan(ood_x).all(axis=2)
    np.testing.assert_allclose(ds.ood["longer"].numpy()[ood_real], (ood_x[ood_real] - mean) / std, rtol=1e-5, atol=1e-5)
    assert np.isnan(ds.ood["longer"].numpy()[~ood_real]).all()


def test_a_sequence_file_runs_through_a_trial_with_lstm(tmp_path, capsys):
    np.savez(tmp_path / "seq.npz", **sequences())
    np.savez(tmp_path / "ood.npz", x_test=sequences(n_train=0, n_test=8, seed=1)["x_test"][..., ::-1] * 3)
    grid = write_grid(
        tmp_path,
        npz_entry("seq.npz", layout="sequence", ood={"far": "ood.npz"}),
        models=[{"name": "lstm", "options": {"hidden": 4}}],
        bit_depths=["int8"],
    )
    assert main(["validate", str(grid)]) == 0, capsys.readouterr().err  # no epsilons asked: sequences have no pixels
    outcome = run_trial(first_spec(grid), torch.device("cpu"))
    values = {(m["eval_set"], m["metric"]): m["value"] for m in outcome.metrics}
    assert {m["eval_set"] for m in outcome.metrics} == {"test", "far", "cost", "test@int8", "far@int8"}
    assert 0.0 <= values["test", "accuracy"] <= 1.0 and np.isfinite(values["test", "nll"])
    assert np.isfinite(values["far", "ood_auroc_entropy"])


def test_padded_sequences_paired_with_a_model_that_cannot_read_them_are_refused(tmp_path, capsys):
    """An MLP (or any model but the recurrent ones) would put the padding's NaN into every output: the grid
    is refused in one line naming the models field, the model and the ones that can read padding; the same
    file without padding (every sequence full length) may go to an MLP."""
    np.savez(tmp_path / "seq.npz", **sequences())
    models = [{"name": "mlp", "options": {"widths": [8]}}, {"name": "lstm", "options": {"hidden": 4}}]
    grid = write_grid(tmp_path, npz_entry("seq.npz", layout="sequence"), models=models)
    assert main(["validate", str(grid)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{grid}: models: mlp cannot read the padded sequences of 'my_data'" in err
    assert err.endswith("models that can: gru, lstm")
    full = sequences()
    full["lengths_train"][:], full["lengths_test"][:] = N_STEPS, N_STEPS  # every step real: no padding
    np.savez(tmp_path / "seq.npz", **full)
    assert main(["validate", str(grid)]) == 0, capsys.readouterr().err


def test_parquet_one_table_with_a_split_column(tmp_path):
    arrays = tabular()
    columns = ["a", "b", "c", "d"]
    frame = pd.DataFrame(np.vstack([arrays["x_train"], arrays["x_test"]]), columns=columns)
    frame["unused"] = 1.0
    frame["target"] = np.concatenate([arrays["y_train"], arrays["y_test"]])
    frame["part"] = ["train"] * N_TRAIN + ["test"] * N_TEST
    frame.to_parquet(tmp_path / "table.parquet")
    ood = frame.assign(a=frame["a"] + 50.0)  # OOD: the test rows of a table with the same feature columns
    ood.drop(columns="target").to_parquet(tmp_path / "ood.parquet")
    entry = {
        "name": "tab",
        "file": {
            "format": "parquet",
            "path": "table.parquet",
            "task": "classification",
            "label": "target",
            "features": columns,
            "split": "part",
            "ood": {"shifted": "ood.parquet"},
        },
    }
    ds = load_as_trial(write_grid(tmp_path, entry))
    mean, std = arrays["x_train"].mean(0), arrays["x_train"].std(0)
    assert ds.input_shape == (4,) and ds.n_outputs == N_CLASSES
    np.testing.assert_allclose(ds.test_x, (arrays["x_test"] - mean) / std, rtol=1e-5, atol=1e-5)
    assert ds.ood["shifted"].shape == (N_TEST, 4)
    np.testing.assert_allclose(ds.ood["shifted"][:, 0], (arrays["x_test"][:, 0] + 50.0 - mean[0]) / std[0], rtol=1e-5)
    assert ds.test_y.tolist() == arrays["y_test"].tolist()
    # without `features`: every column but the label and the split column
    entry["file"].pop("features")
    assert load_as_trial(write_grid(tmp_path, entry)).input_shape == (5,)


def write_image_folder(
    root: Path, parts: dict[str, dict[str, int]], mode: str, size: tuple[int, int], seed: int
) -> None:
    """``root/<part>/<class>/<i>.png``, random images of ``size`` (height, width) in ``mode``."""
    rng = np.random.default_rng(seed)
    for part, classes in parts.items():
        for name, count in classes.items():
            folder = root / part / name
            folder.mkdir(parents=True)
            for i in range(count):
                shape = size if mode == "L" else (*size, 3)
                Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f"{i}.png")


def test_image_folder_through_imagefolder_and_transforms_v2(tmp_path):
    write_image_folder(
        tmp_path / "imgs", {"train": {"cat": 4, "dog": 3, "emu": 2}, "test": {"dog": 2, "emu": 1}}, "RGB", (6, 8), 0
    )
    write_image_folder(tmp_path / "other", {"test": {"any": 3}}, "L", (10, 10), 1)  # grey, larger: converted
    entry = {
        "name": "pictures",
        "file": {"format": "image_folder", "path": "imgs", "task": "classification", "ood": {"other": "other"}},
    }
    ds = load_as_trial(write_grid(tmp_path, entry, adversarial={"epsilons": [0.05], "n_examples": 3}))
    assert ds.input_shape == (3, 6, 8) and ds.n_outputs == 3  # the first training image's size and mode
    assert ds.train_y.tolist() == [0] * 4 + [1] * 3 + [2] * 2
    assert ds.test_y.tolist() == [1, 1, 2]  # numbered by train/'s classes although test/ lacks "cat"
    pixels = np.stack(
        [
            np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) / 255.0
            for p in sorted((tmp_path / "imgs" / "train").glob("*/*.png"))
        ]
    )
    np.testing.assert_allclose(ds.pixel_mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(ds.pixel_std, pixels.std(axis=(0, 1, 2)), rtol=1e-5)
    assert ds.ood["other"].shape == (3, 3, 6, 8)
    entry["file"]["size"] = [4, 4]
    assert load_as_trial(write_grid(tmp_path, entry, adversarial={"epsilons": [0.05]})).train_x.shape == (9, 3, 4, 4)


def test_paths_are_relative_to_the_grid_file_and_absolute_in_the_spec(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "grids").mkdir()
    (tmp_path / "elsewhere").mkdir()
    np.savez(tmp_path / "data" / "my.npz", **tabular())
    grid = write_grid(tmp_path / "grids", npz_entry("../data/my.npz"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = first_spec(grid)
    assert spec.dataset_file["path"] == str(tmp_path / "data" / "my.npz")
    assert spec.dataset == "my_data" and spec.decision_task is False and spec.cell == "sgd/mlp/my_data"


# --------------------------------------------------------------------------------------------------
# A trial on data from files (in process).


def test_regression_from_files_scores_the_test_set_against_observations(tmp_path):
    rng = np.random.default_rng(RNG_SEED)
    x = rng.uniform(-1, 1, (80, 2))
    y = x @ np.array([2.0, -1.0]) + rng.normal(0, 0.1, 80)
    np.savez(tmp_path / "reg.npz", x_train=x[:60], y_train=y[:60, None], x_test=x[60:], y_test=y[60:])
    entry = {"name": "reg", "file": {"format": "npz", "path": "reg.npz", "task": "regression", "noise_std": 0.1}}
    spec = first_spec(write_grid(tmp_path, entry))
    outcome = run_trial(spec, torch.device("cpu"))
    test = {m["metric"] for m in outcome.metrics if m["eval_set"] == "test"}
    assert {"rmse", "nll", "coverage_95_predictive"} <= test and "rmse_truth" not in test
    assert outcome.points == []  # no noise-free truth to write per point


def test_tabular_classification_trial_has_ood_sets_and_no_pixel_attacks(tmp_path):
    np.savez(tmp_path / "my.npz", **tabular())
    np.savez(tmp_path / "ood.npz", x_test=tabular(seed=1)["x_test"] * 3)
    spec = first_spec(write_grid(tmp_path, npz_entry(ood={"far": "ood.npz"})))
    outcome = run_trial(spec, torch.device("cpu"))
    sets = {m["eval_set"] for m in outcome.metrics}
    assert sets == {"test", "far", "cost"}


# --------------------------------------------------------------------------------------------------
# Bad files: one line from `validate` and `run`, exit 2, nothing written.


def _npz(tmp_path: Path, name: str = "my.npz", **changes: Any) -> None:
    arrays = {**tabular(), **changes}
    np.savez(tmp_path / name, **{k: v for k, v in arrays.items() if v is not None})


def _parquet(tmp_path: Path) -> None:
    arrays = tabular()
    frame = pd.DataFrame(np.vstack([arrays["x_train"], arrays["x_test"]]), columns=["a", "b", "c", "d"])
    frame["y"] = np.concatenate([arrays["y_train"], arrays["y_test"]])
    frame["split"] = ["train"] * N_TRAIN + ["test"] * N_TEST
    frame.to_parquet(tmp_path / "t.parquet")


def _parquet_entry(**file: Any) -> dict[str, Any]:
    return {
        "name": "tab",
        "file": {"format": "parquet", "path": "t.parquet", "task": "classification", "label": "y", **file},
    }


def _bad_x_train(tmp_path: Path) -> None:
    x = tabular()["x_train"].copy()
    x[3, 1] = np.nan
    _npz(tmp_path, x_train=x)


def _bad_ood_width(tmp_path: Path) -> None:
    _npz(tmp_path)
    np.savez(tmp_path / "ood.npz", x_test=np.zeros((5, 3)))


def _sequences(tmp_path: Path, name: str = "seq.npz", **changes: Any) -> None:
    arrays = {**sequences(), **changes}
    np.savez(tmp_path / name, **{k: v for k, v in arrays.items() if v is not None})


def _nan_in_a_sequence(tmp_path: Path) -> None:
    x = sequences()["x_train"].copy()
    x[0, 1, 2] = np.nan  # sequence 0 has every step real
    _sequences(tmp_path, x_train=x)


def _nan_step_before_a_real_one(tmp_path: Path) -> None:
    x = sequences()["x_train"].copy()
    x[0, 2] = np.nan  # a whole-NaN step inside the full-length sequence 0
    _sequences(tmp_path, x_train=x, lengths_train=None)


def _ood_sequences_of_other_features(tmp_path: Path) -> None:
    _sequences(tmp_path)
    np.savez(tmp_path / "ood.npz", x_test=np.zeros((4, N_STEPS + 2, N_STEP_FEATURES + 1)))


def seq_entry(**file: Any) -> dict[str, Any]:
    return npz_entry("seq.npz", layout="sequence", **file)


BAD = {
    "missing file": (lambda p: None, npz_entry("absent.npz"), "file.path", "no such file: "),
    "wrong array names": (
        lambda p: np.savez(p / "my.npz", X=np.zeros((3, 2)), y=np.zeros(3)),
        npz_entry(),
        "file.path",
        "has no array x_train, y_train, x_test, y_test; an npz dataset holds",
    ),
    "feature shapes differ": (
        lambda p: _npz(p, x_test=np.zeros((N_TEST, 3))),
        npz_entry(),
        "file.path",
        "x_test has feature shape (3,) but x_train (4,)",
    ),
    "y length": (
        lambda p: _npz(p, y_train=np.zeros(N_TRAIN - 1, int)),
        npz_entry(),
        "file.path",
        f"y_train has {N_TRAIN - 1} entries but x_train has {N_TRAIN} rows",
    ),
    "test label out of range": (
        lambda p: _npz(p, y_test=np.full(N_TEST, 5)),
        npz_entry(),
        "file.path",
        "y_test holds label 5, outside the training labels 0..2",
    ),
    "labels from 1": (
        lambda p: _npz(p, y_train=tabular()["y_train"] + 1, y_test=tabular()["y_test"] + 1),
        npz_entry(),
        "file.path",
        "y_train has no example of class 0; labels must be 0..K-1",
    ),
    "fractional labels": (
        lambda p: _npz(p, y_train=tabular()["y_train"] + 0.5),
        npz_entry(),
        "file.path",
        "y_train must hold integer class labels 0..K-1; found 0.5",
    ),
    "nan": (_bad_x_train, npz_entry(), "file.path", "x_train holds 1 NaN or infinite value(s)"),
    "infinite target": (
        lambda p: _npz(p, y_test=np.full(N_TEST, np.inf)),
        {"name": "r", "file": {"format": "npz", "path": "my.npz", "task": "regression", "noise_std": 0.1}},
        "file.path",
        "y_test holds 30 NaN or infinite value(s)",
    ),
    "pixels out of range": (
        lambda p: _npz(p, x_train=np.full((N_TRAIN, 4, 4), 255.0), x_test=np.zeros((N_TEST, 4, 4))),
        npz_entry(),
        "file.path",
        "x_train: image pixels must be uint8 (0-255) or numbers in [0, 1]",
    ),
    "unknown format": (
        _npz,
        npz_entry(format="csv"),
        "file.format",
        "unknown format 'csv'; allowed: npz, parquet, image_folder",
    ),
    "missing label column": (_parquet, _parquet_entry(label="target"), "file.label", "no column 'target' in "),
    "missing feature column": (_parquet, _parquet_entry(features=["a", "z"]), "file.features", "no column 'z' in "),
    "missing split column": (_parquet, _parquet_entry(split="fold"), "file.split", "no column 'fold' in "),
    "ood missing": (_npz, npz_entry(ood={"far": "nowhere.npz"}), "file.ood.far", "no such file: "),
    "ood shape": (
        _bad_ood_width,
        npz_entry(ood={"far": "ood.npz"}),
        "file.ood.far",
        "has input shape (3,), the dataset (4,)",
    ),
    "image folder without test": (
        lambda p: write_image_folder(p / "imgs", {"train": {"a": 1, "b": 1}}, "L", (4, 4), 0),
        {"name": "i", "file": {"format": "image_folder", "path": "imgs", "task": "classification"}},
        "file.path",
        "no folder test/ in ",
    ),
    "regression without noise": (
        _npz,
        {"name": "r", "file": {"format": "npz", "path": "my.npz", "task": "regression"}},
        "file.noise_std",
        "a regression set needs the known observation noise std",
    ),
    "key of another format": (_npz, npz_entry(label="y"), "file.label", "only for format parquet, not npz"),
    "unknown layout": (
        _sequences,
        npz_entry("seq.npz", layout="seq"),
        "file.layout",
        "unknown layout 'seq'; allowed: ",
    ),
    "layout of another format": (_parquet, _parquet_entry(layout="sequence"), "file.layout", "only for format npz"),
    "sequences not 3-D": (
        _npz,
        npz_entry(layout="sequence"),
        "file.path",
        "x_train has shape (60, 4); layout sequence expects (n, time steps, features)",
    ),
    "lengths without layout": (
        _sequences,
        npz_entry("seq.npz"),
        "file.path",
        "holds lengths_train, read only for sequences: add layout: sequence",
    ),
    "length 0": (
        lambda p: _sequences(p, lengths_train=np.where(np.arange(N_TRAIN) == 4, 0, N_STEPS)),
        seq_entry(),
        "file.path",
        f"lengths_train holds 0, outside 1..{N_STEPS} (the time steps of x_train)",
    ),
    "length past the steps": (
        lambda p: _sequences(p, lengths_test=np.full(N_TEST, N_STEPS + 1)),
        seq_entry(),
        "file.path",
        f"lengths_test holds {N_STEPS + 1}, outside 1..{N_STEPS}",
    ),
    "lengths not one per sequence": (
        lambda p: _sequences(p, lengths_train=np.full(N_TRAIN - 1, 2)),
        seq_entry(),
        "file.path",
        f"lengths_train has shape ({N_TRAIN - 1},); expected one length per sequence of x_train, ({N_TRAIN},)",
    ),
    "fractional lengths": (
        lambda p: _sequences(p, lengths_train=np.full(N_TRAIN, 2.5)),
        seq_entry(),
        "file.path",
        "lengths_train must hold integers",
    ),
    "nan inside a sequence": (
        _nan_in_a_sequence,
        seq_entry(),
        "file.path",
        "x_train holds 1 NaN or infinite value(s) in its sequences' steps (padding: the steps past lengths_train)",
    ),
    "nan step before a real one": (
        _nan_step_before_a_real_one,
        seq_entry(),
        "file.path",
        "x_train: sequence 0 has a whole-NaN step before a real one",
    ),
    "ood sequences of other features": (
        _ood_sequences_of_other_features,
        seq_entry(ood={"far": "ood.npz"}),
        "file.ood.far",
        f"x_test has input shape ({N_STEP_FEATURES + 1},), the dataset ({N_STEP_FEATURES},) (features per step)",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_one_line_before_any_trial(case, tmp_path, capsys):
    write, entry, field, message = BAD[case]
    write(tmp_path)
    grid = write_grid(tmp_path, entry)
    assert main(["validate", str(grid)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {grid}: datasets[0].{field}: ") and message in err, err
    assert err.count("\n") == 1
    out = tmp_path / "results"
    assert main(["run", str(grid), "--out", str(out)]) == 2
    assert capsys.readouterr().err == err
    assert not out.exists()


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        (
            {"name": "digits", "file": {"format": "npz", "path": "my.npz", "task": "classification"}},
            "datasets[0].name",
            "'digits' is a registered dataset",
        ),
        (
            {**npz_entry(), "ood": ["noise"]},
            "datasets[0].ood",
            "datasets read from files name its OOD files in file.ood",
        ),
        (npz_entry(shape=[2]), "datasets[0].file.shape", "unknown key; allowed: format, path"),
        (npz_entry(ood={"test": "my.npz"}), "datasets[0].file.ood.test", "an OOD set name is letters"),
    ],
)
def test_a_bad_file_block_is_one_line(entry, field, message, tmp_path, capsys):
    _npz(tmp_path)
    grid = write_grid(tmp_path, entry)
    assert main(["validate", str(grid)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {grid}: {field}: ") and message in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------------------------------
# End to end through Ray.


@pytest.mark.slow
def test_a_grid_on_an_npz_dataset_runs_through_ray(ray_session, tmp_path):
    np.savez(tmp_path / "my.npz", **tabular())
    np.savez(tmp_path / "ood.npz", x_test=tabular(seed=1)["x_test"] * 3)
    grid = write_grid(tmp_path, npz_entry(ood={"far": "ood.npz"}))
    out = tmp_path / "results"
    assert main(["run", str(grid), "--out", str(out)]) == 0
    trials = pd.read_parquet(out / "trials.parquet")
    assert trials["status"].tolist() == ["ok"] and trials["dataset"].tolist() == ["my_data"]
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert {("test", "accuracy"), ("far", "ood_auroc_entropy")} <= set(zip(metrics["eval_set"], metrics["metric"]))
