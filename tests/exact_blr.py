"""Test fixture: Bayesian linear regression, whose posterior is Gaussian and known in closed form.

Model: ursa-ray's ``linear`` model (``build_linear``: y = w·x + b) with the ``Gaussian`` likelihood of
known noise std σ, and the prior N(0, s² I) on *all* its parameters [w, b] (bias included, as the
samplers' prior is).  With features Φ = [x, 1] (n × (d+1)):

    precision A = ΦᵀΦ / σ² + I / s²,   cov = A⁻¹,   mean = cov · Φᵀy / σ²,

in the order of :func:`~ursa_ray.methods.base.flat_parameters` (the d weights, then the bias).
Inputs have per-feature scales in [0.8, 1.2] and a common offset 0.15, so the posterior is correlated and
its marginal stds differ (by ~1.4×) while staying well conditioned (condition number ~2.7 with the
defaults), so samplers mix in a few thousand steps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ursa_ray.methods.base import Gaussian, Problem, load_flat_parameters
from ursa_ray.models.mlp import build_linear


def make_blr_problem(
    n: int = 256,
    d: int = 4,
    noise_std: float = 0.5,
    prior_std: float = 1.0,
    seed: int = 0,
    init_std: float = 1.0,
) -> tuple[Problem, Tensor, Tensor]:
    """A BLR :class:`Problem` on the CPU and its exact posterior (mean, covariance; float64).

    ``make_model()`` returns a ``linear`` model whose [w, b] are drawn N(0, init_std²) from the
    problem's generator (seeded with ``seed``).  Pass ``prior_std`` on to the method's config: the
    exact posterior is only the target when the two agree.
    """
    data = torch.Generator().manual_seed(seed)
    scales = torch.linspace(0.8, 1.2, d, dtype=torch.float64)
    x = torch.randn(n, d, generator=data, dtype=torch.float64) * scales + 0.15
    w_true = torch.randn(d, generator=data, dtype=torch.float64)
    b_true = 0.5
    y = x @ w_true + b_true + noise_std * torch.randn(n, generator=data, dtype=torch.float64)

    phi = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    precision = phi.T @ phi / noise_std**2 + torch.eye(d + 1, dtype=torch.float64) / prior_std**2
    cov = torch.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    mean = cov @ (phi.T @ y) / noise_std**2

    generator = torch.Generator().manual_seed(seed + 1)

    def make_model() -> torch.nn.Module:
        model = build_linear((d,), 1)
        load_flat_parameters(model, init_std * torch.randn(d + 1, generator=generator))
        return model

    problem = Problem(
        x=x.float(),
        y=y.float(),
        likelihood=Gaussian(noise_std=noise_std),
        make_model=make_model,
        generator=generator,
        device=torch.device("cpu"),
    )
    return problem, mean, cov


def potential(problem: Problem, theta: Tensor, prior_std: float) -> Tensor:
    """U(θ) = −Σ log p(y|x, θ) − log N(θ; 0, prior_std² I) in float64; θ = [w, b] flat, or rows of them."""
    theta = theta.to(torch.float64)
    phi = torch.cat([problem.x.double(), torch.ones(problem.n_train, 1, dtype=torch.float64)], dim=1)
    sigma = problem.likelihood.noise_std
    y = problem.y.double()
    residual = y.unsqueeze(-1) - phi @ theta.T if theta.dim() == 2 else y - phi @ theta
    nll = 0.5 * (residual / sigma) ** 2 + math.log(sigma) + 0.5 * math.log(2 * math.pi)
    d = theta.shape[-1]
    log_prior = -0.5 * (theta**2).sum(-1) / prior_std**2 - d * (math.log(prior_std) + 0.5 * math.log(2 * math.pi))
    return nll.sum(0) - log_prior


def batch_means_mcse(samples: Tensor, n_batches: int = 25) -> Tensor:
    """Monte Carlo standard error of each column's mean from a chain (rows in order), by batch means."""
    usable = samples[: len(samples) // n_batches * n_batches]
    means = usable.reshape(n_batches, -1, samples.shape[1]).mean(1)
    return means.std(0) / math.sqrt(n_batches)
