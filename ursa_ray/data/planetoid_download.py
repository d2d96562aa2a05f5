"""``download: true`` for the Planetoid graphs (``cora``, ``citeseer``, ``pubmed``) through the maintained package
that ships them, torch_geometric (``pip install 'ursa-ray[graphs]'``): its ``Planetoid`` dataset downloads the
raw files of Yang, Cohen & Salakhutdinov (2016) and reads them (the public split: 20 training nodes per class,
1,000 test nodes); this module writes its graph as the Planetoid-layout npz that
:func:`ursa_ray.data.graph.load_planetoid` reads, atomically, keeping torch_geometric's own files under
``DATA_ROOT/planetoid/pyg/``.  Without torch_geometric the grid's trial fails with one line saying what to
install (the file layout in docs/data.md is the offline alternative).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ursa_ray.data.base import DatasetMissing

PYG_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


def fetch_planetoid(name: str, root: Path) -> Path:
    """``root/planetoid/NAME.npz`` made from torch_geometric's ``Planetoid(root/planetoid/pyg, NAME)`` (which
    downloads what it lacks); returns its path."""
    try:
        from torch_geometric.datasets import Planetoid
    except ImportError:
        raise DatasetMissing(
            f"{name}: download: true fetches Planetoid graphs through torch_geometric, which is not installed: "
            "pip install 'ursa-ray[graphs]' (or place the npz file, docs/data.md)"
        ) from None
    folder = root / "planetoid"
    folder.mkdir(parents=True, exist_ok=True)
    graph = Planetoid(str(folder / "pyg"), PYG_NAMES[name])[0]
    path = folder / f"{name}.npz"
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as f:
        np.savez(
            f,
            features=graph.x.numpy(),
            labels=graph.y.numpy(),
            edges=graph.edge_index.numpy(),
            train_mask=graph.train_mask.numpy(),
            test_mask=graph.test_mask.numpy(),
        )
    os.replace(f.name, path)
    return path
