"""The observation models' log-likelihoods against hand-computed and scipy values, and the fused training
loss ``nll`` against the per-example ``log_prob`` it replaces."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from ursa_ray.methods.base import Categorical, Gaussian


def test_categorical_log_prob_hand_case() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(4.0), 0.0]])
    targets = torch.tensor([1, 1])
    expected = torch.tensor([math.log(3 / 4), math.log(1 / 5)])
    torch.testing.assert_close(Categorical().log_prob(logits, targets), expected)


def test_gaussian_log_prob_matches_scipy() -> None:
    outputs = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64)
    targets = torch.tensor([0.0, 0.25, 2.0], dtype=torch.float64)
    expected = stats.norm.logpdf(targets.numpy(), loc=outputs[:, 0].numpy(), scale=2.0)
    torch.testing.assert_close(Gaussian(noise_std=2.0).log_prob(outputs, targets), torch.from_numpy(expected))


_GENERATOR = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    "likelihood, outputs, targets",
    [
        (Categorical(), torch.randn(7, 4, generator=_GENERATOR), torch.tensor([0, 3, 1, 1, 2, 0, 1])),
        (Gaussian(0.3), torch.randn(7, 1, generator=_GENERATOR), torch.linspace(-1, 1, 7)),
    ],
    ids=["categorical", "gaussian"],
)
def test_nll_is_the_reduced_negative_log_prob_with_the_same_gradient(likelihood, outputs, targets, reduction) -> None:
    fused_input = outputs.clone().requires_grad_(True)
    reference_input = outputs.clone().requires_grad_(True)
    fused = likelihood.nll(fused_input, targets, reduction=reduction)
    per_example = -likelihood.log_prob(reference_input, targets)
    reference = per_example.mean() if reduction == "mean" else per_example.sum()
    torch.testing.assert_close(fused, reference)
    fused.backward()
    reference.backward()
    torch.testing.assert_close(fused_input.grad, reference_input.grad)


@pytest.mark.parametrize("likelihood", [Categorical(), Gaussian(noise_std=1.0)], ids=["categorical", "gaussian"])
def test_nll_rejects_unknown_reduction(likelihood) -> None:
    outputs, targets = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    if isinstance(likelihood, Gaussian):
        outputs, targets = torch.zeros(2, 1), torch.zeros(2)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'none'"):
        likelihood.nll(outputs, targets, reduction="none")
