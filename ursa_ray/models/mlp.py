"""Fully connected ReLU network; URSABench's small-scale model is the MLP 784-200-200-10."""

from __future__ import annotations

import math

from torch import nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.models.base import ModelSpec


def build_mlp(input_shape: tuple[int, ...], n_outputs: int, widths: list[int] = (200, 200)) -> nn.Sequential:
    """Flatten → [Linear → ReLU → Dropout(0)] per hidden width → Linear to ``n_outputs``."""
    layers: list[nn.Module] = [nn.Flatten()]
    width_in = math.prod(input_shape)
    for width in widths:
        layers += [nn.Linear(width_in, width), nn.ReLU(), nn.Dropout(0.0)]
        width_in = width
    layers.append(nn.Linear(width_in, n_outputs))
    return nn.Sequential(*layers)


def build_linear(input_shape: tuple[int, ...], n_outputs: int) -> nn.Sequential:
    """A linear model on the flattened inputs (Bayesian linear/logistic regression)."""
    return nn.Sequential(nn.Flatten(), nn.Dropout(0.0), nn.Linear(math.prod(input_shape), n_outputs))


MODELS = (
    ModelSpec(
        name="mlp",
        description="ReLU MLP with dropout slots; widths [200, 200] is URSABench's small-scale model",
        build=build_mlp,
        options=(Hyperparameter("widths", list, [200, 200], "hidden layer widths"),),
        batchable=True,
    ),
    ModelSpec(name="linear", description="linear model on the flattened inputs", build=build_linear, batchable=True),
)
