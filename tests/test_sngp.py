"""SNGP: the GP layer's Laplace covariance on a fixed feature map, its mean-field predictive, distance
awareness on a 2-D toy set, and the whole method on a classification and a regression problem."""

from __future__ import annotations

import math

import pytest
import torch
from small_problems import regression_problem
from torch import nn

from ursa_ray.methods import get_method
from ursa_ray.methods.base import Categorical, Problem, resolve_config
from ursa_ray.methods.sngp import RandomFeatureGP, install_sngp


def _gp(gaussian_noise_std: float | None = None, n_outputs: int = 3) -> RandomFeatureGP:
    torch.manual_seed(0)
    gp = RandomFeatureGP(4, n_outputs, 32, 1.5, gaussian_noise_std)
    with torch.no_grad():
        gp.beta.normal_(std=2.0)
    return gp


def test_laplace_covariance_on_fixed_features_is_the_closed_form():
    """Accumulated over mini-batches in training mode, the categorical precision of output k is
    I + Σ_i p_ik (1 − p_ik) φ_i φ_iᵀ at p = softmax(φ β) (computed here in one float64 sum), and the
    covariance its inverse.  Catches weights p(1 − p) replaced by p or by 1, a missing prior I, or a
    precision not reset."""
    gp = _gp()
    h = torch.randn(100, 4)
    gp.reset_precision()
    gp.accumulating = True
    gp(h)  # stale sums from an earlier epoch, which reset_precision must clear
    gp.reset_precision()
    for chunk in h.split(32):
        gp(chunk)
    gp.accumulating = False
    gp.finalise()
    phi = gp.features(h).double()
    p = torch.softmax(phi @ gp.beta.detach().double().T, dim=1)
    for k in range(3):
        precision = torch.eye(32, dtype=torch.float64) + (phi * (p[:, k] * (1 - p[:, k]))[:, None]).T @ phi
        torch.testing.assert_close(gp.covariance[k].double(), torch.linalg.inv(precision), rtol=1e-5, atol=1e-7)
    # the per-example variances are φᵀ Σ_k φ
    v = gp.variance(gp.features(h[:5]))
    expected = torch.einsum("bd,kde,be->bk", phi[:5], gp.covariance.double(), phi[:5])
    torch.testing.assert_close(v.double(), expected, rtol=1e-5, atol=1e-6)


def test_gaussian_covariance_is_the_exact_blr_posterior_of_the_features():
    """With a Gaussian likelihood the Laplace covariance of β is the exact posterior (I + ΦᵀΦ/σ²)⁻¹."""
    gp = _gp(gaussian_noise_std=0.3, n_outputs=1)
    h = torch.randn(60, 4)
    gp.reset_precision()
    gp.accumulating = True
    gp(h)
    gp.accumulating = False
    gp.finalise()
    phi = gp.features(h).double()
    exact = torch.linalg.inv(torch.eye(32, dtype=torch.float64) + phi.T @ phi / 0.09)
    torch.testing.assert_close(gp.covariance[0].double(), exact, rtol=1e-5, atol=1e-7)


def test_mean_field_logits_are_scaled_by_their_variance():
    gp = _gp()  # covariance = I, the prior: v = ‖φ‖²
    h = torch.randn(6, 4)
    phi = gp.features(h)
    gp.output_mode = "mean_field"
    v = (phi**2).sum(1, keepdim=True)
    torch.testing.assert_close(gp(h), phi @ gp.beta.detach().T / torch.sqrt(1 + math.pi / 8 * v))


def _two_blobs(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2, generator=gen) * 0.5 + torch.stack([2.0 * y - 1.0, torch.zeros(n)], dim=1)
    return x, y


def test_predictive_variance_grows_with_distance_from_the_training_data():
    """SNGP trained on two blobs at (±1, 0): the GP variance φᵀΣφ (mean over classes) grows from the
    training inputs (0.39 here: confident predictions, p(1 − p) small, add little precision) to radius 5
    (0.72) and radius 20 (1.00, the prior's ‖φ‖² ≈ 1: far features are nearly orthogonal to the training
    features).  A covariance left at the prior I would give ≈ 1 everywhere; one fitted on the wrong
    features would not order the three."""
    torch.manual_seed(0)
    x, y = _two_blobs()
    problem = Problem(
        x=x,
        y=y,
        likelihood=Categorical(),
        make_model=lambda: nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)),
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    method = get_method("sngp")
    config = resolve_config(method, {"epochs": 30, "batch_size": 32, "lr": 1e-2, "n_features": 256, "lengthscale": 1.0})
    stats: dict[str, float] = {}
    (model,) = list(method.sample_posterior(problem, config, stats))
    assert stats["n_samples"] == 1 and stats["grad_evals"] == 30 * 7
    (gp,) = [m for m in model.modules() if isinstance(m, RandomFeatureGP)]
    captured = []
    gp.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    angles = torch.linspace(0, 2 * math.pi, 17)[:-1]
    ring = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    with torch.no_grad():
        variances = []
        for points in (x, 5 * ring, 20 * ring):
            captured.clear()
            model(points)
            variances.append(float(gp.variance(gp.features(captured[0])).mean()))
    near, middle, far = variances
    assert near < middle < far and near < 0.5 * far
    assert far > 0.5
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean()
    assert accuracy > 0.9


def test_sngp_normalises_hidden_layers_and_samples_regression_outputs():
    problem = regression_problem(seed=0, n=64)
    method = get_method("sngp")
    config = resolve_config(method, {"epochs": 3, "batch_size": 16, "n_samples": 4, "n_features": 64})
    stats: dict[str, float] = {}
    samples = list(method.sample_posterior(problem, config, stats))
    assert len(samples) == 4 and stats["n_samples"] == 4
    model = samples[0]
    hidden = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert hidden and all(hasattr(m, "parametrizations") for m in hidden)
    with torch.no_grad():
        a, b = model(problem.x[:8]), model(problem.x[:8])
        sigma = torch.linalg.matrix_norm(hidden[0].weight, ord=2)
    assert not torch.equal(a, b)  # the Gaussian posterior is sampled
    assert float(sigma) == pytest.approx(1.0, rel=0.05)  # spectral norm ~1 after power iterations


def test_install_sngp_needs_a_linear_output_layer():
    with pytest.raises(ValueError, match="no Linear output layer"):
        install_sngp(nn.Sequential(nn.Conv2d(1, 2, 3)), {"n_features": 8, "lengthscale": 1.0}, None)
