"""Exactness check: HMC on the model linear in the true features reproduces the anchor.

With f(x) = wᵀG(x), a Gaussian likelihood of known σ and a very wide Gaussian prior (std 1e3, negligible
against the data), the posterior of w is the flat-prior anchor posterior, so HMC's predictive mean and
std must match :func:`anchor_predictive` at every test point up to Monte Carlo error.  E.2 with d = 1
(p = 4 features) keeps the Monte Carlo error of the std small for a short chain.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.methods import registry
from ursa_ray.methods.base import Gaussian, Problem, resolve_config
from ursa_ray.models import get_model
from ursa_ray.regression import anchor_for_dataset


@pytest.mark.slow
def test_hmc_on_true_features_matches_the_anchor() -> None:
    method = registry()["hmc"]
    ds = make_dataset("e2", 1, 0)
    torch.manual_seed(0)
    spec = get_model("true_features")
    problem = Problem(
        x=ds.train_x,
        y=ds.train_y,
        likelihood=Gaussian(ds.noise_std),
        make_model=lambda: spec.build(ds.input_shape, 1, feature_map=ds.feature_map),
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    config = resolve_config(
        method,
        {
            "prior_std": 1e3,
            "n_samples": 3000,
            "burn_in": 200,
            "n_leapfrog": 6,
            "step_size": 1e-3,
            "step_jitter": 0.9,
        },
    )
    stats: dict[str, float] = {}
    samples = []
    for predictor in method.sample_posterior(problem, config, stats):
        with torch.no_grad():
            samples.append(predictor(ds.test_x).reshape(-1).double().numpy().copy())
    samples = np.array(samples)
    mean, std = samples.mean(axis=0), samples.std(axis=0)
    anchor_mean, anchor_std = anchor_for_dataset(ds)
    assert stats["accept_rate"] > 0.5
    # 5% relative: the std against the anchor's std; the mean against max(|anchor mean|, anchor std)
    std_error = np.abs(std / anchor_std - 1)
    mean_error = np.abs(mean - anchor_mean) / np.maximum(np.abs(anchor_mean), anchor_std)
    assert std_error.max() < 0.05, (std_error.max(), int(std_error.argmax()))
    assert mean_error.max() < 0.05, (mean_error.max(), int(mean_error.argmax()))
