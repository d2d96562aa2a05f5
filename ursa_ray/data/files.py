"""Datasets read from files a grid names (bring your own data): ``.npz`` arrays, a Parquet table, or a
folder of images.

A grid's dataset entry gives a ``file`` block instead of a registered name::

    - name: my_data                      # any name that is not a registered dataset; names the cell
      file:
        format: npz                      # npz | parquet | image_folder
        path: data/my.npz                # relative to the grid file's folder
        task: classification             # or regression (then noise_std: the known observation noise)
        layout: sequence                 # optional, npz only: tabular | image | sequence (default: by shape)
        ood: {noise_like: data/ood.npz}  # optional: OOD files in the same format (their test part)

Formats (one ``path`` each):

- ``npz``: arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``.  ``x`` of shape (n, features) is
  tabular; (n, height, width), (n, channels, height, width) or channels last (n, height, width, channels)
  are images of 1 or 3 channels (a 4-D array is channels first when its second size is 1 or 3, else channels
  last when its last size is; anything else is refused), with pixels uint8 0–255 or numbers in [0, 1].
  With ``layout: sequence``, ``x`` of shape (n, T, F) holds n sequences of T steps of F features (for
  ``lstm``/``gru``), and optional ``lengths_train`` / ``lengths_test`` (n integers in 1..T) say how many
  leading steps of each sequence are real: the steps past a length are padding, whatever they hold.  Without
  lengths, whole-NaN steps at the end of a sequence are its padding.  Padding becomes NaN steps, the form
  :func:`ursa_ray.data.sequence.pad_sequences` writes and the recurrent models skip; any other NaN or
  infinite value is refused.  Test and OOD sequences may have another T than the training ones, not another F.
- ``parquet``: one table; ``label`` names the label column, ``features`` the input columns (default:
  every column but the label and split columns), ``split`` the column (default ``split``) whose value,
  ``train`` or ``test``, puts each row in its part.  Tabular.
- ``image_folder``: a folder with ``train/`` and ``test/``, each in torchvision's ``ImageFolder`` layout
  (one sub-folder per class, classes numbered in sorted order of the ``train/`` folders; ``test/`` may lack
  some).  Images are read by ``ImageFolder`` and converted by ``torchvision.transforms.v2`` to float
  tensors of ``size`` [height, width] (default: the first training image's), grayscale if that image is
  grayscale, else RGB.  Classification only.

Labels of a classification set are the integers 0..K−1, K = the largest training label + 1, each class
present in the training part; regression targets are numbers (one per row), left as they are.  Inputs are
normalised with statistics of the training part only: tabular features standardised per column (a
constant column is centred only); sequence features likewise over every real (non-padding) training step;
images per channel, x = (pixel − mean) / std, the mean and std kept in
:attr:`Dataset.pixel_mean` / :attr:`Dataset.pixel_std` so that attacks and corruptions work in pixel space.
An OOD file is read as the test part of a file in the same format (npz ``x_test``; the Parquet rows whose
split is ``test``, their feature columns; the image folder's ``test/``), its labels ignored, and normalised
with the in-domain statistics.  A tabular classification set gets no attacks or corruptions (there are
no pixels); a regression set's test targets are noisy observations, so its test set is scored with the
predictive metrics (``rmse``, ``nll``, ``coverage_95_predictive``) and writes no per-point rows.

``run`` and ``validate`` load every file once in the driver, before any trial, and report a bad file as a
:class:`FileDatasetError` naming the key of the ``file`` block concerned; trials load them again.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.eval_sets import RESERVED_NAMES

FORMATS = ("npz", "parquet", "image_folder")
TASKS = ("classification", "regression")
NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
SPLITS = ("train", "test")
LAYOUTS = {
    "tabular": "(n, features)",
    "image": "(n, height, width), (n, channels, height, width) or (n, height, width, channels)",
    "sequence": "(n, time steps, features)",
}
"""What an npz ``x`` array may hold (the ``layout`` key), with the shapes each takes."""
LAYOUT_NDIMS = {"tabular": (2,), "image": (3, 4), "sequence": (3,)}
DEFAULT_SPLIT_COLUMN = "split"
FILE_KEYS = ("format", "path", "task", "noise_std", "layout", "label", "features", "split", "size", "ood")
FORMAT_KEYS = {"npz": ("layout",), "parquet": ("label", "features", "split"), "image_folder": ("size",)}
"""Keys only one format takes."""
SET_NAME = re.compile(r"[A-Za-z0-9_-]+")
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")
IMAGE_CHANNELS = (1, 3)
"""Channels an image may have: grayscale or RGB."""
MAX_CLASSES = 100_000
"""The most classes a classification set may have (K = the largest training label + 1; an id column used as
the label would otherwise ask for a model with billions of outputs)."""


class FileDatasetError(ValueError):
    """A ``file`` block or a file it names that cannot be used.  ``field`` is the key of the block the
    problem concerns (``path``, ``label``, ``ood.NAME``, …; empty for the block itself)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# --------------------------------------------------------------------------------------------------
