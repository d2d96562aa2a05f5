"""Mean-field VI (Bayes by Backprop): the fitted factorised Gaussian of a linear-Gaussian model is the known
optimum; the closed-form KL; Flipout's per-example weight sharing in convolutions; batched seeds."""

from __future__ import annotations

import pytest
import torch
from exact_blr import make_blr_problem
from small_problems import regression_problem
from torch import nn
from torch.nn import functional as F

from ursa_ray.methods import get_method
from ursa_ray.methods.base import Categorical, Problem, resolve_config
from ursa_ray.methods.batched import StackedNetworks
from ursa_ray.methods.mfvi import BayesianConv2d, BayesianLayer, install_bayesian_layers, kl_terms, stacked_kl
from ursa_ray.models.mlp import build_mlp
from ursa_ray.models.resnet import CifarResNet


def _flat_q(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Means and σ of the linear model's [w, b], in flat_parameters order."""
    (layer,) = [m for m in model.modules() if isinstance(m, BayesianLayer)]
    mean = torch.cat([layer.weight_mean.detach().reshape(-1), layer.bias_mean.detach()])
    rho = torch.cat([layer.weight_rho.detach().reshape(-1), layer.bias_rho.detach()])
    return mean.double(), F.softplus(rho).double()


def correlated_blr_problem(correlation: float = 0.6, n: int = 256, d: int = 4, noise_std: float = 0.5):
    """:func:`exact_blr.make_blr_problem` with equicorrelated inputs (``correlation`` between features), so
    the posterior is correlated and the mean-field optimum visibly narrower than the marginals."""
    problem, _, _ = make_blr_problem(n=n, d=d, noise_std=noise_std)
    gen = torch.Generator().manual_seed(5)
    z, shared = (
        torch.randn(n, d, generator=gen, dtype=torch.float64),
        torch.randn(n, 1, generator=gen, dtype=torch.float64),
    )
    x = (1 - correlation) ** 0.5 * z + correlation**0.5 * shared + 0.15
    y = (
        x @ torch.linspace(-1, 1, d, dtype=torch.float64)
        + 0.5
        + noise_std * torch.randn(n, generator=gen, dtype=torch.float64)
    )
    phi = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    precision = phi.T @ phi / noise_std**2 + torch.eye(d + 1, dtype=torch.float64)
    cov = torch.linalg.inv(precision)
    problem.x, problem.y = x.float(), y.float()
    return problem, cov @ (phi.T @ y) / noise_std**2, cov


def test_fitted_mean_field_gaussian_is_the_optimum_of_bayesian_linear_regression():
    """For a linear-Gaussian model the ELBO's optimum over factorised Gaussians is known: means = the
    posterior mean, precisions = the diagonal of the posterior precision A (so σ_j = A_jj^(-1/2), smaller
    than the marginal posterior std when the posterior is correlated).  The fitted q must reach it: means
    within 0.1 posterior std, σ within 6% (the stochastic optimisation's own error is ~0.03 std and ~2%).
    Catches a KL without its σ terms, σ in place of σ² in the local reparameterisation, the KL not divided
    by N, or σ fitted to the marginal posterior std (ratios up to 1.4 here)."""
    torch.manual_seed(0)
    problem, mean, cov = correlated_blr_problem()
    method = get_method("mfvi")
    config = resolve_config(
        method,
        {
            "epochs": 300,
            "batch_size": 32,
            "lr": 0.01,
            "kl_warmup": 0.0,
            "prior_std": 1.0,
            "init_std": 0.1,
            "n_samples": 1,
        },
    )
    stats: dict[str, float] = {}
    model = next(method.sample_posterior(problem, config, stats))
    fitted_mean, fitted_std = _flat_q(model)
    optimal_std = torch.linalg.inv(cov).diag().rsqrt()
    assert ((fitted_mean - mean) / cov.diag().sqrt()).abs().max() < 0.1
    torch.testing.assert_close(fitted_std, optimal_std, rtol=0.06, atol=0)
    assert (cov.diag().sqrt() / optimal_std).max() > 1.3  # the mean-field optimum is not the marginal
    assert stats["grad_evals"] == 300 * 8 and stats["n_samples"] == 1


def test_kl_is_the_closed_form_of_torch_distributions():
    mean, rho = torch.randn(50), torch.randn(50)
    q = torch.distributions.Normal(mean, F.softplus(rho))
    p = torch.distributions.Normal(torch.zeros(50), torch.full((50,), 0.7))
    torch.testing.assert_close(kl_terms(mean, rho, 0.7), torch.distributions.kl_divergence(q, p))


def test_stacked_kl_is_each_copys_own():
    torch.manual_seed(0)
    models = [build_mlp((3,), 1, [16, 8]) for _ in range(3)]
    layers = [install_bayesian_layers(m, 0.01 * (c + 1)) for c, m in enumerate(models)]
    with torch.no_grad():
        for model in models:
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape))
    expected = torch.stack([sum(layer.kl(0.5) for layer in ls) for ls in layers]).detach()
    kl = stacked_kl(models[0], 0.5)
    torch.testing.assert_close(kl(StackedNetworks(models).parameters()).detach(), expected, rtol=1e-6, atol=1e-5)


