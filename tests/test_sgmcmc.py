"""SGLD, SGHMC, cSGLD and cSGHMC against the exact posterior of Bayesian linear regression.

Step sizes are set as multiples of 1/λ_max (λ_max: the largest eigenvalue of the posterior precision),
so ``eta_lambda`` is the dimensionless step ηλ_max on the N-scaled potential (η = lr / N).  All chains
have fixed seeds.  Besides the spread checks (stds within 20 % of the exact marginal stds), one-step
tests pin the update itself: the injected noise must have variance 2αηT (URSABench's faults -- noise
never added, or scaled √(2αη)/N -- give 0 or 1/N of it) and the first SGHMC step must go downhill.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from functools import cache

import pytest
import torch
from exact_blr import batch_means_mcse, make_blr_problem, potential

from ursa_ray.methods import _sgmcmc_kernels, get_method, sgmcmc
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise, cyclical_lr, momentum_step_
from ursa_ray.methods.base import flat_parameters, resolve_config

PRIOR_STD = 1.0
N_TRAIN = 256


def lr_for(eta_lambda: float, cov: torch.Tensor, n: int = N_TRAIN) -> float:
    """The per-example lr whose step on U is η = eta_lambda / λ_max (η = lr / N)."""
    lambda_max = 1.0 / torch.linalg.eigvalsh(cov).min().item()
    return eta_lambda * n / lambda_max


def draw(name: str, problem, **config) -> tuple[torch.Tensor, dict[str, float]]:
    """All samples of one run as rows of flat parameters (float64), and the run's stats."""
    method = get_method(name)
    resolved = resolve_config(method, {"prior_std": PRIOR_STD, **config})
    stats: dict[str, float] = {}
    rows = [flat_parameters(predictor).double() for predictor in method.sample_posterior(problem, resolved, stats)]
    return torch.stack(rows), stats