# The grid's `file` block.


def parse_file_settings(raw: Any, base: Path) -> dict[str, Any]:
    """The ``file`` block checked and completed (JSON-able, everything a worker needs): paths made absolute
    (a relative one is relative to ``base``, the grid file's folder), the Parquet split column's default
    filled in.  Checks only the block; the files are checked by loading them (:func:`load_file_dataset`)."""
    if not isinstance(raw, dict):
        raise FileDatasetError("", f"expected a mapping with keys {', '.join(FILE_KEYS)}")
    for key in raw:
        if key not in FILE_KEYS:
            raise FileDatasetError(str(key), f"unknown key; allowed: {', '.join(FILE_KEYS)}")
    fmt = raw.get("format")
    if fmt not in FORMATS:
        raise FileDatasetError(
            "format", f"{'required' if fmt is None else f'unknown format {fmt!r}'}; allowed: {', '.join(FORMATS)}"
        )
    for other, keys in FORMAT_KEYS.items():
        for key in keys:
            if key in raw and other != fmt:
                raise FileDatasetError(key, f"only for format {other}, not {fmt}")
    task = raw.get("task")
    if task not in TASKS:
        raise FileDatasetError(
            "task", f"{'required' if task is None else f'unknown task {task!r}'}; allowed: {', '.join(TASKS)}"
        )
    if fmt == "image_folder" and task != "classification":
        raise FileDatasetError("task", "format image_folder holds one folder per class: classification only")
    out: dict[str, Any] = {"format": fmt, "path": _path(raw.get("path"), base, "path"), "task": task}
    if task == "regression":
        noise = raw.get("noise_std")
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not np.isfinite(noise) or noise <= 0:
            raise FileDatasetError(
                "noise_std", f"a regression set needs the known observation noise std, a number > 0; got {noise!r}"
            )
        out["noise_std"] = float(noise)
        if "ood" in raw:
            raise FileDatasetError(
                "ood", "only for task classification (a regression set's test inputs are its evaluation)"
            )
    elif "noise_std" in raw:
        raise FileDatasetError("noise_std", "only for task regression")
    if "layout" in raw:
        if raw["layout"] not in LAYOUTS:
            raise FileDatasetError("layout", f"unknown layout {raw['layout']!r}; allowed: {', '.join(LAYOUTS)}")
        out["layout"] = raw["layout"]
    if fmt == "parquet":
        out.update(_parquet_columns(raw))
    if fmt == "image_folder" and "size" in raw:
        size = raw["size"]
        if not (isinstance(size, list) and len(size) == 2 and all(type(s) is int and s > 0 for s in size)):
            raise FileDatasetError("size", f"expected [height, width], two positive integers; got {size!r}")
        out["size"] = list(size)
    ood = raw.get("ood", {})
    if not isinstance(ood, dict):
        raise FileDatasetError("ood", "expected a mapping of OOD set name to path")
    for name in ood:
        if not isinstance(name, str) or not SET_NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise FileDatasetError(
                f"ood.{name}",
                f"an OOD set name is letters, digits, '_' and '-', not {', '.join(RESERVED_NAMES)}",
            )
    out["ood"] = {name: _path(value, base, f"ood.{name}") for name, value in ood.items()}
    out["sha256"] = content_digest([out["path"], *out["ood"].values()])
    return out