def test_flipout_gives_each_example_one_weight_draw_shared_over_positions():
    """Over many passes, one example's outputs at two positions have the covariance of a shared weight
    draw, Σ x_a x_b σ² (the local reparameterisation trick would make it 0), and each position the variance
    Σ x² σ² and the mean conv(x, μ).  Monte Carlo: 2,000 passes of one example (with one channel the
    examples of a pass share ε up to sign), tolerances ≥ 3.5 standard errors (~3% each)."""
    torch.manual_seed(0)
    layer = BayesianConv2d(nn.Conv2d(1, 1, 3, padding=0, bias=False), init_std=0.5)
    x = torch.randn(1, 1, 3, 4)  # two output positions whose 3×3 windows overlap in two columns
    with torch.no_grad():
        out = torch.stack([layer(x) for _ in range(2_000)]).reshape(-1, 2)
    sigma2 = F.softplus(layer.weight_rho).detach().reshape(-1) ** 2
    a, b = x[0, 0, :, 0:3].reshape(-1), x[0, 0, :, 1:4].reshape(-1)
    cov = torch.cov(out.T)
    expected = torch.tensor(
        [[(a * a * sigma2).sum(), (a * b * sigma2).sum()], [(a * b * sigma2).sum(), (b * b * sigma2).sum()]]
    )
    torch.testing.assert_close(cov, expected, atol=0.12 * expected.abs().max(), rtol=0)
    assert expected[0, 1].abs() > 0.3 * expected.abs().max()  # a covariance the local trick would miss
    torch.testing.assert_close(
        out.mean(0), F.conv2d(x, layer.weight_mean.detach()).reshape(-1), atol=0.1 * expected.abs().max() ** 0.5, rtol=0
    )


def test_mfvi_trains_a_cnn_with_batch_norm():
    """A two-stage CIFAR ResNet (convolutions through Flipout, batch norm as point estimates) trains, and
    its posterior samples differ."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, 8, 8, generator=gen)
    problem = Problem(
        x=x,
        y=(x.mean((1, 2, 3)) > 0).long(),
        likelihood=Categorical(),
        make_model=lambda: CifarResNet(3, 2, width=4, stages=(1, 1)),
        generator=gen,
        device=torch.device("cpu"),
    )
    method = get_method("mfvi")
    config = resolve_config(method, {"epochs": 2, "batch_size": 16, "n_samples": 2})
    stats: dict[str, float] = {}
    samples = method.sample_posterior(problem, config, stats)
    model = next(samples)
    assert any(isinstance(m, BayesianConv2d) for m in model.modules())
    assert not any(type(m) in (nn.Conv2d, nn.Linear) for m in model.modules())
    with torch.no_grad():
        assert not torch.equal(model(x[:4]), model(x[:4]))
    assert stats["grad_evals"] == 4 and torch.isfinite(torch.tensor(stats["final_loss"]))


def test_two_seed_batched_run_trains_each_copy():
    method = get_method("mfvi")
    config = resolve_config(method, {"epochs": 30, "batch_size": 32, "n_samples": 4, "lr": 1e-2})
    problems = [regression_problem(seed=s, n=128) for s in (1, 2)]
    probe_stats = [{} for _ in problems]
    short = resolve_config(method, {**config, "epochs": 1, "lr": 0.0})
    for _ in method.sample_posterior_batched([regression_problem(seed=s, n=128) for s in (1, 2)], short, probe_stats):
        pass
    stats = [{} for _ in problems]
    items = list(method.sample_posterior_batched(problems, config, stats))
    assert len(items) == 4 and all(len(item) == 2 for item in items)
    a, b = items[0]
    for before, after in zip(probe_stats, stats, strict=True):
        assert after["final_loss"] < before["final_loss"] - 0.1
        assert after["n_samples"] == 4 and after["grad_evals"] == 30 * 4
    assert stats[0]["mfvi_sigma_mean"] != stats[1]["mfvi_sigma_mean"]
    x = problems[0].x[:16]
    with torch.no_grad():
        assert not torch.equal(a(x), a(x))
        assert torch.isfinite(b(x)).all()


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_prior_std_must_be_positive(value):
    with pytest.raises(ValueError, match="prior_std|expected a value"):
        resolve_config(get_method("mfvi"), {"prior_std": value})