def std_ratio(samples: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    return samples.std(0) / cov.diag().sqrt()


def assert_spread(samples: torch.Tensor, cov: torch.Tensor, temperature: float = 1.0, tol: float = 0.2) -> None:
    """Every marginal std within ``tol`` of the exact √T·std."""
    ratio = std_ratio(samples, cov) / math.sqrt(temperature)
    assert ((ratio - 1).abs() < tol).all(), f"std / exact std = {ratio.tolist()}"


# Long chains at T = 1, each shared by two tests.  The T = 0.5 chains are shorter copies: same seed, so the
# same initialisation, mini-batch order and noise draws, and the same sample steps (the thinning is
# equal), so their samples pair one-to-one with the first samples of the T = 1 chain.
CHAINS = {
    "sgld": dict(eta_lambda=0.08, batch_size=128, epochs=2100, burn_in_epochs=100, n_samples=1000),
    "sghmc": dict(
        eta_lambda=0.03, alpha=0.3, schedule="constant", batch_size=128, epochs=1700, burn_in_epochs=100, n_samples=800
    ),
}
COLD_FRACTION = 0.4


@cache
def chain(name: str, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem, mean, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    settings = dict(CHAINS[name])
    if temperature != 1.0:
        sampling = settings["epochs"] - settings["burn_in_epochs"]
        settings["epochs"] = settings["burn_in_epochs"] + int(sampling * COLD_FRACTION)
        settings["n_samples"] = int(settings["n_samples"] * COLD_FRACTION)
    lr = lr_for(settings.pop("eta_lambda"), cov)
    samples, stats = draw(name, problem, lr=lr, temperature=temperature, **settings)
    assert stats["n_samples"] == settings["n_samples"] == len(samples)
    return samples, mean, cov


def test_registered_with_bounded_hyperparameters():
    for name in ("sgld", "sghmc", "csgld", "csghmc"):
        method = get_method(name)
        declared = {h.name for h in method.hyperparameters}
        assert {"lr", "prior_std", "temperature", "batch_size"} <= declared
        assert ("alpha" in declared) == name.endswith("sghmc")
        cyclical = {"n_cycles", "epochs_per_cycle", "exploration", "samples_per_cycle"}
        assert (cyclical <= declared) == name.startswith("c")
        if not name.startswith("c"):
            assert {"epochs", "burn_in_epochs", "n_samples", "schedule"} <= declared
    with pytest.raises(ValueError):
        resolve_config(get_method("sghmc"), {"alpha": 1.5})
    with pytest.raises(ValueError):
        resolve_config(get_method("csgld"), {"exploration": 1.0})
    with pytest.raises(ValueError):
        resolve_config(get_method("sgld"), {"temperature": -1.0})


@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_marginal_stds_match_exact_posterior(name):
    samples, mean, cov = chain(name, 1.0)
    assert_spread(samples, cov, tol=0.2)
    # the chain's mean is unbiased for a Gaussian target (the drift is linear)
    mcse = batch_means_mcse(samples, n_batches=20)
    assert (mcse < 0.2 * cov.diag().sqrt()).all()
    z = (samples.mean(0) - mean) / mcse
    assert (z.abs() < 3.5).all(), f"(mean − exact) / MCSE = {z.tolist()}"


@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_temperature_half_halves_the_variance(name):
    cold, _, _ = chain(name, 0.5)
    hot, _, _ = chain(name, 1.0)
    ratio = cold.var(0) / hot[: len(cold)].var(0)
    assert ((ratio - 0.5).abs() < 0.05).all(), f"variance ratio T=0.5 / T=1: {ratio.tolist()}"


def test_without_numba_sgld_and_sghmc_still_sample_the_exact_posterior(without_numba):
    """Where numba is missing, GaussianNoise draws with torch's generator (``normal_``, a generator of its own
    seeded once from the problem's) and SGHMC updates with torch's operations; shorter chains than above,
    the same spread check.  Per seed the draws are reproducible, and differ from the Philox kernel's."""
    problem, mean, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    for name in ("sgld", "sghmc"):
        settings = dict(CHAINS[name], epochs=700, n_samples=300)
        lr = lr_for(settings.pop("eta_lambda"), cov)
        samples, stats = draw(name, problem, lr=lr, **settings)
        assert stats["n_samples"] == len(samples) == 300
        assert_spread(samples, cov, tol=0.2)
    noise = GaussianNoise(torch.zeros(10), torch.Generator().manual_seed(0))
    assert noise.bits == "torch"
    first = noise.add_to_(torch.zeros(10), sigma=1.0).clone()
    again = GaussianNoise(torch.zeros(10), torch.Generator().manual_seed(0)).add_to_(torch.zeros(10), sigma=1.0)
    assert torch.equal(first, again) and not torch.equal(first, noise.add_to_(torch.zeros(10), sigma=1.0))
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(first, torch.randn(10, generator=torch.Generator().manual_seed(seed)))


# cSG-MCMC: cycles of 50 steps (25 epochs of 2 mini-batches), 30 % exploration, 2 samples at each
# cycle's end.  Consecutive cycles are nearly independent (the exploration stage contracts to the mode).
CYCLICAL = {
    "csgld": dict(eta_lambda=0.5),
    "csghmc": dict(eta_lambda=0.25, alpha=0.5),
}


@pytest.mark.parametrize("name", ["csgld", "csghmc"])
@pytest.mark.slow
def test_cyclical_sampling_stage_spread(name):
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    settings = dict(CYCLICAL[name])
    lr = lr_for(settings.pop("eta_lambda"), cov)
    config = dict(batch_size=128, n_cycles=200, epochs_per_cycle=25, exploration=0.3, samples_per_cycle=2)
    samples, stats = draw(name, problem, lr=lr, **config, **settings)
    assert stats["n_samples"] == len(samples) == 400
    assert stats["grad_evals"] == 200 * 25 * 2
    assert_spread(samples, cov, tol=0.2)


# --- one-step tests: the update itself -------------------------------------------------------------


@cache
def first_steps(
    name: str, seeds: int, alpha: float = 0.3, temperature: float = 1.0, eta_lambda: float = 0.03, bits: str = "philox"
):
    """For each seed's problem, its initialisation θ₀ and the state θ₁ after one full-batch step (``bits``
    only keys the cache: the caller selects the generator)."""
    starts, ends = [], []
    for seed in range(seeds):
        problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=seed)
        made = []

        def make_model(inner=problem.make_model):
            model = inner()
            made.append(flat_parameters(model).double().clone())
            return model

        problem = dataclasses.replace(problem, make_model=make_model)
        extra = {"alpha": alpha, "schedule": "constant"} if name == "sghmc" else {}
        samples, stats = draw(
            name,
            problem,
            lr=lr_for(eta_lambda, cov),
            temperature=temperature,
            batch_size=N_TRAIN,
            epochs=1,
            burn_in_epochs=0,
            n_samples=1,
            **extra,
        )
        assert stats["grad_evals"] == 1 and len(made) == 1
        starts.append(made[0])
        ends.append(samples[0])
    return torch.stack(starts), torch.stack(ends)


def exact_gradients(seeds: int, theta: torch.Tensor, eta_lambda: float = 0.03) -> tuple[torch.Tensor, torch.Tensor]:
    """Per seed: ∇U(θ) = A(θ − μ) from the exact posterior (A = cov⁻¹), and the step η = lr / N."""
    grads, etas = [], []
    for seed in range(seeds):
        _, mean, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=seed)
        grads.append(torch.linalg.solve(cov, theta[seed] - mean))
        etas.append(lr_for(eta_lambda, cov) / N_TRAIN)
    return torch.stack(grads), torch.tensor(etas, dtype=torch.float64)


