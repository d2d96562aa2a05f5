"""Node classification on one graph, transductive: ``csbm`` (embedded, synthetic) and Planetoid-layout files
(``cora``, ``citeseer``, ``pubmed``).

A graph dataset's inputs are **node indices** (float32, shape (n, 1)); the graph itself -- node features and
edges, never labels -- is the dataset's ``feature_map``, a :class:`Graph` (node indices → their features),
from which the ``gcn`` model is built (:mod:`ursa_ray.models.gcn`).  ``train_x`` holds the labelled training
nodes (N of the SG-MCMC scaling is their number), ``test_x`` the test nodes; every other node is in the
graph but unlabelled.  The search phase carves its validation nodes out of the training nodes.

OOD sets (Stadler et al. 2021, "Graph posterior network", leave-out-classes and feature perturbations):

- ``left_out_classes``: the last k classes (option ``left_out_classes``, default 1) are left out of training
  and testing: the model has K − k outputs, no left-out node is a training or test node, and the OOD set is
  every node of the left-out classes (their features and edges stay in the graph, as in any transductive
  split; their labels are never seen);
- ``perturbed_features``: one copy of every test node whose features are redrawn from a Gaussian with the
  features' per-column mean and std (no class information), with the original's incoming edges.  The copies
  only *receive* messages, so no other node's representation changes; they are part of every graph of the
  dataset, asked for or not.

``csbm``: the contextual stochastic block model (Deshpande et al. 2018): n nodes in K equal classes, an edge
between two nodes of one class with probability ``p_in`` and of two classes with ``p_out``, features
x_i = μ_{y_i} + ε, ε ~ N(0, I), class means μ_k drawn N(0, ``separation``² / d · I).  The graph and the
split come from ``graph_seed`` (the same for every trial): 20 training nodes per kept class and 500 test
nodes (all the others on a smaller graph), as in Planetoid.

Planetoid files, ``DATA_ROOT/planetoid/NAME.npz`` (NAME: cora, citeseer, pubmed): ``features`` (n, d)
numbers, ``labels`` (n,) integers 0..K−1, ``edges`` (2, E) integers (both directions of an undirected
edge, or either: the graph is symmetrised), ``train_mask`` and ``test_mask`` (n,) booleans.  Features are
used as stored (row-normalise them beforehand for Kipf & Welling's setup).  ``download: true`` makes them
through torch_geometric's Planetoid (:mod:`ursa_ray.data.planetoid_download`); docs/data.md also says how to
make them by hand on an online machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data.base import Dataset, DatasetMissing, DatasetSpec
from ursa_ray.methods.base import Hyperparameter

OOD_SETS = ("left_out_classes", "perturbed_features")
PLANETOID = ("cora", "citeseer", "pubmed")
PLANETOID_ARRAYS = ("features", "labels", "edges", "train_mask", "test_mask")
TRAIN_PER_CLASS, N_TEST = 20, 500


@dataclass
class Graph:
    """Node features (n, d) float32 and directed edges (2, E) long (A_ij = 1 for each column (i, j): node i
    receives from node j).  Called with node indices, it gives their features (the dataset's feature map)."""

    features: Tensor
    edges: Tensor

    def __call__(self, nodes: Tensor) -> Tensor:
        return self.features[nodes.reshape(-1).round().long()]


def symmetric(edges: np.ndarray) -> np.ndarray:
    """Both directions of every edge, without self-loops or duplicates, (2, E) int64."""
    both = np.concatenate([edges, edges[::-1]], axis=1).astype(np.int64)
    both = both[:, both[0] != both[1]]
    return np.unique(both, axis=1)


def with_perturbed_copies(
    features: np.ndarray, edges: np.ndarray, nodes: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph with one receive-only copy of each of ``nodes`` whose features are redrawn from
    N(column mean, column std²): (features, edges, the copies' indices)."""
    n = features.shape[0]
    rng = np.random.default_rng(seed)
    drawn = rng.normal(features.mean(0), features.std(0), size=(len(nodes), features.shape[1]))
    copies = np.arange(n, n + len(nodes))
    copy_of = np.full(n, -1)
    copy_of[nodes] = copies
    incoming = edges[:, copy_of[edges[0]] >= 0]  # (i, j): i a copied node receiving from j
    copied_edges = np.stack([copy_of[incoming[0]], incoming[1]])
    return (
        np.concatenate([features, drawn]).astype(np.float32),
        np.concatenate([edges, copied_edges], axis=1),
        copies,
    )


def graph_dataset(
    name: str,
    features: np.ndarray,
    labels: np.ndarray,
    edges: np.ndarray,
    train_nodes: np.ndarray,
    test_nodes: np.ndarray,
    left_out: int,
    ood_names: tuple[str, ...],
    seed: int,
) -> Dataset:
    """The :class:`Dataset` of one graph (module docstring): ``left_out`` last classes held out of training and
    testing, OOD sets ``ood_names``; ``seed`` draws the perturbed features."""
    n_classes = int(labels.max()) + 1
    kept = n_classes - left_out
    if kept < 2:
        raise ValueError(f"{name}: leaving out {left_out} of {n_classes} classes leaves fewer than 2 to classify")
    if left_out == 0 and "left_out_classes" in ood_names:
        raise ValueError(f"{name}: OOD set left_out_classes needs the option left_out_classes >= 1")
    train_nodes = train_nodes[labels[train_nodes] < kept]
    test_nodes = test_nodes[labels[test_nodes] < kept]
    edges = symmetric(edges)
    features, edges, copies = with_perturbed_copies(features.astype(np.float32), edges, test_nodes, seed)
    ood_nodes = {"left_out_classes": np.flatnonzero(labels >= kept), "perturbed_features": copies}

    def nodes(index: np.ndarray) -> Tensor:
        return torch.from_numpy(index.astype(np.float32)).unsqueeze(1)

    return Dataset(
        name=name,
        task="classification",
        input_shape=(1,),
        n_outputs=kept,
        train_x=nodes(train_nodes),
        train_y=torch.from_numpy(labels[train_nodes].astype(np.int64)),
        test_x=nodes(test_nodes),
        test_y=torch.from_numpy(labels[test_nodes].astype(np.int64)),
        ood={o: nodes(ood_nodes[o]) for o in ood_names},
        feature_map=Graph(torch.from_numpy(features), torch.from_numpy(edges)),
    )


def planetoid_split(labels: np.ndarray, kept: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Planetoid's split: 20 random training nodes per kept class, then 500 random test nodes of the rest (all of
    them on a smaller graph)."""
    train = np.concatenate([rng.permutation(np.flatnonzero(labels == k))[:TRAIN_PER_CLASS] for k in range(kept)])
    rest = rng.permutation(np.setdiff1d(np.arange(len(labels)), train))
    return np.sort(train), np.sort(rest[:N_TEST])


def csbm(
    n_nodes: int, n_classes: int, n_features: int, p_in: float, p_out: float, separation: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, labels, edges) of a contextual stochastic block model (module docstring)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n_nodes) % n_classes
    means = rng.normal(0.0, separation / np.sqrt(n_features), size=(n_classes, n_features))
    features = means[labels] + rng.normal(size=(n_nodes, n_features))
    i, j = np.triu_indices(n_nodes, k=1)
    p = np.where(labels[i] == labels[j], p_in, p_out)
    keep = rng.random(len(i)) < p
    return features.astype(np.float32), labels, np.stack([i[keep], j[keep]])


def load_csbm(options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int) -> Dataset:
    """``csbm`` with its options (the graph and split fixed by ``graph_seed``, whatever the trial's seed)."""
    o = {h.name: h.default for h in CSBM_OPTIONS} | dict(options)
    if o["n_nodes"] < 2 * o["n_classes"] * TRAIN_PER_CLASS:
        raise ValueError(
            f"csbm: n_nodes must be at least {2 * o['n_classes'] * TRAIN_PER_CLASS} (20 training nodes a class, as many to test)"
        )
    features, labels, edges = csbm(
        o["n_nodes"], o["n_classes"], o["n_features"], o["p_in"], o["p_out"], o["separation"], o["graph_seed"]
    )
    rng = np.random.default_rng(o["graph_seed"] + 1)
    train, test = planetoid_split(labels, o["n_classes"] - o["left_out_classes"], rng)
    return graph_dataset(
        "csbm", features, labels, edges, train, test, o["left_out_classes"], ood_names, o["graph_seed"]
    )


def planetoid_path(root: Path, name: str) -> Path:
    return root / "planetoid" / f"{name}.npz"


def check_planetoid(name: str, root: Path, ood_names: tuple[str, ...]) -> None:
    """DatasetMissing naming the file looked for when it is absent or lacks an array."""
    path = planetoid_path(root, name)
    if not path.is_file():
        raise DatasetMissing(
            f"{name}: no file {path}; put a Planetoid-layout npz there (arrays {', '.join(PLANETOID_ARRAYS)}; "
            "docs/data.md says how to make one)"
        )
    with np.load(path, allow_pickle=False) as npz:
        missing = [a for a in PLANETOID_ARRAYS if a not in npz.files]
    if missing:
        raise DatasetMissing(
            f"{name}: {path} has no array {', '.join(missing)}; a Planetoid-layout npz holds {', '.join(PLANETOID_ARRAYS)}"
        )


def load_planetoid(
    name: str, options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int
) -> Dataset:
    """A Planetoid-layout file (module docstring) with its own train and test masks; with ``download``, made
    first through torch_geometric when it is absent (:mod:`ursa_ray.data.planetoid_download`)."""
    if download and not planetoid_path(root, name).is_file():
        from ursa_ray.data.planetoid_download import fetch_planetoid

        fetch_planetoid(name, root)
    check_planetoid(name, root, ood_names)
    left_out = dict(options).get("left_out_classes", 1)
    with np.load(planetoid_path(root, name), allow_pickle=False) as npz:
        arrays = {a: npz[a] for a in PLANETOID_ARRAYS}
    train = np.flatnonzero(arrays["train_mask"].astype(bool))
    test = np.flatnonzero(arrays["test_mask"].astype(bool))
    return graph_dataset(
        name,
        arrays["features"],
        arrays["labels"].astype(np.int64),
        arrays["edges"],
        train,
        test,
        left_out,
        ood_names,
        0,
    )


LEFT_OUT = Hyperparameter(
    "left_out_classes", int, 1, "the last k classes, held out of training and testing (OOD)", low=0
)
CSBM_OPTIONS = (
    Hyperparameter("n_nodes", int, 1000, "nodes", low=2),
    Hyperparameter("n_classes", int, 5, "classes K (equal sizes)", low=2),
    Hyperparameter("n_features", int, 16, "feature dimension d", low=1),
    Hyperparameter("p_in", float, 0.02, "edge probability within a class", low=0.0, high=1.0),
    Hyperparameter("p_out", float, 0.004, "edge probability between classes", low=0.0, high=1.0),
    Hyperparameter("separation", float, 2.0, "norm scale of the class means (feature signal)", low=0.0),
    Hyperparameter("graph_seed", int, 0, "seed of the graph, features and split", low=0),
    LEFT_OUT,
)

DATASETS = (
    DatasetSpec(
        name="csbm",
        task="classification",
        description="contextual stochastic block model (embedded, synthetic graph): node classification",
        load=load_csbm,
        ood_sets=OOD_SETS,
        images=False,
        options=CSBM_OPTIONS,
    ),
    *(
        DatasetSpec(
            name=name,
            task="classification",
            description=f"{name} citation graph from DATA_ROOT/planetoid/{name}.npz (Planetoid layout)",
            load=partial(load_planetoid, name),
            ood_sets=OOD_SETS,
            images=False,
            options=(LEFT_OUT,),
            check=partial(check_planetoid, name),
        )
        for name in PLANETOID
    ),
)
