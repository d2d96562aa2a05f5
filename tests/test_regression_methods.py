"""Concrete dropout and variational dropout on the MLP: they train, sample and give a non-zero spread;
their building blocks behave as the formulas say."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Gaussian, Problem, resolve_config
from ursa_ray.methods.concrete_dropout import ConcreteDropout, install_concrete_dropout
from ursa_ray.methods.variational_dropout import VariationalLinear
from ursa_ray.models import get_model


def small_problem(seed: int = 0) -> tuple[Problem, object]:
    ds = make_dataset("e1", 1.0, seed, n_train=64)
    torch.manual_seed(seed)
    build = get_model("mlp").build
    problem = Problem(
        x=ds.train_x,
        y=ds.train_y,
        likelihood=Gaussian(ds.noise_std),
        make_model=lambda: build(ds.input_shape, 1, widths=[16, 16]),
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )
    return problem, ds


@pytest.mark.parametrize("name", ["concrete_dropout", "variational_dropout"])
def test_method_trains_and_samples_with_spread(name: str) -> None:
    problem, ds = small_problem()
    method = get_method(name)
    config = resolve_config(method, {"epochs": 40, "batch_size": 32, "n_samples": 12, "lr": 1e-2})
    stats: dict[str, float] = {}
    outputs = []
    for predictor in method.sample_posterior(problem, config, stats):
        with torch.no_grad():
            outputs.append(predictor(ds.test_x).reshape(-1).numpy().copy())
    outputs = np.array(outputs)
    assert outputs.shape == (12, len(ds.test_x)) and np.isfinite(outputs).all()
    spread = outputs.std(axis=0)
    assert (spread > 0).all() and spread.mean() > 1e-3
    assert stats["n_samples"] == 12 and stats["grad_evals"] == 40 * 2
    # it learned something: better than predicting the training mean in-distribution
    inside = ds.test_info["in_distribution"].numpy()
    err = np.abs(outputs.mean(axis=0) - ds.test_y.numpy())[inside].mean()
    assert err < np.abs(ds.test_y.numpy()[inside] - ds.train_y.numpy().mean()).mean()
    if name == "concrete_dropout":
        assert 0 < stats["cd_p_mean"] < 1 and stats["cd_p_mean"] != pytest.approx(0.1, abs=1e-4)  # p moved
    else:
        assert math.isfinite(stats["vd_log_alpha_mean"]) and stats["vd_log_alpha_mean"] > -10


def test_concrete_dropout_replaces_every_slot_and_pairs_layers() -> None:
    model = get_model("mlp").build((1,), 1, widths=[8, 5])
    pairs = install_concrete_dropout(model, 0.2, 0.1)
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    dropouts = [d for d, _ in pairs if d is not None]
    assert len(pairs) == 3 and pairs[0][0] is None and len(dropouts) == 2
    assert [d.in_features for d in dropouts] == [8, 5]  # K = inputs of the layer after the slot
    assert all(abs(float(d.p.detach()) - 0.2) < 1e-6 for d in dropouts)


def test_concrete_relaxation_is_unbiased_and_sampling_is_bernoulli() -> None:
    torch.manual_seed(0)
    layer = ConcreteDropout(0.3, 0.1, in_features=4)
    x = torch.ones(20000, 4)
    layer.train()
    relaxed = layer(x)
    assert abs(relaxed.mean().item() - 1) < 0.02  # E[(1 − z̃)/(1 − p)] ≈ 1 at low temperature
    layer.eval()
    with torch.no_grad():
        hard = layer(x)
    assert abs((hard == 0).float().mean().item() - 0.3) < 0.01
    assert torch.allclose(hard[hard != 0], torch.tensor(1 / 0.7))
    # the relaxed mask carries a gradient to p
    layer.train()
    layer(x).pow(2).mean().backward()
    assert layer.p_logit.grad is not None and layer.p_logit.grad != 0


def test_variational_linear_noise_variance_and_kl() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(3, 2)
    layer = VariationalLinear(base, init_log_sigma2=-10.0)
    with torch.no_grad():
        layer.log_sigma2.copy_(torch.log(0.5 * layer.weight**2))  # α = 0.5 for every weight
    x = torch.tensor([[1.0, -2.0, 0.5]]).repeat(40000, 1)
    with torch.no_grad():
        out = layer(x)
    expected_mean = base(x[:1])[0]
    expected_var = (x[:1] ** 2 @ (0.5 * layer.weight**2).T)[0]
    torch.testing.assert_close(out.mean(0), expected_mean, atol=0.02, rtol=0.02)
    torch.testing.assert_close(out.var(0), expected_var, rtol=0.05, atol=1e-4)
    # the KL approximation is positive and falls as α grows (towards 0 for α → ∞)
    kls = []
    for log_alpha in (-4.0, 0.0, 4.0, 9.0):
        with torch.no_grad():
            layer.log_sigma2.copy_(log_alpha + torch.log(layer.weight**2))
        kls.append(layer.kl().item() / layer.weight.numel())
    assert all(k > 0 for k in kls[:3]) and kls == sorted(kls, reverse=True) and abs(kls[-1]) < 0.01
