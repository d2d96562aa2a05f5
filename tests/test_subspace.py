"""PCA subspace + elliptical slice sampling: the ESS kernel on a closed-form Gaussian, the PCA basis,
the subspace likelihood tempered by ``likelihood_temperature`` and the pca_ess method end to end."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from exact_blr import batch_means_mcse
from small_problems import regression_problem as shared_problem

from ursa_ray.methods import get_method
from ursa_ray.methods.base import Problem, flat_parameters, load_flat_parameters, resolve_config
from ursa_ray.methods.subspace import elliptical_slice, pca_basis, subspace_log_likelihood
from ursa_ray.methods.swag import fit_swa


def regression_problem(seed: int = 0, n: int = 64, batch_norm: bool = False) -> Problem:
    return shared_problem(seed, n, batch_norm, noise=0.3)


SMALL = {"epochs": 3, "swa_epochs": 6, "batch_size": 16, "lr": 0.01, "swa_lr": 0.005, "rank": 4}


# ---------------------------------------------------------------------------------------------------
# The ESS kernel
# ---------------------------------------------------------------------------------------------------

PRIOR_STD = 2.0
LIK_PRECISION = torch.tensor([[2.0, 0.8], [0.8, 1.0]], dtype=torch.float64)
LIK_MEAN = torch.tensor([1.5, -1.0], dtype=torch.float64)


def gaussian_log_lik(z: torch.Tensor) -> float:
    r = z - LIK_MEAN
    return float(-0.5 * r @ LIK_PRECISION @ r)


def run_chain(log_lik_fn, n_steps: int, seed: int) -> tuple[torch.Tensor, int]:
    gen = torch.Generator().manual_seed(seed)
    z = torch.zeros(2, dtype=torch.float64)
    log_lik = None
    chain, evals = [], 0
    for _ in range(n_steps):
        z, log_lik, n = elliptical_slice(z, log_lik_fn, PRIOR_STD, gen, log_lik=log_lik)
        evals += n
        chain.append(z)
    return torch.stack(chain), evals


@pytest.mark.slow
def test_ess_leaves_gaussian_posterior_invariant():
    """Prior N(0, 2² I), likelihood ∝ N(z; m, Λ⁻¹) → posterior N(μ, Σ), Σ = (I/4 + Λ)⁻¹, μ = Σ Λ m."""
    post_cov = torch.linalg.inv(torch.eye(2, dtype=torch.float64) / PRIOR_STD**2 + LIK_PRECISION)
    post_mean = post_cov @ LIK_PRECISION @ LIK_MEAN

    chain, _ = run_chain(gaussian_log_lik, 20000, seed=0)
    chain = chain[500:]
    mcse = batch_means_mcse(chain, n_batches=40)
    assert ((chain.mean(0) - post_mean).abs() < 3 * mcse).all(), (chain.mean(0), post_mean, mcse)
    sample_cov = torch.cov(chain.T)
    variance_ratio = torch.diagonal(sample_cov) / torch.diagonal(post_cov)
    assert ((variance_ratio - 1).abs() < 0.1).all(), variance_ratio
    assert abs(sample_cov[0, 1] - post_cov[0, 1]) < 0.1 * math.sqrt(post_cov[0, 0] * post_cov[1, 1])
    # the test can tell: the likelihood mean alone, or the prior mean alone, is far outside tolerance
    assert ((chain.mean(0) - LIK_MEAN).abs() > 10 * mcse).any()
    assert ((chain.mean(0) - 0.0).abs() > 10 * mcse).any()


def test_ess_with_flat_likelihood_samples_the_prior():
    chain, evals = run_chain(lambda z: 0.0, 5000, seed=1)
    assert evals == 1 + 5000  # the start point, then the first proposal accepted every time
    assert (chain.mean(0).abs() < 3 * batch_means_mcse(chain, n_batches=40)).all()
    variance_ratio = chain.var(0) / PRIOR_STD**2
    assert ((variance_ratio - 1).abs() < 0.1).all(), variance_ratio


def test_ess_counts_evaluations_and_moves():
    calls = []

    def counted(z):
        calls.append(z)
        return gaussian_log_lik(z)

    gen = torch.Generator().manual_seed(2)
    z = torch.tensor([3.0, 3.0], dtype=torch.float64)
    z_new, log_lik, n_evals = elliptical_slice(z, counted, PRIOR_STD, gen)
    assert n_evals == len(calls) >= 2  # current point plus at least one proposal
    assert log_lik == gaussian_log_lik(z_new)
    assert log_lik > gaussian_log_lik(z) + math.log(1e-300) and not torch.equal(z_new, z)
    with pytest.raises(FloatingPointError):
        elliptical_slice(z, lambda _: float("nan"), PRIOR_STD, gen)


# ---------------------------------------------------------------------------------------------------
# PCA basis and the subspace likelihood
# ---------------------------------------------------------------------------------------------------


def test_pca_basis_is_scaled_principal_directions():
    gen = torch.Generator().manual_seed(3)
    d = torch.randn(5, 40, generator=gen, dtype=torch.float64) * torch.tensor([5, 3, 2, 1, 0.5]).double()[:, None]
    basis = pca_basis(d, 5)
    torch.testing.assert_close(basis.T @ basis, d.T @ d)  # full rank: same covariance
    gram = basis @ basis.T
    torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)))  # orthogonal rows
    singular = torch.linalg.svdvals(d)
    top2 = pca_basis(d, 2)
    assert top2.shape == (2, 40)
    torch.testing.assert_close(top2.norm(dim=1), singular[:2])
    assert pca_basis(d, 99).shape == (5, 40)


def test_subspace_log_likelihood_is_the_full_batch_log_likelihood_over_t():
    problem = regression_problem()
    model = problem.make_model()
    mean = flat_parameters(model)
    basis = torch.randn(2, mean.numel(), generator=torch.Generator().manual_seed(4)) * 0.1
    z = torch.tensor([0.5, -1.0], dtype=torch.float64)

    reference = problem.make_model()
    load_flat_parameters(reference, mean + 0.5 * basis[0] - 1.0 * basis[1])
    with torch.no_grad():
        exact = problem.likelihood.log_prob(reference(problem.x), problem.y).sum().item()

    for likelihood_temperature in (1.0, 50.0):
        f = subspace_log_likelihood(model, problem, mean, basis, likelihood_temperature, chunk=10)
        assert f(z) == pytest.approx(exact / likelihood_temperature, rel=1e-5)
    torch.testing.assert_close(flat_parameters(model), flat_parameters(reference))


# ---------------------------------------------------------------------------------------------------
# The method
# ---------------------------------------------------------------------------------------------------


def _subspace_of(seed: int, config) -> tuple[torch.Tensor, torch.Tensor]:
    _, moments = fit_swa(regression_problem(seed), config, {}, max(config["rank"], 2), "final")
    deviations = moments.deviation_matrix() / math.sqrt(moments.n_stored - 1)
    return moments.mean.float(), pca_basis(deviations, config["rank"])


def _run(seed: int, overrides) -> tuple[list[torch.Tensor], dict, dict]:
    config = resolve_config(get_method("pca_ess"), {**SMALL, **overrides})
    stats: dict[str, float] = {}
    stream = get_method("pca_ess").sample_posterior(regression_problem(seed), config, stats)
    params = [flat_parameters(p) for p in stream]
    return params, stats, config


def test_pca_ess_samples_lie_in_the_subspace_and_differ():
    params, stats, config = _run(seed=5, overrides={"n_samples": 6, "ess_burn_in": 2})
    assert len(params) == 6 and stats["n_samples"] == 6
    assert stats["grad_evals"] == (config["epochs"] + config["swa_epochs"]) * 4
    assert stats["subspace_rank"] == 4
    assert stats["likelihood_evals"] >= 1 + 8
    for a, b in itertools.combinations(params, 2):
        assert not torch.allclose(a, b)

    mean, basis = _subspace_of(5, config)
    for theta in params:
        z = torch.linalg.lstsq(basis.T.double(), (theta - mean).double().unsqueeze(1)).solution
        residual = (theta - mean).double() - basis.T.double() @ z.squeeze(1)
        assert residual.norm() < 1e-4 * max(1.0, (theta - mean).norm().item())
        assert (theta - mean).norm() > 1e-4


def _subspace_spread(seed: int, overrides) -> float:
    params, _, config = _run(seed, overrides)
    mean, basis = _subspace_of(seed, config)
    coords = [
        torch.linalg.lstsq(basis.T.double(), (t - mean).double().unsqueeze(1)).solution.squeeze(1) for t in params
    ]
    # z as the sampler sees it; its spread across samples (the mode need not be at z = 0)
    return torch.stack(coords).std(0).mean().item()


def test_likelihood_temperature_flattens_only_the_likelihood():
    # T < 1 sharpens the (here nearly flat) subspace likelihood; T → ∞ leaves the untempered N(0, 2² I) prior
    cold = _subspace_spread(6, {"n_samples": 15, "ess_burn_in": 15, "likelihood_temperature": 0.01})
    hot = _subspace_spread(6, {"n_samples": 15, "ess_burn_in": 15, "likelihood_temperature": 1e9})
    assert hot > 2 * cold, (hot, cold)
    assert 0.6 < hot / 2.0 < 1.4, hot  # ≈ the prior std 2 once the likelihood is flattened


def test_pca_ess_refreshes_batch_norm():
    problem = regression_problem(seed=7, batch_norm=True)
    config = resolve_config(get_method("pca_ess"), {**SMALL, "n_samples": 2})
    for predictor in get_method("pca_ess").sample_posterior(problem, config, {}):
        with torch.no_grad():
            h = predictor[0](problem.x)
        torch.testing.assert_close(predictor[1].running_mean, h.mean(0), rtol=1e-5, atol=1e-5)
        assert not predictor.training


def test_pca_ess_needs_two_iterates():
    config = resolve_config(get_method("pca_ess"), {**SMALL, "swa_epochs": 1})
    with pytest.raises(ValueError, match="two collected iterates"):
        list(get_method("pca_ess").sample_posterior(regression_problem(), config, {}))
