"""Vectorised repetitions (ursa_ray/methods/batched.py): seeds, ensemble members and chains trained as one
batched computation compute, per copy, what they would alone; their random streams are independent; and
chains run side by side report R̂ and ESS that tell mixed chains from unmixed ones."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from exact_blr import make_blr_problem
from test_sgmcmc import PRIOR_STD, assert_spread, lr_for
from ursa_ray.grid import parse_grid
from ursa_ray.methods import get_method
from ursa_ray.methods.base import flat_parameters, resolve_config
from ursa_ray.methods.batched import CopyData, StackedNetworks, copy_generators, max_copies
from ursa_ray.methods.sgmcmc import LangevinCopies
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import run_trial, run_trials_batched


def _specs(method: str, hyperparameters: dict, seeds=(0, 1, 2, 3), dataset: str = "digits") -> list[dict]:
    grid = {
        "name": "batched",
        "methods": [{"name": method, "hyperparameters": hyperparameters}],
        "models": [{"name": "mlp", "options": {"widths": [32]}}],
        "datasets": [dataset],
        "seeds": list(seeds),
        "budget": {"epochs": 3, "batch_size": 128},
        "corruptions": {"types": ["gaussian_noise"], "severities": [1], "n_examples": 64},
        "adversarial": {"n_examples": 16, "attacks": ["fgsm"], "transfer": False},
        "bit_depths": ["float16"],
    }
    return parse_grid(grid, "batched.yaml").trial_specs()


def _metrics(outcome) -> dict:
    return {(m["eval_set"], m["metric"]): m["value"] for m in outcome.metrics if m["eval_set"] != "cost"}


@pytest.mark.parametrize(
    ("method", "hyperparameters"),
    [
        ("sgd", {}),
        ("deep_ensemble", {"n_samples": 3, "bootstrap": True, "adversarial_epsilon": 0.02}),
        ("sgld", {"burn_in_epochs": 1, "n_samples": 4}),
        ("sghmc", {"burn_in_epochs": 1, "n_samples": 4, "n_chains": 2}),
        ("swag", {"swa_epochs": 3, "rank": 2, "n_samples": 3}),
        ("swa", {"swa_epochs": 2, "swa_collect_every": 5}),
        ("pca_ess", {"swa_epochs": 3, "rank": 2, "n_samples": 3, "ess_burn_in": 1}),
        ("laplace", {"n_samples": 3}),
        ("bdk", {"burn_in_epochs": 1, "distill_every": 2}),
        ("gped", {"burn_in_epochs": 1}),
    ],
)
def test_four_batched_seeds_give_each_seed_its_metrics_alone(method, hyperparameters):
    """Every metric of every seed -- accuracy, NLL, ECE, OOD, corruptions, attacks, stored at float16 --
    equals the seed's unbatched trial up to float order, and the seeds differ from each other."""
    specs = _specs(method, hyperparameters)
    batched = run_trials_batched(specs)
    assert [o.record["seeds_in_trial"] for o in batched] == [4] * 4
    for spec, together in zip(specs, batched, strict=True):
        alone = run_trial(spec)
        assert alone.record["seeds_in_trial"] == 1
        a, b = _metrics(alone), _metrics(together)
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (spec["seed"], key)
        assert json.loads(together.record["method_stats"]) == json.loads(alone.record["method_stats"])
    nll = [_metrics(o)[("test", "nll")] for o in batched]
    assert len(set(nll)) == 4


def test_batched_mc_dropout_trains_each_seed_with_its_own_masks():
    """MC dropout's masks come from torch's generator, so batched seeds match their unbatched runs in
    distribution, not value: each seed trains, and the seeds' predictives differ."""
    specs = _specs("mc_dropout", {"p": 0.2, "n_samples": 4}, seeds=(0, 1))
    batched = run_trials_batched(specs)
    alone = [run_trial(spec) for spec in specs]
    for b, a in zip(batched, alone, strict=True):
        assert _metrics(b)[("test", "accuracy")] == pytest.approx(_metrics(a)[("test", "accuracy")], abs=0.1)
        assert _metrics(b)[("test", "accuracy")] > 0.5
    assert _metrics(batched[0])[("test", "nll")] != _metrics(batched[1])[("test", "nll")]


