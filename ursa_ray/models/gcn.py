"""Graph convolutional network for node classification (Kipf & Welling 2017, "Semi-supervised classification
with graph convolutional networks").

Propagation with the symmetric normalised adjacency with self-loops, Â = D^{−1/2} (A + I) D^{−1/2},
D_ii = Σ_j (A + I)_ij; a layer is H' = Â dropout(H) Wᵀ + b, ReLU between layers; two layers by default:

    f(X) = Â relu(Â dropout(X) W₁ᵀ + b₁) W₂ᵀ + b₂   (dropout also on the hidden layer).

One layer (``layers: 1``) is a linear model on the propagated features ÂX: under a Gaussian likelihood its
posterior is a Bayesian linear regression on them (a test checks SGLD against it).

**The graph lives in the model.**  The model is built with the dataset's graph (its ``feature_map``: node
indices → node features, with the graph's ``edges``; :class:`ursa_ray.data.graph.Graph`) and keeps the node
features and Â (sparse) as buffers; its *input* is a batch of node indices (floats, rounded), its output
those nodes' logits from one full-graph pass.  So every method's mini-batches are subsets of the labelled
training nodes, full-batch HMC passes all of them, and N in the SG-MCMC scaling is the number of labelled
training nodes.  Each layer propagates before its Linear map (Â(HWᵀ) = (ÂH)Wᵀ), and the last layer
propagates, then picks the batch's nodes, then applies its Linear map, so the head sees one feature row per
example (last-layer Laplace).  The model has buffers, so seeds are never batched (one seed a trial).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.models.base import ModelSpec


def normalised_adjacency(edges: Tensor, n_nodes: int) -> Tensor:
    """Â = D^{−1/2} (A + I) D^{−1/2} as a sparse COO (n, n) float32 tensor; ``edges`` (2, E) long holds the
    pairs (i, j) with A_ij = 1 (give both directions for an undirected graph; duplicates count once).
    D_ii is row i's sum of A + I; a row holds the messages node i receives."""
    loops = torch.arange(n_nodes).expand(2, n_nodes)
    index = torch.unique(torch.cat([edges.long(), loops], dim=1), dim=1)
    ones = torch.ones(index.shape[1])
    degree = torch.zeros(n_nodes).index_add_(0, index[0], ones)
    scale = degree.rsqrt()
    values = scale[index[0]] * scale[index[1]]
    return torch.sparse_coo_tensor(index, values, (n_nodes, n_nodes), check_invariants=True).coalesce()


class GraphConvolution(nn.Module):
    """One layer's dropout slot and Linear map, in this order (concrete dropout pairs a slot with the next map)."""

    def __init__(self, n_in: int, n_out: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(n_in, n_out)


class GCN(nn.Module):
    """``layers`` graph convolutions (module docstring) on the graph held in its buffers."""

    def __init__(
        self, features: Tensor, edges: Tensor, n_outputs: int, hidden: int, layers: int, dropout: float
    ) -> None:
        super().__init__()
        n_nodes, n_features = features.shape
        self.register_buffer("features", features.to(torch.float32).clone())
        self.register_buffer("adjacency", normalised_adjacency(edges, n_nodes))
        widths = [n_features] + [hidden] * (layers - 1) + [n_outputs]
        self.layers = nn.ModuleList(GraphConvolution(a, b, dropout) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, nodes: Tensor) -> Tensor:
        """Logits of the nodes ``nodes`` (indices as numbers, rounded and clamped to the graph's nodes)."""
        index = nodes.reshape(-1).round().long().clamp(0, self.features.shape[0] - 1)
        h = self.features
        for i, layer in enumerate(self.layers):
            h = torch.sparse.mm(self.adjacency, layer.dropout(h).to(self.adjacency.dtype))
            if i == len(self.layers) - 1:
                return layer.linear(h[index])
            h = torch.relu(layer.linear(h))
        raise AssertionError("a GCN has at least one layer")


def build_gcn(
    input_shape: tuple[int, ...],
    n_outputs: int,
    feature_map: Any = None,
    hidden: int = 16,
    layers: int = 2,
    dropout: float = 0.0,
) -> GCN:
    """A :class:`GCN` on the graph ``feature_map`` (a graph dataset's: ``features`` (n, d) and ``edges`` (2, E))."""
    if feature_map is None or not hasattr(feature_map, "edges"):
        raise ValueError("gcn needs a graph dataset (csbm, cora, citeseer, pubmed): its inputs are node indices")
    return GCN(feature_map.features, feature_map.edges, n_outputs, hidden, layers, dropout)


MODELS = (
    ModelSpec(
        name="gcn",
        description="graph convolutional network (Kipf & Welling 2017) on a graph dataset's nodes",
        build=build_gcn,
        sparse_propagation=True,
        options=(
            Hyperparameter("hidden", int, 16, "hidden units of each inner layer", low=1),
            Hyperparameter(
                "layers", int, 2, "graph convolutions (1: linear in the propagated features)", low=1, high=8
            ),
            Hyperparameter(
                "dropout", float, 0.0, "dropout rate on each layer's input (Kipf & Welling: 0.5)", low=0.0, high=0.95
            ),
        ),
        needs_feature_map=True,
    ),
)
