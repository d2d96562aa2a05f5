"""The ``gcn`` model and the graph datasets: Kipf & Welling's propagation against a dense hand computation,
leave-out-classes splits that never show a left-out label, perturbed copies that change no other node, and a
linear GCN under HMC against the exact Bayesian linear regression on the propagated features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from exact_blr import batch_means_mcse

from ursa_ray import data, models
from ursa_ray.data.base import DatasetMissing
from ursa_ray.data.graph import Graph, csbm, graph_dataset, load_csbm
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Gaussian, Problem, flat_parameters, resolve_config
from ursa_ray.models.gcn import build_gcn, normalised_adjacency

PATH_EDGES = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # the path 0 - 1 - 2 - 3


def test_normalised_adjacency_of_a_path_by_hand():
    # A + I has row sums (2, 3, 3, 2); Â_ij = 1 / sqrt(d_i d_j) on the path's edges and the diagonal
    r6 = 1 / math.sqrt(6)
    by_hand = torch.tensor(
        [
            [1 / 2, r6, 0, 0],
            [r6, 1 / 3, 1 / 3, 0],
            [0, 1 / 3, 1 / 3, r6],
            [0, 0, r6, 1 / 2],
        ]
    )
    torch.testing.assert_close(normalised_adjacency(PATH_EDGES, 4).to_dense(), by_hand)
    # one direction given, or an edge given twice: the dataset symmetrises; the model counts duplicates once
    doubled = torch.cat([PATH_EDGES, PATH_EDGES], dim=1)
    torch.testing.assert_close(normalised_adjacency(doubled, 4).to_dense(), by_hand)


def test_two_layer_forward_is_kipf_and_welling_on_a_dense_hand_computation():
    torch.manual_seed(0)
    features = torch.randn(4, 3)
    model = build_gcn((1,), 2, feature_map=Graph(features, PATH_EDGES), hidden=5)
    a = torch.eye(4)
    a[PATH_EDGES[0], PATH_EDGES[1]] = 1.0
    d = a.sum(1).rsqrt()
    a_hat = d[:, None] * a * d[None, :]
    w1, b1 = model.layers[0].linear.weight, model.layers[0].linear.bias
    w2, b2 = model.layers[1].linear.weight, model.layers[1].linear.bias
    expected = a_hat @ torch.relu(a_hat @ features @ w1.T + b1) @ w2.T + b2  # biases after propagation
    nodes = torch.tensor([[3.0], [0.0], [2.0]])
    torch.testing.assert_close(model(nodes), expected[[3, 0, 2]])
    assert model(torch.tensor([[2.2], [9.0]])).shape == (2, 2)  # rounded, clamped (noise-perturbed indices)


def test_leave_out_classes_never_shows_a_left_out_label_in_training():
    ds = load_csbm({"left_out_classes": 2}, ("left_out_classes", "perturbed_features"), None, False, 0)
    features, labels, _ = csbm(1000, 5, 16, 0.02, 0.004, 2.0, 0)
    train, test = ds.train_x.flatten().long(), ds.test_x.flatten().long()
    left_out = ds.ood["left_out_classes"].flatten().long()
    assert ds.n_outputs == 3 and set(ds.train_y.tolist()) == {0, 1, 2}
    assert set(labels[left_out.numpy()]) == {3, 4} and len(left_out) == 400  # every node of classes 3 and 4
    assert not set(train.tolist()) & set(left_out.tolist()) and not set(test.tolist()) & set(left_out.tolist())
    assert (labels[train.numpy()] == ds.train_y.numpy()).all() and (labels[test.numpy()] < 3).all()
    assert len(train) == 60 and not set(train.tolist()) & set(test.tolist())
    assert not hasattr(ds.feature_map, "labels")  # the graph a model is built from holds no label
    np.testing.assert_array_equal(ds.feature_map.features[:1000].numpy(), features)


def test_perturbed_copies_receive_but_change_no_other_node():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(30, 4)).astype(np.float32)
    labels = np.arange(30) % 3
    edges = np.stack([np.arange(29), np.arange(1, 30)])
    ds = graph_dataset("g", features, labels, edges, np.arange(0, 9), np.arange(9, 30), 0, ("perturbed_features",), 0)
    graph = ds.feature_map
    plain = graph_dataset("g", features, labels, edges, np.arange(0, 9), np.arange(9, 30), 0, (), 0).feature_map
    assert graph.features.shape[0] == 30 + 21
    torch.manual_seed(0)
    model = build_gcn((1,), 3, feature_map=graph)
    alone = build_gcn((1,), 3, feature_map=Graph(graph.features[:30], plain.edges[:, plain.edges.max(0).values < 30]))
    alone.load_state_dict({k: v for k, v in model.state_dict().items() if k.startswith("layers")}, strict=False)
    nodes = torch.arange(30.0).unsqueeze(1)
    torch.testing.assert_close(model(nodes), alone(nodes))
    copies = ds.ood["perturbed_features"].flatten().long()
    assert (copies >= 30).all() and not torch.equal(model(ds.ood["perturbed_features"]), model(ds.test_x))


def test_planetoid_file_missing_names_the_path_and_a_file_loads(tmp_path):
    with pytest.raises(DatasetMissing, match="planetoid/cora.npz"):
        data.get_dataset("cora").check(tmp_path, ())
    features, labels, edges = csbm(700, 4, 8, 0.02, 0.004, 2.0, 1)
    train_mask = np.zeros(700, bool)
    train_mask[:80] = True
    test_mask = np.zeros(700, bool)
    test_mask[200:400] = True
    (tmp_path / "planetoid").mkdir()
    np.savez(
        tmp_path / "planetoid" / "cora.npz",
        features=features,
        labels=labels,
        edges=edges[:, ::2],
        train_mask=train_mask,
        test_mask=test_mask,
    )
    data.get_dataset("cora").check(tmp_path, ())
    ds = data.get_dataset("cora").load({"left_out_classes": 1}, ("left_out_classes",), tmp_path, False, 0)
    assert ds.n_outputs == 3 and len(ds.train_x) == 60 and (ds.train_y < 3).all()
    assert len(ds.ood["left_out_classes"]) == 175


@pytest.mark.slow
def test_linear_gcn_under_hmc_matches_the_exact_blr_on_propagated_features():
    """One layer and a Gaussian likelihood: y = (ÂX)[i] w + b, a BLR on the propagated features whose posterior
    is known (tests/exact_blr.py's check: means within 3 MCSE, marginal stds within 10 %)."""
    prior_std, noise_std, n, d = 1.0, 0.5, 120, 3
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(n, d, generator=gen, dtype=torch.float64)
    edges = torch.randint(0, n, (2, 300), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    propagated = normalised_adjacency(edges, n).to_dense().double() @ features
    train = torch.arange(0, n, 2)
    phi = torch.cat([propagated[train], torch.ones(len(train), 1, dtype=torch.float64)], dim=1)
    y = phi @ torch.tensor([1.0, -0.5, 0.3, 0.2], dtype=torch.float64)
    y = y + noise_std * torch.randn(len(train), generator=gen, dtype=torch.float64)
    precision = phi.T @ phi / noise_std**2 + torch.eye(d + 1, dtype=torch.float64) / prior_std**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y / noise_std**2

    graph = Graph(features.float(), edges)
    generator = torch.Generator().manual_seed(1)
    problem = Problem(
        x=train.float().unsqueeze(1),
        y=y.float(),
        likelihood=Gaussian(noise_std),
        make_model=lambda: build_gcn((1,), 1, feature_map=graph, layers=1),
        generator=generator,
        device=torch.device("cpu"),
    )
    method = get_method("hmc")
    config = resolve_config(
        method,
        {
            "prior_std": prior_std,
            "step_size": 1e-2,
            "n_leapfrog": 3,
            "burn_in": 200,
            "n_samples": 1500,
            "step_jitter": 0.2,
        },
    )
    torch.manual_seed(0)
    samples = torch.stack([flat_parameters(p).double() for p in method.sample_posterior(problem, config, {})])
    mcse = batch_means_mcse(samples)
    exact_std = cov.diag().sqrt()
    assert (mcse < 0.1 * exact_std).all(), "the chain mixes too slowly for the check to mean anything"
    z = (samples.mean(0) - mean) / mcse
    assert (z.abs() < 3.5).all(), f"(mean − exact) / MCSE = {z.tolist()}"
    ratio = samples.std(0) / exact_std
    assert ((ratio - 1).abs() < 0.12).all(), f"std / exact std = {ratio.tolist()}"


def test_gcn_needs_a_graph_and_is_never_batched():
    with pytest.raises(ValueError, match="graph dataset"):
        build_gcn((8,), 3)
    assert not models.get_model("gcn").batchable


def _write_raw_planetoid(raw_dir, name: str, n_before: int, test_nodes: list[int], n_classes: int, d: int) -> dict:
    """Raw Planetoid files of a tiny graph in the published layout (pickled scipy.sparse features, one-hot
    label arrays, a neighbour dict, test.index in file order) and the truth they encode."""
    import pickle
    from collections import defaultdict

    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    n = max(test_nodes) + 1
    features = (rng.random((n, d)) < 0.3).astype(np.float32)
    labels = rng.integers(0, n_classes, n)
    one_hot = np.eye(n_classes)[labels]
    graph = defaultdict(list)
    for i in range(n):
        for j in rng.choice(n, 2, replace=False):
            graph[i].append(int(j))
    n_train = 2 * n_classes
    parts = {
        "x": sp.csr_matrix(features[:n_train]),
        "y": one_hot[:n_train],
        "allx": sp.csr_matrix(features[:n_before]),
        "ally": one_hot[:n_before],
        "tx": sp.csr_matrix(features[test_nodes]),  # rows in the order of test.index
        "ty": one_hot[test_nodes],
        "graph": graph,
    }
    raw_dir.mkdir(parents=True, exist_ok=True)
    for part, value in parts.items():
        with open(raw_dir / f"ind.{name}.{part}", "wb") as f:
            pickle.dump(value, f, protocol=2)
    (raw_dir / f"ind.{name}.test.index").write_text("\n".join(map(str, test_nodes)) + "\n")
    return {"features": features, "labels": labels, "graph": graph, "n_train": n_train}


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_download_makes_the_npz_layout_from_torch_geometric_planetoid(tmp_path, name):
    """``download: true`` goes through torch_geometric's Planetoid (the maintained package that ships these
    graphs); here its raw files are written beforehand in the published layout (pickled scipy.sparse
    features, one-hot labels, a neighbour dict, test.index in file order; citeseer with an isolated node in
    the test range), so it reads them instead of downloading.  The npz it leads to puts every node's
    features and label at its index, the public masks and every neighbour-list edge, and loads as a dataset."""
    pytest.importorskip("torch_geometric")  # in the test extra: CI runs this
    from ursa_ray.data.planetoid_download import PYG_NAMES

    # torch_geometric's public split also takes the 500 nodes after the training ones for validation
    isolated = [603] if name == "citeseer" else []  # in the test range, in no file
    shuffled = [607, 600, 605, 601, 609, 604, 606, 603, 602, 608]  # as published: not in node order
    test_nodes = [i for i in shuffled if i not in isolated]
    raw = tmp_path / "root" / "planetoid" / "pyg" / PYG_NAMES[name] / "raw"
    truth = _write_raw_planetoid(raw, name, 600, test_nodes, 3, 5)
    ds = data.get_dataset(name).load({"left_out_classes": 0}, (), tmp_path / "root", True, 0)
    with np.load(tmp_path / "root" / "planetoid" / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    real = [i for i in range(610) if i not in isolated]
    np.testing.assert_array_equal(arrays["features"][real], truth["features"][real])
    np.testing.assert_array_equal(arrays["labels"][real], truth["labels"][real])
    for i in isolated:
        assert not arrays["features"][i].any()
    assert np.flatnonzero(arrays["train_mask"]).tolist() == list(range(truth["n_train"]))
    assert np.flatnonzero(arrays["test_mask"]).tolist() == sorted(test_nodes)
    pairs = {(i, j) for i, neighbours in truth["graph"].items() for j in neighbours if i != j}
    edges = set(map(tuple, arrays["edges"].T.tolist()))
    assert pairs <= edges and edges <= pairs | {(j, i) for i, j in pairs}  # torch_geometric symmetrises
    assert len(ds.train_x) == truth["n_train"] and len(ds.test_x) == len(test_nodes)
