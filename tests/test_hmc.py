"""HMC against the exact posterior of Bayesian linear regression.

The exact-posterior check (:func:`check_exact_posterior`): the chain's mean must be within 3 Monte Carlo
standard errors (batch means, 25 batches) of the exact posterior mean and its marginal stds within 10 % of
the exact ones.  Trajectories are short (2 leapfrog steps of the adapted ε, about a quarter period in
every direction for this well-conditioned posterior), which decorrelates both θ and θ² from one iteration
to the next.  A standing mutation test replaces the Metropolis-Hastings step by always-accept and shows
the check fails then, at a step size where the real HMC passes it.  The Hamiltonian is checked against a
float64 recomputation at 2×10⁵ parameters.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch
from exact_blr import batch_means_mcse, make_blr_problem, potential

from ursa_ray.methods import get_method, hmc
from ursa_ray.methods.base import Gaussian, Problem, flat_parameters, resolve_config
from ursa_ray.methods.hmc import DualAveraging, acceptance_probability, hamiltonian, make_potential
from ursa_ray.models.mlp import build_linear

PRIOR_STD = 1.0


def draw(problem, **config) -> tuple[torch.Tensor, dict[str, float]]:
    method = get_method("hmc")
    resolved = resolve_config(method, {"prior_std": PRIOR_STD, **config})
    stats: dict[str, float] = {}
    rows = [flat_parameters(predictor).double() for predictor in method.sample_posterior(problem, resolved, stats)]
    return torch.stack(rows), stats


@cache
def chain(temperature: float = 1.0):
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)
    samples, stats = draw(
        problem, step_size=1e-3, n_leapfrog=2, burn_in=200, n_samples=1000, step_jitter=0.2, temperature=temperature
    )
    return samples, stats, mean, cov


def check_exact_posterior(samples: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> None:
    """The exact-posterior check: means within 3 MCSE of the exact mean, marginal stds within 10 %."""
    mcse = batch_means_mcse(samples)
    exact_std = cov.diag().sqrt()
    assert (mcse < 0.1 * exact_std).all(), "the chain mixes too slowly for the check to mean anything"
    z = (samples.mean(0) - mean) / mcse
    assert (z.abs() < 3).all(), f"(mean − exact) / MCSE = {z.tolist()}"
    ratio = samples.std(0) / exact_std
    assert ((ratio - 1).abs() < 0.1).all(), f"std / exact std = {ratio.tolist()}"


def test_mean_within_three_mcse_and_stds_within_ten_percent():
    samples, _, mean, cov = chain()
    check_exact_posterior(samples, mean, cov)


@pytest.mark.slow
def test_exact_posterior_check_catches_always_accept(monkeypatch):
    """Mutation test: with the Metropolis-Hastings step replaced by always-accept, the exact-posterior check
    fails; the real HMC passes it at the same fixed step size.

    ε = 0.04 is near the leapfrog's stability limit 2σ_min ≈ 0.05 of this posterior (acceptance ≈ 0.7).
    Without the correction the chain samples the leapfrog's shadow distribution: on four data seeds every
    marginal std came out inflated by 15 % to 170 %, far outside the check's 10 %, while the real chain
    stayed within 7 %.
    """
    settings = dict(step_size=0.04, adapt_step_size=False, n_leapfrog=2, burn_in=100, n_samples=4000, step_jitter=0.2)
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)
    samples, stats = draw(problem, **settings)
    assert stats["accept_rate"] < 0.9  # the correction has work to do at this step size
    check_exact_posterior(samples, mean, cov)

    monkeypatch.setattr(hmc, "acceptance_probability", lambda h_start, h_end: 1.0)
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)  # the same start, afresh
    samples, stats = draw(problem, **settings)
    assert stats["accept_rate"] == 1.0
    with pytest.raises(AssertionError, match="std / exact std"):
        check_exact_posterior(samples, mean, cov)
    assert (samples.std(0) / cov.diag().sqrt() > 1.1).all(), "always-accept inflates every marginal std"


def test_stats_and_step_size_adaptation():
    samples, stats, _, _ = chain()
    assert stats["n_samples"] == len(samples) == 1000
    # 1 initial gradient, the step-size search, then 2 per iteration
    assert stats["grad_evals"] >= 1 + 2 * 1200 and stats["grad_evals"] < 1 + 2 * 1200 + 100
    assert 0.7 < stats["accept_rate"] < 0.97
    assert stats["step_size"] > 10 * 1e-3  # adapted up from the deliberately small start
    assert stats["divergences"] == 0


def test_temperature_scales_the_variance():
    samples, _, mean, cov = chain(0.5)
    ratio = samples.std(0) / (cov.diag().sqrt() * math.sqrt(0.5))
    assert ((ratio - 1).abs() < 0.1).all(), f"std / (√T · exact std) = {ratio.tolist()}"


def test_potential_and_gradient_match_closed_form():
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=3)
    model = problem.make_model()
    theta = flat_parameters(model).clone()
    for temperature in (1.0, 0.5):
        grad_and_value = make_potential(problem, model, PRIOR_STD, temperature)
        grad, value = grad_and_value(theta)
        exact_grad = torch.linalg.solve(cov, theta.double() - mean) / temperature
        torch.testing.assert_close(grad.double(), exact_grad, rtol=1e-4, atol=1e-3)
        # U up to its constant: compare differences between two points
        other = theta + 0.01
        _, value2 = grad_and_value(other)
        exact_diff = (potential(problem, other, PRIOR_STD) - potential(problem, theta, PRIOR_STD)) / temperature
        assert (value2 - value).item() == pytest.approx(exact_diff.item(), rel=1e-3)


def test_tiny_steps_accept_nearly_always_and_samples_are_the_live_model():
    problem, _, _ = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=1)
    method = get_method("hmc")
    config = resolve_config(
        method,
        {
            "prior_std": PRIOR_STD,
            "step_size": 1e-4,
            "n_leapfrog": 3,
            "burn_in": 0,
            "n_samples": 20,
            "adapt_step_size": False,
        },
    )
    stats: dict[str, float] = {}
    seen = []
    for predictor in method.sample_posterior(problem, config, stats):
        theta = flat_parameters(predictor)
        torch.testing.assert_close(predictor(problem.x).squeeze(-1), problem.x @ theta[:-1] + theta[-1])
        seen.append(predictor)
    assert all(p is seen[0] for p in seen) and stats["n_samples"] == 20
    assert stats["accept_rate"] == 1.0 and stats["step_size"] == 1e-4
    assert stats["grad_evals"] == 1 + 3 * 20


def test_acceptance_probability_at_2e5_parameters_matches_float64():
    """H = U + ‖r‖²/2 accumulated in float64: at 2×10⁵ parameters ‖θ‖²/2 and ‖r‖²/2 are each about 10⁵,
    where float32's spacing is 0.008, and float32 sums moved this acceptance probability by 9×10⁻⁴.

    One leapfrog step of a linear model with 2×10⁵ parameters; only 4 of its inputs are non-zero, so the
    float32 network outputs are exact to ~10⁻⁷ and what is tested is the accumulation.  The reference is
    the same float32 states recomputed in float64 (U in closed form, :func:`exact_blr.potential`).
    """
    n_params, n_active, mass, eps = 200_000, 4, 1.0, 0.2
    generator = torch.Generator().manual_seed(0)
    x = torch.zeros(2, n_params - 1)
    x[:, :n_active] = torch.randn(2, n_active, generator=generator)
    theta0 = torch.randn(n_params, generator=generator)  # typical under the N(0, I) prior
    y = x @ theta0[:-1] + theta0[-1] + 0.1 * torch.randn(2, generator=generator)
    problem = Problem(
        x, y, Gaussian(noise_std=1.0), lambda: build_linear((n_params - 1,), 1), generator, torch.device("cpu")
    )
    grad_and_value = make_potential(problem, problem.make_model(), prior_std=1.0, temperature=1.0)
    momentum0 = torch.randn(n_params, generator=generator)

    grad0, u0 = grad_and_value(theta0)
    momentum1 = momentum0 - 0.5 * eps * grad0
    theta1 = theta0 + eps / mass * momentum1
    grad1, u1 = grad_and_value(theta1)
    momentum1 = momentum1 - 0.5 * eps * grad1
    assert u0.dtype == torch.float64 and grad0.dtype == torch.float32
    prob = acceptance_probability(hamiltonian(u0, momentum0, mass), hamiltonian(u1, momentum1, mass))

    def exact_hamiltonian(theta: torch.Tensor, momentum: torch.Tensor) -> float:
        kinetic = (momentum.double() ** 2).sum() / (2 * mass)
        return (potential(problem, theta, prior_std=1.0) + kinetic).item()

    exact = min(1.0, math.exp(exact_hamiltonian(theta0, momentum0) - exact_hamiltonian(theta1, momentum1)))
    assert 0.05 < exact < 0.95, "the acceptance must not saturate for the comparison to mean anything"
    assert prob == pytest.approx(exact, abs=1e-6)


def test_dual_averaging_moves_towards_target():
    adapter = DualAveraging(step_size=0.1, target=0.8)
    eps = [adapter.update(1.0) for _ in range(20)]  # always accepting: grow ε
    assert eps[-1] > eps[0]
    adapter = DualAveraging(step_size=0.1, target=0.8)
    eps = [adapter.update(0.0) for _ in range(20)]  # never accepting: shrink ε
    assert eps[-1] < 0.1 and adapter.final_step_size < 0.1


def test_non_finite_start_raises():
    problem, _, _ = make_blr_problem(n=64, prior_std=PRIOR_STD, seed=0)
    problem.y[0] = float("nan")
    with pytest.raises(FloatingPointError):
        draw(problem, n_samples=2, burn_in=0, n_leapfrog=2)
