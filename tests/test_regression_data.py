"""Synthetic regression datasets E.1–E.3: shapes, named points, in-distribution flags, seeding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa_ray.data import get_dataset
from ursa_ray.data.synthetic_regression import (
    E1_NAMED,
    E2_NAMED,
    NOISE_STD,
    design,
    make_dataset,
    n_features,
    named_points,
)
from ursa_ray.models import get_model


def load(name: str, complexity: float, seed: int, **options):
    return get_dataset(name).load({"complexity": complexity, **options}, (), None, False, seed)


@pytest.mark.parametrize(
    "name,complexity,d,p,n_train,n_test",
    [
        ("e1", 1.0, 1, 6, 200, 123),
        ("e1", 6.0, 1, 6, 200, 123),
        ("e2", 1, 1, 4, 200, 101),
        ("e2", 5, 5, 20, 1000, 101),
        ("e3", 2.0, 2, 9, 400, 841),
    ],
)
def test_shapes_and_interface(name, complexity, d, p, n_train, n_test) -> None:
    spec = get_dataset(name)
    assert spec.task == "regression" and spec.sweep == "complexity"
    assert {o.name for o in spec.options} >= {"complexity", "n_train"}
    ds = load(name, complexity, 0)
    assert ds.task == "regression" and ds.n_outputs == 1 and ds.input_shape == (d,)
    assert ds.train_x.shape == (n_train, d) and ds.train_y.shape == (n_train,)
    assert ds.test_x.shape == (n_test, d) and ds.test_y.shape == (n_test,)
    assert ds.train_x.dtype == ds.train_y.dtype == ds.test_x.dtype == ds.test_y.dtype == torch.float32
    assert ds.noise_std == NOISE_STD[name]
    inside = ds.test_info["in_distribution"]
    assert inside.dtype == torch.bool and inside.shape == (n_test,)
    assert 0 < int(inside.sum()) < n_test  # both kinds of test point
    features = ds.feature_map(ds.test_x.double())
    assert features.shape == (n_test, p) and features.dtype == torch.float64
    assert n_features(name, complexity) == p
    # test_y is the noise-free truth G(x*)ᵀγ
    _, gamma = design(name, float(complexity))
    np.testing.assert_allclose(ds.test_y.numpy(), (features @ torch.from_numpy(gamma)).numpy(), rtol=1e-5, atol=1e-5)


def test_e1_named_points_and_flags() -> None:
    ds = load("e1", 3.0, 0)
    x = ds.test_x[:, 0].double().numpy()
    inside = ds.test_info["in_distribution"].numpy()
    for label, value in E1_NAMED.items():
        hits = np.flatnonzero(np.isclose(x, value, atol=1e-6))
        assert hits.size == 1, label
        assert inside[hits[0]] == (value != -5.11)
    np.testing.assert_array_equal(inside, (x >= -4) & (x <= 4))
    assert ds.train_x.min() >= -4 and ds.train_x.max() <= 4
    assert x.min() <= -6 and x.max() >= 6


def test_e2_diagonal_named_points() -> None:
    d = 4
    ds = load("e2", d, 0)
    x = ds.test_x.double().numpy()
    assert np.all(x == x[:, :1])  # on the diagonal
    lam = (x[:, 0] + 5) / 10
    np.testing.assert_allclose(lam, np.arange(101) / 100, atol=1e-6)
    inside = ds.test_info["in_distribution"].numpy()
    assert inside[np.argmin(abs(lam - 0.6))] and not inside[np.argmin(abs(lam - 0.07))]
    np.testing.assert_array_equal(inside, (lam >= 0.1 - 1e-9) & (lam <= 0.9 + 1e-9))
    for label, value in named_points("e2", d).items():
        assert value.shape == (d,)
        lam_named = E2_NAMED[label]
        assert np.any(np.all(np.isclose(x, -5 + 10 * lam_named, atol=1e-6), axis=1)), label
    with pytest.raises(ValueError):
        load("e2", 2.5, 0)


def test_e3_grid_and_training_region() -> None:
    ds = load("e3", 1.0, 0)
    x = ds.test_x.double().numpy()
    axis = np.unique(np.round(x[:, 0], 8))
    assert axis.size == 29 and np.allclose(np.diff(axis), 0.25)
    assert x.shape[0] == axis.size**2  # a full regular grid
    inside = ds.test_info["in_distribution"].numpy()
    np.testing.assert_array_equal(inside, np.all((x >= 1) & (x <= 4), axis=1))
    assert ds.train_x.min() >= 1 and ds.train_x.max() <= 4


@pytest.mark.parametrize("name,complexity", [("e1", 2.0), ("e2", 3), ("e3", 2.0)])
def test_repetitions_share_design_and_differ_only_in_noise(name, complexity) -> None:
    a, b, a_again = load(name, complexity, 0), load(name, complexity, 1), load(name, complexity, 0)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x) and torch.equal(a.test_y, b.test_y)
    assert torch.equal(a.train_y, a_again.train_y)
    assert not torch.equal(a.train_y, b.train_y)
    # the noise has the declared σ: residuals y − G(x)ᵀγ
    _, gamma = design(name, float(complexity))
    clean = (a.feature_map(a.train_x.double()) @ torch.from_numpy(gamma)).numpy()
    residuals = np.concatenate([load(name, complexity, s).train_y.double().numpy() - clean for s in range(5)])
    assert abs(residuals.std() / NOISE_STD[name] - 1) < 0.1
    assert abs(residuals.mean()) < 3 * NOISE_STD[name] / np.sqrt(residuals.size)


@pytest.mark.parametrize("name,low,high", [("e1", 1.0, 5.0), ("e3", 1.0, 3.0)])
def test_complexity_levels_share_gamma_and_have_their_own_inputs(name, low, high) -> None:
    """γ is drawn once per experiment, so a curve over complexity varies the complexity alone (this fails
    as soon as the complexity enters γ's seed); the training inputs stay per level, as in the paper."""
    x_low, gamma_low = design(name, low)
    x_high, gamma_high = design(name, high)
    np.testing.assert_array_equal(gamma_low, gamma_high)
    assert not np.array_equal(x_low, x_high)


def test_e2_levels_hold_each_coordinates_draws_fixed() -> None:
    """E.2's γ(d) = (z_0, (a_1..a_d, b_1..b_d, c_1..c_d, e_1..e_{d−1}) / √d) from one fixed draw: the
    coefficients at d = 3, times √3, are those at d = 5, times √5, on the shared features."""
    d_small, d_large = 3, 5
    small, large = design("e2", d_small)[1], design("e2", d_large)[1]
    assert small.shape == (4 * d_small,) and large.shape == (4 * d_large,)
    assert small[0] == large[0]  # the intercept is not rescaled

    def blocks(gamma: np.ndarray, d: int) -> list[np.ndarray]:
        z = gamma[1:] * np.sqrt(d)
        return [z[:d], z[d : 2 * d], z[2 * d : 3 * d], z[3 * d :]]  # x_j, sin x_j, cos x_j, sin(x_j + x_j+1)

    for part_small, part_large in zip(blocks(small, d_small), blocks(large, d_large)):
        np.testing.assert_allclose(part_small, part_large[: len(part_small)], rtol=1e-12)


def test_n_train_option_and_bounds() -> None:
    small = load("e1", 2.0, 0, n_train=50)
    full = load("e1", 2.0, 0)
    assert small.train_x.shape == (50, 1)
    assert torch.equal(small.train_x, full.train_x[:50])  # the same design stream
    with pytest.raises(ValueError):
        make_dataset("e1", 100.0, 0)


def test_true_features_model_is_linear_in_g() -> None:
    ds = load("e3", 2.0, 0)
    spec = get_model("true_features")
    assert spec.needs_feature_map and spec.tasks == ("regression",)
    model = spec.build(ds.input_shape, 1, feature_map=ds.feature_map)
    assert sum(p.numel() for p in model.parameters()) == 9
    assert any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    _, gamma = design("e3", 2.0)
    with torch.no_grad():
        model.linear.weight.copy_(torch.from_numpy(gamma).float().unsqueeze(0))
        out = model(ds.test_x)
    assert out.shape == (841, 1)
    np.testing.assert_allclose(out[:, 0].numpy(), ds.test_y.numpy(), rtol=1e-4, atol=1e-4)