@pytest.fixture
def without_numba(monkeypatch):
    """As where numba is not installed: importing it fails, so the samplers draw with torch's generator and
    update with torch's operations on the CPU."""
    monkeypatch.setitem(sys.modules, "numba", None)
    for module in ("ursa_ray.methods._philox_gaussian", "ursa_ray.methods._momentum_cpu"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    _sgmcmc_kernels.numba_kernels.cache_clear()
    assert _sgmcmc_kernels.numba_kernels() is None
    yield
    _sgmcmc_kernels.numba_kernels.cache_clear()  # before monkeypatch restores numba: the next call re-imports


# the CPU generators: the numba Philox kernel, and torch's where numba is missing
CPU_GENERATORS = ["philox", "torch"]


@pytest.mark.parametrize("bits", CPU_GENERATORS)
@pytest.mark.parametrize("name,friction", [("sgld", 1.0), ("sghmc", 0.3)])
@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_one_step_injects_noise_of_variance_2_alpha_eta_T(request, bits, name, friction, temperature):
    """θ₁ − θ₀ + η∇U(θ₀) = √(2αηT)·ξ exactly (full batch, v₀ = 0).  Catches noise never added
    (variance 0) and URSABench's √(2αη)/N scaling (variance 2αηT/N, here 1/256 of the target).  Each CPU
    generator: the Philox kernel and, as where numba is missing, torch's."""
    if bits == "torch":
        request.getfixturevalue("without_numba")
    seeds = 60
    theta0, theta1 = first_steps(name, seeds, alpha=friction, temperature=temperature, bits=bits)
    grads, etas = exact_gradients(seeds, theta0)
    residual = (theta1 - theta0 + etas[:, None] * grads) / torch.sqrt(2 * friction * etas * temperature)[:, None]
    values = residual.flatten()  # should be N(0, 1): 300 draws
    assert abs(values.mean().item()) < 3 / math.sqrt(values.numel())
    assert 0.75 < values.var().item() < 1.25, f"noise variance / 2αηT = {values.var().item()}"


def test_first_sghmc_step_goes_downhill():
    """The first SGHMC step is −η∇U plus zero-mean noise: U decreases, along −∇U, by about η‖∇U‖²."""
    seeds = 60
    theta0, theta1 = first_steps("sghmc", seeds, alpha=0.3, temperature=1.0, bits="philox")
    grads, etas = exact_gradients(seeds, theta0)
    for seed in range(seeds):
        problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=seed)
        assert potential(problem, theta1[seed], PRIOR_STD) < potential(problem, theta0[seed], PRIOR_STD)
    along = ((theta1 - theta0) * grads).sum(1) / (etas * (grads**2).sum(1))  # −1 for an exact gradient step
    assert abs(along.mean().item() + 1.0) < 0.1, along.tolist()


