"""The anchor model: closed form, numerical stability and exact 95% coverage under repeated noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa_ray.data.synthetic_regression import E1_NAMED, make_dataset
from ursa_ray.regression import anchor_for_dataset, anchor_predictive


def test_matches_textbook_formula() -> None:
    rng = np.random.default_rng(0)
    phi, phi_star = rng.standard_normal((40, 5)), rng.standard_normal((7, 5))
    y, sigma = rng.standard_normal(40), 0.3
    mean, std = anchor_predictive(phi, y, phi_star, sigma)
    v = np.linalg.inv(phi.T @ phi)  # fine for this well-conditioned check
    gamma_hat = v @ phi.T @ y
    np.testing.assert_allclose(mean, phi_star @ gamma_hat, rtol=1e-10)
    np.testing.assert_allclose(std, sigma * np.sqrt(np.einsum("ij,jk,ik->i", phi_star, v, phi_star)), rtol=1e-10)
    # torch inputs give the same answer
    mean_t, std_t = anchor_predictive(
        torch.from_numpy(phi).float(), torch.from_numpy(y), torch.from_numpy(phi_star), sigma
    )
    np.testing.assert_allclose(mean_t, mean, rtol=1e-5, atol=1e-6)


def test_invariant_to_feature_scaling_and_rejects_rank_deficiency() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, 60)
    phi = np.stack([x**k for k in range(6)], axis=1)
    y = np.sin(3 * x) + 0.1 * rng.standard_normal(60)
    xs = np.linspace(-1.5, 1.5, 11)
    phi_star = np.stack([xs**k for k in range(6)], axis=1)
    base = anchor_predictive(phi, y, phi_star, 0.1)
    scale = 10.0 ** np.array([0, 6, -6, 3, -3, 8])  # a badly scaled design: same model, same predictive
    scaled = anchor_predictive(phi * scale, y, phi_star * scale, 0.1)
    np.testing.assert_allclose(scaled[0], base[0], rtol=1e-8)
    np.testing.assert_allclose(scaled[1], base[1], rtol=1e-8)
    with pytest.raises(ValueError, match="rank deficient"):
        anchor_predictive(
            np.column_stack([phi, phi[:, 1] + phi[:, 2]]), y, np.column_stack([phi_star, phi_star[:, 1]]), 0.1
        )


@pytest.mark.parametrize("complexity", [1.0, 3.0, 5.0])
def test_blr_coverage_is_95_percent_over_200_repetitions(complexity: float) -> None:
    k = 200
    covered, inside = [], None
    for rep in range(k):
        ds = make_dataset("e1", complexity, rep)
        mean, std = anchor_for_dataset(ds)
        covered.append(np.abs(mean - ds.test_y.double().numpy()) <= 1.96 * std)
        inside = ds.test_info["in_distribution"].numpy()
    covered = np.array(covered, dtype=float)  # k × M
    x = ds.test_x[:, 0].double().numpy()
    se = np.sqrt(0.95 * 0.05 / k)
    for label, value in E1_NAMED.items():  # x = −2.38, 1.2 in-distribution, −5.11 OOD
        c = covered[:, np.argmin(abs(x - value))].mean()
        assert abs(c - 0.95) <= 3 * se, (label, c)
    for region in (inside, ~inside):  # averaged over the region: SE over repetitions
        per_rep = covered[:, region].mean(axis=1)
        assert abs(per_rep.mean() - 0.95) <= 3 * max(per_rep.std(ddof=1), 1e-3) / np.sqrt(k), per_rep.mean()
    # and at every single test point, no coverage far from 0.95 (4.5 SE, over 123 points)
    assert np.all(abs(covered.mean(axis=0) - 0.95) <= 4.5 * se)


def test_blr_is_unbiased_with_the_predicted_spread() -> None:
    k = 200
    means = []
    for rep in range(k):
        ds = make_dataset("e2", 3, rep)
        mean, std = anchor_for_dataset(ds)
        means.append(mean)
    means, truth = np.array(means), ds.test_y.double().numpy()
    z = (means.mean(axis=0) - truth) / (std / np.sqrt(k))
    assert np.all(abs(z) < 4.5)
    ratio = means.std(axis=0, ddof=1) / std  # empirical spread of the estimate / the anchor's std
    assert abs(np.median(ratio) - 1) < 0.1 and np.all(abs(ratio - 1) < 0.25), (
        np.median(ratio),
        ratio.min(),
        ratio.max(),
    )