def content_digest(paths: list[str]) -> str:
    """sha256 over the bytes of every file at ``paths`` (a folder: every file under it, by sorted relative path),
    so that a trial's id changes when its data does (:func:`ursa_ray.grid.trial_id`), and not when the data
    moves (the paths themselves are not hashed).  Each file is read once, when the grid is parsed; a path that
    does not exist counts as absent (loading it then fails, before any trial)."""
    digest = hashlib.sha256()
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
        digest.update(f"{len(files)}\0".encode())
        for file in files:
            digest.update(f"{file.relative_to(path) if file != path else ''}\0".encode())
            with open(file, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def _path(value: Any, base: Path, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise FileDatasetError(field, f"required, a path (relative to the grid file's folder); got {value!r}")
    try:
        return str((base / Path(value).expanduser()).resolve())
    except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError on a symlink loop
        raise FileDatasetError(field, f"cannot resolve {value!r}: {exc}") from None


def _parquet_columns(raw: Mapping[str, Any]) -> dict[str, Any]:
    label, split = raw.get("label"), raw.get("split", DEFAULT_SPLIT_COLUMN)
    if not isinstance(label, str) or not label:
        raise FileDatasetError("label", "required for format parquet: the name of the label column")
    if not isinstance(split, str) or not split or split == label:
        raise FileDatasetError("split", "the name of the column holding train or test, other than the label column")
    out: dict[str, Any] = {"label": label, "split": split}
    if "features" in raw:
        features = raw["features"]
        if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
            raise FileDatasetError("features", "expected a non-empty list of column names")
        if len(set(features)) != len(features) or {label, split} & set(features):
            raise FileDatasetError("features", "each column once, and neither the label nor the split column")
        out["features"] = list(features)
    return out


# --------------------------------------------------------------------------------------------------
# Reading: each format gives the raw parts as numpy arrays.


@dataclass
class _Parts:
    """The raw parts (``train``, ``test``) of one file: inputs ``x`` (``layout`` tabular n × d, image n × C × H × W
    float pixels in [0, 1], or sequence n × T × F with NaN padding steps) and labels ``y`` (none for an OOD
    file); ``names`` says how messages name ``x_train``, ``y_test``, …, and ``fields`` which key of the ``file``
    block a problem in the inputs (``x``), the labels (``y``) or the split into parts (``parts``: an empty one)
    concerns."""

    x: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    names: dict[str, str]
    fields: dict[str, str]
    layout: str
    columns: list[str] | None = None


def _existing(path: Path, field: str, folder: bool = False) -> Path:
    if not path.exists():
        raise FileDatasetError(field, f"no such {'folder' if folder else 'file'}: {path}")
    if folder and not path.is_dir():
        raise FileDatasetError(
            field, f"not a folder: {path} (format image_folder names a folder with train/ and test/)"
        )
    if not folder and not path.is_file():
        raise FileDatasetError(field, f"not a file: {path}")
    return path


def _read_npz(
    settings: Mapping[str, Any], path: Path, field: str, parts: tuple[str, ...], like: _Parts | None
) -> _Parts:
    wanted = [a for a in NPZ_ARRAYS if a.split("_")[1] in parts and not (like is not None and a.startswith("y"))]
    if not zipfile.is_zipfile(_existing(path, field)):
        raise FileDatasetError(field, f"{path} is not an .npz archive (a zip of .npy arrays, as numpy.savez writes)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [a for a in wanted if a not in npz.files]
            if missing:
                holds = "an npz OOD set holds x_test" if like else f"an npz dataset holds {', '.join(NPZ_ARRAYS)}"
                raise FileDatasetError(
                    field,
                    f"{path} has no array {', '.join(missing)}; {holds} (found: {', '.join(npz.files) or 'none'})",
                )
            arrays = {a: npz[a] for a in wanted}
            lengths = {p: npz[f"lengths_{p}"] for p in parts if f"lengths_{p}" in npz.files}
    except FileDatasetError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a pickled object array, a damaged file
        raise FileDatasetError(field, f"cannot read {path} as .npz: {' '.join(str(exc).split())}") from None
    layout = settings.get("layout") or ("image" if arrays[f"x_{parts[0]}"].ndim in (3, 4) else "tabular")
    if layout != "sequence" and lengths:
        raise FileDatasetError(
            field,
            f"{path} holds lengths_{next(iter(lengths))}, read only for sequences: add layout: sequence to the file block",
        )
    if layout == "sequence":
        x = {p: _sequence_inputs(arrays[f"x_{p}"], lengths.get(p), f"x_{p}", field) for p in parts}
    else:
        x = {p: _npz_inputs(arrays[f"x_{p}"], f"x_{p}", field, layout, "layout" in settings) for p in parts}
    y = {p: arrays[f"y_{p}"] for p in parts if f"y_{p}" in arrays}
    return _Parts(x, y, {a: a for a in NPZ_ARRAYS}, {"x": field, "y": field, "parts": field}, layout)


def _npz_inputs(x: np.ndarray, name: str, field: str, layout: str, declared: bool) -> np.ndarray:
    """An npz input array checked (shape, numbers, finite), images as float pixels (n, C, H, W) in [0, 1].
    ``layout`` is tabular or image, ``declared`` when the file block names it (else it was read off the shape)."""
    layouts = f"{LAYOUTS['tabular']}, {LAYOUTS['image']}"
    if x.ndim not in LAYOUT_NDIMS[layout]:
        expected = (
            f"layout {layout} expects {LAYOUTS[layout]}"
            if declared
            else f"expected {layouts}; or, with layout: sequence, {LAYOUTS['sequence']}"
        )
        raise FileDatasetError(field, f"{name} has shape {x.shape}; {expected}")
    if 0 in x.shape[1:]:
        raise FileDatasetError(
            field, f"{name} has shape {x.shape}: an example of size 0; expected {layouts}, each size >= 1"
        )
    if x.ndim == 4:
        if x.shape[1] not in IMAGE_CHANNELS and x.shape[3] in IMAGE_CHANNELS:
            x = x.transpose(0, 3, 1, 2)  # channels last, as PIL and TensorFlow store images
        elif x.shape[1] not in IMAGE_CHANNELS:
            raise FileDatasetError(
                field,
                f"{name} has shape {x.shape}: images have 1 (grayscale) or 3 (RGB) channels, first "
                "(n, channels, height, width) or last (n, height, width, channels)",
            )
    _numeric_finite(x, name, field)
    if layout == "tabular":
        return x
    if x.ndim == 3:
        x = x[:, None]
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if x.size and (x.min() < 0 or x.max() > 1):
        raise FileDatasetError(
            field,
            f"{name}: image pixels must be uint8 (0-255) or numbers in [0, 1]; found values in [{x.min():g}, {x.max():g}]",
        )
    return x.astype(np.float32)


def _sequence_inputs(x: np.ndarray, lengths: np.ndarray | None, name: str, field: str) -> np.ndarray:
    """Sequences (n, T, F) as float64 with every padding step NaN: the steps past ``lengths`` (n integers in
    1..T) or, without lengths, the whole-NaN steps at the end of each sequence.  Any other NaN or infinite
    value, a NaN step before a real one, or a sequence that is all padding is refused."""
    if x.ndim != 3 or 0 in x.shape[1:]:
        raise FileDatasetError(
            field, f"{name} has shape {x.shape}; layout sequence expects {LAYOUTS['sequence']}, each size >= 1"
        )
    if x.dtype.kind not in "biuf":
        raise FileDatasetError(field, f"{name} must hold numbers, got dtype {x.dtype}")
    n, steps = x.shape[:2]
    x = x.astype(np.float64)
    lengths_name = f"lengths_{name.removeprefix('x_')}"
    if lengths is None:
        real = ~np.isnan(x).all(axis=2)
        counts = real.sum(axis=1)
        gap = np.flatnonzero((real != (np.arange(steps) < counts[:, None])).any(axis=1))
        if gap.size:
            raise FileDatasetError(
                field,
                f"{name}: sequence {gap[0]} has a whole-NaN step before a real one; padding (whole-NaN steps) "
                f"comes at the end of a sequence, or give {lengths_name}",
            )
        padding = "whole-NaN steps at the end"
    else:
        if lengths.ndim != 1 or len(lengths) != n:
            raise FileDatasetError(
                field, f"{lengths_name} has shape {lengths.shape}; expected one length per sequence of {name}, ({n},)"
            )
        if lengths.dtype.kind not in "biuf" or not np.isfinite(lengths).all() or (lengths != np.round(lengths)).any():
            raise FileDatasetError(field, f"{lengths_name} must hold integers (steps per sequence)")
        counts = lengths.astype(np.int64)
        padding = f"the steps past {lengths_name}"
        x[np.arange(steps) >= counts[:, None]] = np.nan
    outside = np.flatnonzero((counts < 1) | (counts > steps))
    if outside.size and lengths is None:
        raise FileDatasetError(field, f"{name}: sequence {outside[0]} is padding only (every step NaN)")
    if outside.size:
        raise FileDatasetError(
            field, f"{lengths_name} holds {counts[outside[0]]}, outside 1..{steps} (the time steps of {name})"
        )
    real_steps = x[np.arange(steps) < counts[:, None]]
    bad = int(real_steps.size - np.count_nonzero(np.isfinite(real_steps)))
    if bad:
        raise FileDatasetError(
            field, f"{name} holds {bad} NaN or infinite value(s) in its sequences' steps (padding: {padding})"
        )
    return x


def _read_parquet(
    settings: Mapping[str, Any], path: Path, field: str, parts: tuple[str, ...], like: _Parts | None
) -> _Parts:
    import pandas as pd
    import pyarrow

    try:
        table = pd.read_parquet(_existing(path, field))
    except (OSError, ValueError, pyarrow.ArrowException) as exc:
        raise FileDatasetError(field, f"cannot read {path} as Parquet: {' '.join(str(exc).split())}") from None
    columns = [str(c) for c in table.columns]
    ood = like is not None

    def column(name: str, key: str) -> pd.Series:
        """The column ``name`` (the block's ``key`` names it), numeric unless it is the split column."""
        where = field if ood else key
        if name not in columns:
            raise FileDatasetError(where, f"no column {name!r} in {path}; columns: {', '.join(columns)}")
        values = table[name]
        if key != "split" and not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)):
            raise FileDatasetError(where, f"column {name!r} of {path} is not numeric (dtype {values.dtype})")
        return values

    split = settings["split"]
    part_of = column(split, "split").astype(str)
    unknown = sorted(set(part_of) - set(SPLITS))
    if unknown:
        raise FileDatasetError(
            field if ood else "split", f"column {split!r} of {path} may hold only train or test; found {unknown[:5]}"
        )
    if ood:
        features = like.columns
    else:
        features = settings.get("features") or [c for c in columns if c not in (settings["label"], split)]
        if not features:
            raise FileDatasetError("features", f"{path} has no column besides the label and split columns")
        column(settings["label"], "label")
    for name in features:
        column(name, "features")
    x, y, names = {}, {}, {}
    for part in parts:
        rows = table[part_of == part]
        x[part] = rows[features].to_numpy(dtype=np.float64, na_value=np.nan)
        names[f"x_{part}"] = f"the feature columns of the {part} rows"
        if not ood:
            y[part] = rows[settings["label"]].to_numpy(dtype=np.float64, na_value=np.nan)
            names[f"y_{part}"] = f"label column {settings['label']!r} in the {part} rows"
    fields = {"x": field, "parts": field} if ood else {"x": "features", "y": "label", "parts": "split"}
    return _Parts(x, y, names, fields, layout="tabular", columns=list(features))


def _read_image_folder(
    settings: Mapping[str, Any], path: Path, field: str, parts: tuple[str, ...], like: _Parts | None
) -> _Parts:
    from PIL import Image, UnidentifiedImageError
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    root = _existing(path, field, folder=True)
    layout = "an image_folder holds train/ and test/, each with one folder of images per class"
    folders = {}
    for part in parts:
        if not (root / part).is_dir():
            raise FileDatasetError(field, f"no folder {part}/ in {root}; {layout}")
        try:
            folders[part] = ImageFolder(str(root / part))
        except FileNotFoundError as exc:  # ImageFolder: no class folder, or no image in them
            raise FileDatasetError(field, f"{root / part}: {' '.join(str(exc).split())}; {layout}") from None
    if like is None:
        first = folders[parts[0]].samples[0][0]
        try:
            with Image.open(first) as image:
                mode = "L" if image.mode in GRAYSCALE_MODES else "RGB"
                size = tuple(settings.get("size") or (image.height, image.width))
        except (OSError, UnidentifiedImageError) as exc:
            raise FileDatasetError(field, f"cannot read image {first}: {' '.join(str(exc).split())}") from None
    else:
        channels, height, width = like.x["train"].shape[1:]
        mode, size = ("L" if channels == 1 else "RGB"), (height, width)
    transform = v2.Compose([v2.ToImage(), v2.Resize(size, antialias=True), v2.ToDtype(torch.float32, scale=True)])
    x, y = {}, {}
    for part, folder in folders.items():
        images = []
        for file, _ in folder.samples:
            try:
                with Image.open(file) as image:
                    images.append(transform(image.convert(mode)))
            except (OSError, UnidentifiedImageError) as exc:
                raise FileDatasetError(field, f"cannot read image {file}: {' '.join(str(exc).split())}") from None
        x[part] = torch.stack(images).numpy()
        if like is None:
            y[part] = _folder_labels(folders, part, root, field)
    names = {f"{v}_{p}": f"{root / p}" for p in SPLITS for v in "xy"}
    return _Parts(x, y, names, {"x": field, "y": field, "parts": field}, layout="image")


def _folder_labels(folders: Mapping[str, Any], part: str, root: Path, field: str) -> np.ndarray:
    """Labels of ``part`` numbered as the classes of ``train/`` (torchvision numbers each folder's own)."""
    train_classes, classes = folders["train"].classes, folders[part].classes
    unknown = [c for c in classes if c not in train_classes]
    if unknown:
        raise FileDatasetError(field, f"{root / part} has class folders {unknown} that {root / 'train'} lacks")
    index = np.array([train_classes.index(c) for c in classes], dtype=np.int64)
    return index[np.asarray(folders[part].targets, dtype=np.int64)]


_READERS: dict[str, Callable[..., _Parts]] = {
    "npz": _read_npz,
    "parquet": _read_parquet,
    "image_folder": _read_image_folder,
}


# --------------------------------------------------------------------------------------------------
# Checks and normalisation.


def _numeric_finite(a: np.ndarray, name: str, field: str) -> None:
    if a.dtype.kind not in "biuf":
        raise FileDatasetError(field, f"{name} must hold numbers, got dtype {a.dtype}")
    bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    if bad:
        raise FileDatasetError(field, f"{name} holds {bad} NaN or infinite value(s)")


def _check_parts(raw: _Parts) -> None:
    """Every part non-empty and finite (sequences: but their NaN padding, checked when read); labels one per
    row; test inputs shaped as training inputs (sequences: the same features per step, any number of steps)."""
    for part, x in raw.x.items():
        name = raw.names[f"x_{part}"]
        if len(x) == 0:
            raise FileDatasetError(raw.fields["parts"], f"the {part} part is empty ({name})")
        if raw.layout != "sequence":
            _numeric_finite(x, name, raw.fields["x"])
        if part not in raw.y:
            continue
        y, label_name = raw.y[part], raw.names[f"y_{part}"]
        if y.ndim == 2 and y.shape[1] == 1:
            raw.y[part] = y = y[:, 0]
        if y.ndim != 1:
            raise FileDatasetError(
                raw.fields["y"], f"{label_name} must hold one label per row, shape ({len(x)},); got {y.shape}"
            )
        if len(y) != len(x):
            raise FileDatasetError(raw.fields["y"], f"{label_name} has {len(y)} entries but {name} has {len(x)} rows")
        _numeric_finite(y, label_name, raw.fields["y"])
    if len(raw.x) == 2 and _example_shape(raw.x["test"], raw.layout) != _example_shape(raw.x["train"], raw.layout):
        raise FileDatasetError(
            raw.fields["x"],
            f"{raw.names['x_test']} has feature shape {_example_shape(raw.x['test'], raw.layout)} but "
            f"{raw.names['x_train']} {_example_shape(raw.x['train'], raw.layout)}",
        )


def _example_shape(x: np.ndarray, layout: str) -> tuple[int, ...]:
    """The shape two parts must share: an example's, or for sequences a step's (the lengths may differ)."""
    return x.shape[2:] if layout == "sequence" else x.shape[1:]


def _class_labels(raw: _Parts) -> int:
    """Check classification labels (integers 0..K−1, each class in training) and return K."""
    field = raw.fields["y"]
    for part in SPLITS:
        y, name = raw.y[part], raw.names[f"y_{part}"]
        bad = y[(y != np.round(y)) | (y < 0)]
        if bad.size:
            raise FileDatasetError(field, f"{name} must hold integer class labels 0..K-1; found {bad[0]:g}")
    largest = raw.y["train"].max()
    if largest >= MAX_CLASSES:
        raise FileDatasetError(
            field,
            f"{raw.names['y_train']} holds label {largest:.0f}: at most {MAX_CLASSES:,} classes, labels "
            f"0..{MAX_CLASSES - 1} (is the label an id column?)",
        )
    k = int(largest) + 1
    absent = np.setdiff1d(np.arange(k), raw.y["train"].astype(np.int64)).tolist()
    if k < 2 or absent:
        what = "a single class" if k < 2 else f"no example of class {absent[0]}"
        raise FileDatasetError(
            field,
            f"{raw.names['y_train']} has {what}; labels must be 0..K-1 with every class in training (K = largest label + 1 = {k})",
        )
    if raw.y["test"].max() >= k:
        raise FileDatasetError(
            field,
            f"{raw.names['y_test']} holds label {int(raw.y['test'].max())}, outside the training labels 0..{k - 1}",
        )
    return k


def _statistics(train: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std over the training part: per channel for images, per feature otherwise (for sequences over
    every real step, padding left out); a zero std → 1."""
    if layout == "sequence":
        train = train.reshape(-1, train.shape[2])
        train = train[~np.isnan(train).any(axis=1)]
    axes = (0, 2, 3) if layout == "image" else (0,)
    mean = train.mean(axis=axes, dtype=np.float64)
    std = train.std(axis=axes, dtype=np.float64)
    return mean, np.where(std > 0, std, 1.0)


NORMALISE_SHAPES = {"tabular": (1, -1), "image": (1, -1, 1, 1), "sequence": (1, 1, -1)}
"""How the per-feature (per-channel) statistics broadcast over each layout's inputs."""


def _normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray, layout: str) -> Tensor:
    """(x − mean) / std as float32; a sequence's NaN padding stays NaN."""
    shape = NORMALISE_SHAPES[layout]
    return torch.from_numpy(((x - mean.reshape(shape)) / std.reshape(shape)).astype(np.float32))


# --------------------------------------------------------------------------------------------------
# The dataset.


def load_file_dataset(
    name: str,
    settings: Mapping[str, Any],
    options: Mapping[str, Any],
    ood_names: tuple[str, ...],
    root: Path,
    download: bool,
    seed: int,
) -> Dataset:
    """The :class:`Dataset` the ``file`` block ``settings`` (:func:`parse_file_settings`) describes, with the
    OOD sets ``ood_names`` of its ``ood``; ``options``, ``root``, ``download`` and ``seed`` are unused (the
    split is the file's).  Raises :class:`FileDatasetError` on a file that cannot be used."""
    read = _READERS[settings["format"]]
    raw = read(settings, Path(settings["path"]), "path", SPLITS, None)
    _check_parts(raw)
    classification = settings["task"] == "classification"
    n_outputs = _class_labels(raw) if classification else 1
    mean, std = _statistics(raw.x["train"], raw.layout)
    ood = {}
    for ood_name in ood_names:
        field = f"ood.{ood_name}"
        other = read(settings, Path(settings["ood"][ood_name]), field, ("test",), raw)
        _check_parts(other)
        shape, expected = _example_shape(other.x["test"], other.layout), _example_shape(raw.x["train"], raw.layout)
        if other.layout != raw.layout or shape != expected:
            raise FileDatasetError(
                field,
                f"{other.names['x_test']} has input shape {shape}, the dataset {expected}"
                + (" (features per step)" if raw.layout == "sequence" else ""),
            )
        ood[ood_name] = _normalise(other.x["test"], mean, std, raw.layout)
    targets = (
        (lambda y: torch.from_numpy(y.astype(np.int64)))
        if classification
        else (lambda y: torch.from_numpy(y.astype(np.float32)))
    )
    train_x = _normalise(raw.x["train"], mean, std, raw.layout)
    images = raw.layout == "image"
    return Dataset(
        name=name,
        task=settings["task"],
        input_shape=tuple(train_x.shape[1:]),
        n_outputs=n_outputs,
        train_x=train_x,
        train_y=targets(raw.y["train"]),
        test_x=_normalise(raw.x["test"], mean, std, raw.layout),
        test_y=targets(raw.y["test"]),
        ood=ood,
        noise_std=settings.get("noise_std"),
        pixel_mean=tuple(float(m) for m in mean) if images else None,
        pixel_std=tuple(float(s) for s in std) if images else None,
        test_y_observed=not classification,
    )


def file_dataset(name: str, settings: Mapping[str, Any]) -> DatasetSpec:
    """The :class:`DatasetSpec` of a dataset read from files (``settings``: :func:`parse_file_settings`).
    It has no ``check``: ``run`` and ``validate`` load it instead (:func:`ursa_ray.grid.check_data`)."""
    return DatasetSpec(
        name=name,
        task=settings["task"],
        description=f"{settings['format']} from {settings['path']}",
        load=partial(load_file_dataset, name, dict(settings)),
        ood_sets=tuple(settings.get("ood", {})),
        images=settings.get("layout") not in ("tabular", "sequence"),  # npz without a layout: read off the shape
        torchvision=settings["format"] == "image_folder",
    )


def dataset_spec(name: str, file: Mapping[str, Any] | None = None) -> DatasetSpec:
    """The dataset a trial spec names: the registered ``name``, or with ``file`` (the checked ``file`` block
    of its grid entry, :func:`parse_file_settings`) the dataset read from those files."""
    if file is None:
        from ursa_ray.data import get_dataset

        return get_dataset(name)
    return file_dataset(name, file)
