"""``download: true`` for the Planetoid graphs (``cora``, ``citeseer``, ``pubmed``): the raw files of Yang, Cohen
& Salakhutdinov (2016, "Revisiting semi-supervised learning with graph embeddings"), as published in their
repository, turned into the Planetoid-layout npz that :func:`ursa_ray.data.graph.load_planetoid` reads.

The raw layout (``ind.NAME.PART``): ``allx`` (the features of every node before the test nodes, a pickled
``scipy.sparse`` matrix), ``ally`` (their one-hot labels), ``tx``/``ty`` (the test nodes' features and labels,
in the order of ``test.index``, one node index per line), ``x``/``y`` (the labelled training nodes: the first
``len(y)`` nodes), and ``graph`` (a pickled dict: node → its neighbours).  As every reader of these files
does (torch_geometric's ``read_planetoid_data`` among them), the test rows are put at their node indices;
citeseer's 15 isolated test-range nodes, which have no row in ``tx``, get zero features (and label 0; they are
neither training nor test nodes).  The training nodes are the first ``len(y)`` nodes (20 per class), the
test nodes those of ``test.index`` (1,000): the public split.

The raw files are pickles: they are read with ``pickle`` as published (latin-1), from the one repository named
below; nothing else is unpickled.  Downloads go through torchvision's ``download_url``; the converted npz is
written atomically, and the raw files are kept beside it (``planetoid/raw/``).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import numpy as np

RAW_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
RAW_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def raw_file(raw_dir: Path, name: str, part: str) -> Path:
    return raw_dir / f"ind.{name}.{part}"


def fetch_planetoid(name: str, root: Path) -> Path:
    """Download ``name``'s raw files into ``root/planetoid/raw/`` (those not there yet), convert them
    (:func:`arrays_from_raw`) and write ``root/planetoid/NAME.npz`` atomically; returns its path."""
    folder = root / "planetoid"
    raw_dir = folder / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    for part in RAW_PARTS:
        target = raw_file(raw_dir, name, part)
        if not target.is_file():
            _download(f"{RAW_URL}/{target.name}", raw_dir, target.name)
    arrays = arrays_from_raw(raw_dir, name)
    path = folder / f"{name}.npz"
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as f:
        np.savez(f, **arrays)
    os.replace(f.name, path)
    return path


def _download(url: str, folder: Path, filename: str) -> None:
    from torchvision.datasets.utils import download_url

    download_url(url, str(folder), filename)


def arrays_from_raw(raw_dir: Path, name: str) -> dict[str, np.ndarray]:
    """The Planetoid-layout arrays (``features``, ``labels``, ``edges``, ``train_mask``, ``test_mask``; see
    :mod:`ursa_ray.data.graph`) of the raw files of ``name`` in ``raw_dir`` (module docstring)."""
    parts = {part: _read(raw_file(raw_dir, name, part), part) for part in RAW_PARTS}
    test_index = parts["test.index"]
    ordered = np.sort(test_index)
    tx, ty = _dense(parts["tx"]), np.asarray(parts["ty"])
    if name == "citeseer":  # isolated nodes in the test range have no row: zero rows in their places
        span = ordered[-1] - ordered[0] + 1
        tx_full, ty_full = np.zeros((span, tx.shape[1]), tx.dtype), np.zeros((span, ty.shape[1]), ty.dtype)
        tx_full[ordered - ordered[0]], ty_full[ordered - ordered[0]] = tx, ty
        tx, ty = tx_full, ty_full
    features = np.vstack([_dense(parts["allx"]), tx]).astype(np.float32)
    labels = np.vstack([np.asarray(parts["ally"]), ty]).argmax(axis=1)
    features[test_index], labels[test_index] = features[ordered], labels[ordered]  # rows of tx are in file order
    n = len(labels)
    train_mask = np.zeros(n, bool)
    train_mask[: len(parts["y"])] = True
    test_mask = np.zeros(n, bool)
    test_mask[test_index] = True
    edges = np.array([(i, j) for i, neighbours in parts["graph"].items() for j in neighbours if i < n and j < n])
    return {
        "features": features,
        "labels": labels.astype(np.int64),
        "edges": edges.T.reshape(2, -1).astype(np.int64),
        "train_mask": train_mask,
        "test_mask": test_mask,
    }


def _read(path: Path, part: str) -> object:
    if part == "test.index":
        return np.array([int(line) for line in path.read_text().split()], dtype=np.int64)
    with path.open("rb") as f:
        return pickle.load(f, encoding="latin1")


def _dense(matrix: object) -> np.ndarray:
    return np.asarray(matrix.todense() if hasattr(matrix, "todense") else matrix)