def test_one_stacked_copy_trains_exactly_as_the_plain_network():
    """The batched SGD path (vmap over a (C, P) parameter tensor) against the plain nn.Module loop."""
    from ursa_ray.methods._training import train_sgd
    from ursa_ray.methods.batched import train_sgd_copies
    from small_problems import regression_problem

    config = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3, "epochs": 5, "batch_size": 16, "schedule": "cosine"}
    plain_problem = regression_problem(seed=3)
    plain = train_sgd(plain_problem.make_model(), plain_problem, config, {})
    copy_problem = regression_problem(seed=3)  # the same initialisation and mini-batch order
    stacked = StackedNetworks([copy_problem.make_model()])
    data = CopyData.from_problems([copy_problem], [copy_problem.generator], [None])
    train_sgd_copies(stacked, data, copy_problem.likelihood, config)
    torch.testing.assert_close(flat_parameters(stacked.models[0]), flat_parameters(plain), rtol=1e-5, atol=1e-6)


def test_copies_have_independent_minibatch_and_noise_streams():
    problem, _, _ = make_blr_problem(seed=0)
    generators = copy_generators(problem, 4)
    data = CopyData.from_problems([problem] * 4, generators, [None] * 4)
    orders = torch.stack([torch.randperm(problem.n_train, generator=copy.deepcopy(g)) for g in generators]).double()
    corr = torch.corrcoef(orders)
    off_diagonal = corr[~torch.eye(4, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 4 / problem.n_train**0.5
    xb, _ = next(data.minibatches(32))
    assert len({tuple(xb[c, :, 0].tolist()) for c in range(4)}) == 4  # four different mini-batches

    # the Langevin noise of two chains from one identical state, with the same full batch: the increments
    # differ from the noise-free step by independent draws
    torch.manual_seed(0)
    model = build_mlp((64,), 10, [32])
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    from ursa_ray.methods.base import Categorical, Problem

    digits_like = Problem(x, y, Categorical(), lambda: copy.deepcopy(model), torch.Generator().manual_seed(1), torch.device("cpu"))
    config = resolve_config(get_method("sgld"), {"prior_std": 1.0})
    chains = LangevinCopies(
        [copy.deepcopy(model) for _ in range(3)], copy_generators(digits_like, 3), digits_like, config, momentum=False
    )
    start = chains.stacked.theta.detach().clone()
    xs, ys = x.expand(3, *x.shape), y.expand(3, *y.shape)
    noise_free = LangevinCopies([copy.deepcopy(model)], [torch.Generator()], digits_like, config, momentum=False)
    noise_free.step(xs[:1], ys[:1], lr=0.5, noisy=False)
    chains.step(xs, ys, lr=0.5, noisy=True)
    drawn = chains.stacked.theta.detach() - start - (noise_free.stacked.theta.detach() - start[:1])
    assert drawn.std(1).min() > 0  # noise was added to every chain
    corr = torch.corrcoef(drawn)
    off_diagonal = corr[~torch.eye(3, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 4 / drawn.shape[1] ** 0.5


@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_each_chain_of_a_batched_run_samples_its_exact_posterior(name):
    """Four seeds of the Bayesian-linear-regression fixture (each its own data and exact posterior), one
    chain each, sampled as one batched run: every chain's marginal stds match its own posterior's."""
    fixtures = [make_blr_problem(prior_std=PRIOR_STD, seed=seed) for seed in range(4)]
    problems = [f[0] for f in fixtures]
    settings = {
        "sgld": dict(eta_lambda=0.08, batch_size=128, epochs=1100, burn_in_epochs=100, n_samples=500),
        "sghmc": dict(eta_lambda=0.03, alpha=0.3, schedule="constant", batch_size=128, epochs=900, burn_in_epochs=100, n_samples=400),
    }[name]
    eta_lambda = settings.pop("eta_lambda")
    lr = min(lr_for(eta_lambda, cov) for _, _, cov in fixtures)
    method = get_method(name)
    config = resolve_config(method, {"prior_std": PRIOR_STD, "lr": lr, **settings})
    stats = [{} for _ in problems]
    draws = [[] for _ in problems]
    for item in method.sample_posterior_batched(problems, config, stats):
        for rows, predictor in zip(draws, item, strict=True):
            rows.append(flat_parameters(predictor).double())
    for rows, (_, _, cov) in zip(draws, fixtures, strict=True):
        assert len(rows) == settings["n_samples"]
        assert_spread(torch.stack(rows), cov, tol=0.25)


def _chain_stats(name: str, **settings) -> dict[str, float]:
    problem, _, cov = make_blr_problem(prior_std=PRIOR_STD, seed=0, init_std=settings.pop("init_std", 1.0))
    lr = lr_for(settings.pop("eta_lambda"), cov)
    method = get_method(name)
    config = resolve_config(method, {"prior_std": PRIOR_STD, "lr": lr, **settings})
    stats: dict[str, float] = {}
    samples = list(method.sample_posterior(problem, config, stats))
    assert len(samples) == stats["n_samples"] == settings["n_chains"] * settings["n_samples"]
    return stats


def test_rhat_is_near_one_for_chains_on_the_exact_posterior_and_large_for_unmixed_chains():
    mixed = _chain_stats("sgld", eta_lambda=0.2, batch_size=128, epochs=850, burn_in_epochs=50, n_samples=200, n_chains=4)
    assert mixed["n_chains"] == 4
    assert mixed["rhat_max"] < 1.06 and mixed["ess_bulk_min"] > 100
    # started far apart (weights drawn with std 30 around the posterior's ~0.03) and stopped early
    unmixed = _chain_stats(
        "sgld", eta_lambda=0.002, batch_size=128, epochs=6, burn_in_epochs=1, n_samples=10, n_chains=4, init_std=30.0
    )
    assert unmixed["rhat_max"] > 1.1


def test_default_copy_count_keeps_memory_in_bounds():
    small = build_mlp((784,), 10, [200, 200])
    assert max_copies(small, batch_size=128, input_numel=784) >= 50
    wide = build_mlp((784,), 10, [4096, 4096])
    assert max_copies(wide, batch_size=128, input_numel=784) < max_copies(small, 128, 784)


def test_what_a_seed_keeps_beside_its_network_limits_the_seeds_batched_together():
    """SWAG's moments and a Laplace posterior count in the memory cap: a full Laplace covariance over all
    weights of the E.1 MLP (P² numbers) batches one seed at a time, last-layer KFAC batches many."""
    e1 = build_mlp((1,), 1, [100, 100, 100])
    cap = max_copies(e1, batch_size=32, input_numel=1)
    laplace = get_method("laplace")
    full = resolve_config(laplace, {"subset_of_weights": "all", "hessian_structure": "full", "optimize_prior_precision": "none"})
    assert cap // laplace.batched_copies(full, e1) == 0  # the trial batches max(1, 0) = 1 seed at a time
    assert cap // laplace.batched_copies(resolve_config(laplace, {}), e1) >= 50
    swag = get_method("swag")
    assert swag.batched_copies(resolve_config(swag, {"rank": 20}), e1) == 1 + 6  # ⌈(4 + 20) / 4⌉
    assert swag.batched_copies(resolve_config(swag, {"rank": 20}), e1) > swag.batched_copies(resolve_config(swag, {"rank": 2}), e1)