@pytest.mark.parametrize("bits", CPU_GENERATORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_momentum_step_is_the_three_torch_operations_in_one_pass(request, bits, dtype):
    """SGHMC's v ← keep·v − lr·g − decay·θ, θ ← θ + v (numba on the CPU; torch's operations without it)
    against torch's own arithmetic."""
    if bits == "torch":
        request.getfixturevalue("without_numba")
    generator = torch.Generator().manual_seed(0)
    theta, velocity, grad = (torch.randn(1003, generator=generator, dtype=dtype) for _ in range(3))
    expected_velocity = 0.9 * velocity - 0.01 * grad - 1e-4 * theta
    expected_theta = theta + expected_velocity
    momentum_step_(theta, velocity, grad, keep=0.9, lr=0.01, decay=1e-4)
    torch.testing.assert_close(velocity, expected_velocity)
    torch.testing.assert_close(theta, expected_theta)
    with pytest.raises(ValueError, match="one length"):
        momentum_step_(theta, velocity[:-1], grad, keep=1.0, lr=1.0, decay=1.0)
    with pytest.raises(ValueError, match="share a float32/float64 dtype"):
        momentum_step_(theta, velocity.to(torch.float16), grad, keep=1.0, lr=1.0, decay=1.0)


@pytest.mark.parametrize(
    "fault",
    [
        lambda step, temperature, friction=1.0: 0.0,  # the 2020 code: noise computed but never added
        lambda step, temperature, friction=1.0: math.sqrt(2 * friction * step * N_TRAIN) / N_TRAIN,  # √(2α·lr)/N
    ],
    ids=["noise_never_added", "noise_scaled_by_1_over_N"],
)
def test_spread_check_catches_ursabench_noise_faults(monkeypatch, fault):
    """With the noise of URSABench's faulty SGHMC substituted, the spread check of the tests above fails."""
    monkeypatch.setattr(sgmcmc, "langevin_noise_std", fault)
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    settings = dict(CHAINS["sghmc"], epochs=400, n_samples=300)
    lr = lr_for(settings.pop("eta_lambda"), cov)
    samples, _ = draw("sghmc", problem, lr=lr, **settings)
    with pytest.raises(AssertionError):
        assert_spread(samples, cov, tol=0.2)
    assert (std_ratio(samples, cov) < 0.3).all()


# --- plans, schedules, bookkeeping ------------------------------------------------------------------


def test_cyclical_step_size_and_stages():
    method = get_method("csghmc")
    config = resolve_config(
        method,
        {
            "lr": 0.4,
            "batch_size": 100,
            "n_cycles": 3,
            "epochs_per_cycle": 4,
            "exploration": 0.5,
            "samples_per_cycle": 2,
        },
    )
    total, lr_at, noisy_at, samples = method.plan(250, config)  # 3 steps per epoch, cycles of 12 steps
    assert total == 36
    cycle = math.ceil(total / 3)
    for k in range(1, total + 1):  # the paper's 1-based k
        expected = 0.4 / 2 * (math.cos(math.pi * ((k - 1) % cycle) / cycle) + 1)
        assert lr_at(k - 1) == pytest.approx(expected)
        assert noisy_at(k - 1) == ((k - 1) % cycle >= 6)
    assert lr_at(0) == lr_at(12) == pytest.approx(0.4) and lr_at(6) == pytest.approx(0.2)
    assert samples == [9, 12, 21, 24, 33, 36]  # one per epoch (3 steps) at each cycle's end
    assert all(noisy_at(s - 1) for s in samples)
    assert cyclical_lr(0.4, 11, 12) == pytest.approx(0.2 * (math.cos(math.pi * 11 / 12) + 1))


def test_cosine_schedule_anneals_to_half():
    method = get_method("sghmc")
    config = resolve_config(method, {"lr": 0.1, "epochs": 10, "burn_in_epochs": 5, "n_samples": 5, "batch_size": 100})
    total, lr_at, noisy_at, samples = method.plan(1000, config)
    assert total == 100 and samples == [60, 70, 80, 90, 100]
    assert lr_at(0) == pytest.approx(0.1) and lr_at(50) == pytest.approx(0.075)
    assert lr_at(99) == pytest.approx(0.05, rel=1e-3) and all(noisy_at(k) for k in range(total))


def test_exploration_stage_adds_no_noise(monkeypatch):
    draws = []
    original = GaussianNoise.add_to_

    def counting(self, *args, **kwargs):
        draws.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GaussianNoise, "add_to_", counting)
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    samples, stats = draw(
        "csgld",
        problem,
        lr=lr_for(0.5, cov),
        batch_size=128,
        n_cycles=3,
        epochs_per_cycle=10,
        exploration=0.7,
        samples_per_cycle=3,
    )
    assert len(samples) == stats["n_samples"] == 9
    assert len(draws) == 3 * (20 - 14)  # cycles of 20 steps, the first 14 noise-free


def test_sample_count_stats_and_live_model():
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    method = get_method("sgld")
    config = resolve_config(
        method,
        {
            "lr": lr_for(0.05, cov),
            "prior_std": PRIOR_STD,
            "batch_size": 100,
            "epochs": 5,
            "burn_in_epochs": 2,
            "n_samples": 4,
        },
    )
    stats: dict[str, float] = {}
    seen, steps = [], []
    for predictor in method.sample_posterior(problem, config, stats):
        assert not predictor.training
        theta = flat_parameters(predictor)
        expected = problem.x @ theta[:-1] + theta[-1]
        torch.testing.assert_close(predictor(problem.x).squeeze(-1), expected)
        seen.append(predictor)
        steps.append(stats["grad_evals"])
    assert stats["n_samples"] == 4 and stats["grad_evals"] == 15  # 5 epochs × 3 mini-batches
    assert steps == [9.0, 11.0, 13.0, 15.0]
    assert all(p is seen[0] for p in seen)


def test_invalid_plans_raise():
    problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    cases = [
        ("sgld", {"epochs": 3, "burn_in_epochs": 3, "n_samples": 1}),
        ("sgld", {"epochs": 3, "burn_in_epochs": 2, "n_samples": 5, "batch_size": 128}),
        ("csgld", {"epochs_per_cycle": 2, "exploration": 0.9, "samples_per_cycle": 2, "batch_size": 128}),
    ]
    for name, overrides in cases:
        with pytest.raises(ValueError):
            draw(name, problem, **overrides)


@pytest.mark.parametrize("name", ["sgld", "sghmc", "csgld", "csghmc"])
def test_divergence_raises_floating_point_error(name):
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    overrides = {"lr": lr_for(10.0, cov), "batch_size": N_TRAIN}
    if name.startswith("c"):
        overrides |= {"n_cycles": 1, "epochs_per_cycle": 200}
    else:
        overrides |= {"epochs": 200, "burn_in_epochs": 100, "n_samples": 1}
    with pytest.raises(FloatingPointError):
        draw(name, problem, **overrides)


