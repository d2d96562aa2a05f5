"""A model linear in the true features of a synthetic regression problem: f(x) = wᵀ G(x).

With a Gaussian likelihood of known σ and a very wide Gaussian prior on w, its exact posterior
predictive is the anchor of :mod:`ursa_ray.regression.anchor`, which makes it the benchmark's exactness
check for samplers (HMC on this model must reproduce the anchor).  No bias: G already carries the
intercept.  Like every model it has an ``nn.Dropout`` slot (rate 0 unless a method sets it), here on
the features.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ursa_ray.models.base import ModelSpec


class TrueFeatureLinear(nn.Module):
    """x → Linear(Dropout(G(x))) with p = len(G(x)) inputs and no bias."""

    def __init__(self, feature_map: Callable[[Tensor], Tensor], n_features: int, n_outputs: int) -> None:
        super().__init__()
        self.feature_map = feature_map
        self.dropout = nn.Dropout(0.0)
        self.linear = nn.Linear(n_features, n_outputs, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        features = self.feature_map(x.reshape(x.shape[0], -1)).to(self.linear.weight.dtype)
        return self.linear(self.dropout(features))


def build_true_features(
    input_shape: tuple[int, ...], n_outputs: int, feature_map: Callable[[Tensor], Tensor] | None = None
) -> TrueFeatureLinear:
    if feature_map is None:
        raise ValueError("the true_features model needs the dataset's feature_map (synthetic regression only)")
    probe = feature_map(torch.zeros(1, *input_shape, dtype=torch.float32).reshape(1, -1))
    return TrueFeatureLinear(feature_map, int(probe.shape[1]), n_outputs)


MODELS = (
    ModelSpec(
        name="true_features",
        description="linear (no bias) in the true feature map G(x) of a synthetic regression dataset",
        build=build_true_features,
        tasks=("regression",),
        needs_feature_map=True,
        batchable=True,
    ),
)
