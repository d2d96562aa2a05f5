"""A small regression problem shared by the SWAG and subspace tests."""

from __future__ import annotations

import torch
from torch import nn

from ursa_ray.methods.base import Gaussian, Problem
from ursa_ray.models.mlp import build_mlp


def regression_problem(seed: int = 0, n: int = 64, batch_norm: bool = False, noise: float = 0.1) -> Problem:
    """y = sin(x₁) + 0.5 x₂ + noise·ε on fixed inputs; a small MLP (optionally with a BatchNorm1d layer).

    ``seed`` seeds torch (initial weights) and the mini-batch generator; the data are the same for all seeds.
    """
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 3, generator=data)
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + noise * torch.randn(n, generator=data)

    def make_model() -> nn.Module:
        if batch_norm:
            return nn.Sequential(nn.Linear(3, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 1))
        return build_mlp((3,), 1, [16])

    torch.manual_seed(seed)
    return Problem(
        x=x,
        y=y,
        likelihood=Gaussian(0.3),
        make_model=make_model,
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )
