"""Concrete and variational dropout's batched streams: each copy's regulariser from the stacked parameters
is that copy's own (unbatched) regulariser, masks/noise are drawn independently per copy, and a two-seed
batched run trains each copy to its own learned rates."""

from __future__ import annotations

import pytest
import torch
from small_problems import regression_problem

from ursa_ray.methods import get_method
from ursa_ray.methods.base import resolve_config
from ursa_ray.methods.batched import StackedNetworks
from ursa_ray.methods.concrete_dropout import (
    ConcreteDropout,
    concrete_regulariser,
    install_concrete_dropout,
    stacked_concrete_regulariser,
    uncovered_parameters,
)
from ursa_ray.methods.variational_dropout import VariationalLinear, install_variational_linear, stacked_kl
from ursa_ray.models.mlp import build_mlp


def perturbed(models):
    """Give every copy different weights and rates, so that a mixed-up copy index would show."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model in models:
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return models


def test_stacked_concrete_regulariser_is_each_copys_own():
    torch.manual_seed(0)
    models = [build_mlp((3,), 1, [16, 8]) for _ in range(3)]
    pairs = [install_concrete_dropout(m, 0.1 + 0.1 * c, 0.1) for c, m in enumerate(models)]
    perturbed(models)
    expected = torch.stack(
        [concrete_regulariser(p, uncovered_parameters(p, m), 0.7, 50) for m, p in zip(models, pairs)]
    ).detach()
    regulariser = stacked_concrete_regulariser(models[0], pairs[0], uncovered_parameters(pairs[0], models[0]), 0.7, 50)
    stacked = StackedNetworks(models)
    got = regulariser(stacked.parameters())
    assert got.shape == (3,)
    torch.testing.assert_close(got.detach(), expected, rtol=1e-6, atol=1e-7)
    # its gradient w.r.t. copy c's row is copy c's own gradient
    got.sum().backward()
    own = concrete_regulariser(pairs[1], uncovered_parameters(pairs[1], models[1]), 0.7, 50)
    grads = torch.autograd.grad(own, list(models[1].parameters()))
    torch.testing.assert_close(stacked.theta.grad[1], torch.cat([g.reshape(-1) for g in grads]))


def test_stacked_kl_is_each_copys_own():
    torch.manual_seed(0)
    models = [build_mlp((3,), 1, [16, 8]) for _ in range(3)]
    layers = [install_variational_linear(m, -4.0 - c) for c, m in enumerate(models)]
    perturbed(models)
    expected = torch.stack([sum(layer.kl() for layer in ls) for ls in layers]).detach()
    kl = stacked_kl(models[0])
    stacked = StackedNetworks(models)
    torch.testing.assert_close(kl(stacked.parameters()).detach(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("module", ["concrete", "variational"])
def test_masks_and_noise_are_drawn_per_copy(module):
    """Identical copies on identical inputs: the batched training-mode outputs differ between copies."""
    torch.manual_seed(0)
    template = build_mlp((3,), 1, [16])
    models = [build_mlp((3,), 1, [16]) for _ in range(2)]
    for m in models:
        m.load_state_dict(template.state_dict())
        if module == "concrete":
            install_concrete_dropout(m, 0.5, 0.1)
        else:
            install_variational_linear(m, -1.0)
    stacked = StackedNetworks(models)
    stacked.train()
    x = torch.randn(1, 32, 3).expand(2, 32, 3)
    out = stacked(x)
    assert not torch.allclose(out[0], out[1])
    stacked.train(False)
    if module == "variational":  # evaluation keeps sampling noise; concrete: Bernoulli masks, also random
        assert not torch.allclose(stacked(x)[0], stacked(x)[1])


@pytest.mark.parametrize("name", ["concrete_dropout", "variational_dropout"])
def test_two_seed_batched_run_trains_each_copy(name):
    method = get_method(name)
    config = resolve_config(method, {"epochs": 30, "batch_size": 32, "n_samples": 4, "lr": 1e-2})
    problems = [regression_problem(seed=s, n=128) for s in (1, 2)]
    # the loss of the untrained copies, for comparison
    probe_stats = [{} for _ in problems]
    short = resolve_config(method, {**config, "epochs": 1, "lr": 0.0})
    for _ in method.sample_posterior_batched([regression_problem(seed=s, n=128) for s in (1, 2)], short, probe_stats):
        pass
    stats = [{} for _ in problems]
    items = list(method.sample_posterior_batched(problems, config, stats))
    assert len(items) == 4 and all(len(item) == 2 for item in items)
    a, b = items[0]
    assert a is not b and all(item[0] is a and item[1] is b for item in items)
    for before, after in zip(probe_stats, stats):
        assert after["final_loss"] < before["final_loss"] - 0.1
        assert after["n_samples"] == 4 and after["grad_evals"] == 30 * 4
    if name == "concrete_dropout":
        rates = [[float(m.p.detach()) for m in model.modules() if isinstance(m, ConcreteDropout)] for model in (a, b)]
        assert rates[0] != rates[1]
        assert all(abs(r - 0.1) > 1e-4 for r in rates[0] + rates[1])  # learned away from init_p
        assert stats[0]["cd_p_mean"] != stats[1]["cd_p_mean"]
    else:
        sigma = [
            torch.cat([m.log_sigma2.reshape(-1) for m in model.modules() if isinstance(m, VariationalLinear)])
            for model in (a, b)
        ]
        assert not torch.equal(sigma[0], sigma[1])
        assert stats[0]["vd_log_alpha_mean"] != stats[1]["vd_log_alpha_mean"]
    # each copy's own module is its predictor, a stochastic one
    x = problems[0].x[:16]
    with torch.no_grad():
        assert not torch.equal(a(x), a(x))
        assert torch.isfinite(b(x)).all()