@pytest.mark.parametrize("name", ["sgld", "sghmc", "csgld", "csghmc"])
def test_a_lone_chain_draws_what_one_batched_copy_draws(name):
    """The lone chain (:class:`~ursa_ray.methods.sgmcmc.LangevinChain`, the network's own forward) and a
    C = 1 batched state (:class:`~ursa_ray.methods.sgmcmc.LangevinCopies`) share one update and one loop and
    key their noise and mini-batch order from the problem's generator alike, so on the same problem they
    draw the same samples (on this CPU bit-identical; the tolerance, ~100 float32 ulps, is far below one
    noise draw σ = √(2·lr/N) ≈ 0.01).  Fails when the two paths diverge: another noise key or mini-batch
    stream, noise scale, step-size schedule or sample steps in either."""
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    method = get_method(name)
    if name.startswith("c"):
        plan = {"n_cycles": 2, "epochs_per_cycle": 3, "samples_per_cycle": 2, "exploration": 0.5}
    else:
        plan = {"epochs": 6, "burn_in_epochs": 2, "n_samples": 8}
    config = resolve_config(
        method, {"prior_std": PRIOR_STD, "lr": lr_for(0.05, cov), "batch_size": 64, "temperature": 1.0, **plan}
    )
    lone_stats: dict[str, float] = {}
    lone = [flat_parameters(m).clone() for m in method.sample_posterior(problem, config, lone_stats)]
    problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    batched_stats: dict[str, float] = {}
    batched = [
        flat_parameters(m).clone() for (m,) in method.sample_posterior_batched([problem], config, [batched_stats])
    ]
    assert lone_stats == batched_stats
    assert len(lone) == len(batched) == lone_stats["n_samples"]
    torch.testing.assert_close(torch.stack(lone), torch.stack(batched), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(lone[0], lone[-1])


def test_the_declared_sample_plan_is_the_stream_each_sampler_yields(monkeypatch):
    """Each sampler's ``sample_plan`` (S per chain, C chains) counts what its stream yields, and
    ``chains_in_turn_when_unbatchable`` says how an unbatchable network's stream orders the chains: chain
    1's S samples, then chain 2's (against the stream of the same chains batched, which interleaves them
    at each sampling step).  Fails with the base class's default plan for the cyclical samplers (S = 1, not cycles ×
    samples per cycle) or a flag that claims interleaved chains."""
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    common = {"prior_std": PRIOR_STD, "lr": lr_for(0.05, cov), "batch_size": 64}
    for name, plan in [
        ("sgld", {"epochs": 4, "burn_in_epochs": 2, "n_samples": 3, "n_chains": 2}),
        ("sghmc", {"epochs": 4, "burn_in_epochs": 2, "n_samples": 3, "n_chains": 2}),
        ("csgld", {"n_cycles": 2, "epochs_per_cycle": 2, "samples_per_cycle": 2, "exploration": 0.5}),
        ("csghmc", {"n_cycles": 3, "epochs_per_cycle": 2, "samples_per_cycle": 1, "exploration": 0.5}),
    ]:
        method = get_method(name)
        config = resolve_config(method, {**common, **plan})
        declared = method.sample_plan(config, problem)
        assert (declared.per_chain, declared.n_chains) == (
            plan.get("n_samples", plan.get("n_cycles", 0) * plan.get("samples_per_cycle", 0)),
            plan.get("n_chains", 1),
        )
        problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
        batched = [flat_parameters(m).clone() for m in method.sample_posterior(problem, config, {})]
        assert len(batched) == declared.total
        with monkeypatch.context() as patch:
            patch.setattr(sgmcmc, "can_batch", lambda model, problem: False)
            problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
            lone = [flat_parameters(m).clone() for m in method.sample_posterior(problem, config, {})]
        assert len(lone) == declared.total
        chains, per_chain = declared.n_chains, declared.per_chain
        in_turn = method.chains_in_turn_when_unbatchable
        for chain in range(chains):
            for s in range(per_chain):
                position = chain * per_chain + s if in_turn else s * chains + chain
                torch.testing.assert_close(lone[position], batched[s * chains + chain], rtol=1e-5, atol=1e-6)
