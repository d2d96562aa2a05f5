"""Online posterior-predictive accumulators: agreement with batch computation, hand cases, memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ursa_ray.evaluation import ClassificationPredictive, RegressionPredictive


def _buffer_bytes(obj: object) -> int:
    """Total nbytes of every tensor or array the object holds as an attribute."""
    total = 0
    for value in vars(obj).values():
        if isinstance(value, torch.Tensor):
            total += value.nelement() * value.element_size()
        elif isinstance(value, np.ndarray):
            total += value.nbytes
    return total


def test_mean_probs_and_expected_entropy_match_batch_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 11, 4, generator=gen) * 3  # S=7 samples, n=11, K=4
    pred = ClassificationPredictive(11, 4)
    for s in range(7):
        pred.update(logits[s])
    probs = torch.softmax(logits.double(), dim=-1)
    mean = probs.mean(dim=0).numpy()
    expected_h = (-(probs * probs.log()).sum(-1)).mean(0).numpy()
    total_h = -(mean * np.log(mean)).sum(-1)
    assert pred.n_samples == 7
    for value in (pred.mean_probs, pred.total_entropy, pred.expected_entropy, pred.mutual_information):
        assert isinstance(value, np.ndarray) and value.dtype == np.float64
    np.testing.assert_allclose(pred.mean_probs, mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pred.expected_entropy, expected_h, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pred.total_entropy, total_h, rtol=0, atol=1e-12)
    np.testing.assert_allclose(pred.mutual_information, total_h - expected_h, rtol=0, atol=1e-12)


def test_float32_logits_are_accumulated_in_float64() -> None:
    logits = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float32)
    pred = ClassificationPredictive(1, 3)
    pred.update(logits)
    expected = torch.softmax(logits.double(), dim=-1).numpy()
    np.testing.assert_allclose(pred.mean_probs, expected, rtol=0, atol=1e-15)


def test_mutual_information_zero_for_identical_samples() -> None:
    logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    pred = ClassificationPredictive(5, 3)
    for _ in range(4):
        pred.update(logits)
    np.testing.assert_allclose(pred.mutual_information, 0.0, rtol=0, atol=1e-12)
    assert np.all(pred.total_entropy > 0.1)


def test_mutual_information_positive_for_differing_samples() -> None:
    gen = torch.Generator().manual_seed(2)
    pred = ClassificationPredictive(5, 3)
    for _ in range(3):
        pred.update(torch.randn(5, 3, generator=gen) * 2)
    assert np.all(pred.mutual_information > 1e-3)


def test_mutual_information_two_sample_two_class_hand_case() -> None:
    # Sample 1: p = (0.8, 0.2); sample 2: p = (0.2, 0.8).  Mean (0.5, 0.5), H = ln 2 = 0.693147.
    # Per-sample H = -(0.8 ln 0.8 + 0.2 ln 0.2) = 0.500402, so MI = 0.693147 - 0.500402 = 0.192745.
    pred = ClassificationPredictive(1, 2)
    pred.update(torch.tensor([[math.log(0.8), math.log(0.2)]]))
    pred.update(torch.tensor([[math.log(0.2), math.log(0.8)]]))
    np.testing.assert_allclose(pred.mean_probs, [[0.5, 0.5]], atol=1e-7)
    np.testing.assert_allclose(pred.total_entropy, [0.693147], atol=1e-6)
    np.testing.assert_allclose(pred.expected_entropy, [0.500402], atol=1e-6)
    np.testing.assert_allclose(pred.mutual_information, [0.192745], atol=1e-6)


def test_extreme_logits_give_finite_entropies() -> None:
    pred = ClassificationPredictive(2, 2)
    pred.update(torch.tensor([[1000.0, -1000.0], [-1000.0, 1000.0]]))
    assert np.all(np.isfinite(pred.expected_entropy))
    np.testing.assert_allclose(pred.expected_entropy, [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(pred.mean_probs, [[1.0, 0.0], [0.0, 1.0]], atol=1e-12)


def test_classification_memory_is_independent_of_sample_count() -> None:
    gen = torch.Generator().manual_seed(3)
    pred = ClassificationPredictive(50, 10)
    pred.update(torch.randn(50, 10, generator=gen))
    after_one = _buffer_bytes(pred)
    for _ in range(99):
        pred.update(torch.randn(50, 10, generator=gen))
    assert pred.n_samples == 100
    assert after_one == _buffer_bytes(pred) == (50 * 10 + 50) * 8


def test_classification_rejects_wrong_shape_and_empty_reads() -> None:
    pred = ClassificationPredictive(4, 3)
    with pytest.raises(RuntimeError):
        _ = pred.mean_probs
    with pytest.raises(ValueError):
        pred.update(torch.zeros(4, 2))


def test_returned_arrays_do_not_alias_internal_state() -> None:
    pred = RegressionPredictive(3)
    pred.update(torch.tensor([1.0, 2.0, 3.0]))
    mean = pred.mean
    mean[:] = 100.0
    np.testing.assert_array_equal(pred.mean, [1.0, 2.0, 3.0])


def test_regression_matches_numpy_over_stacked_samples() -> None:
    gen = torch.Generator().manual_seed(4)
    samples = torch.randn(9, 13, generator=gen) * 5 + 100  # offset tests Welford's stability
    pred = RegressionPredictive(13)
    for s in range(9):
        pred.update(samples[s].unsqueeze(1) if s % 2 else samples[s])  # both (n,) and (n, 1)
    stacked = samples.double().numpy()
    assert pred.n_samples == 9
    assert pred.mean.dtype == np.float64 and pred.std.dtype == np.float64
    np.testing.assert_allclose(pred.mean, stacked.mean(axis=0), rtol=0, atol=1e-10)
    np.testing.assert_allclose(pred.std, stacked.std(axis=0, ddof=1), rtol=0, atol=1e-10)


def test_regression_std_zero_for_one_sample_and_hand_case() -> None:
    pred = RegressionPredictive(2)
    pred.update(torch.tensor([1.0, -2.0]))
    np.testing.assert_array_equal(pred.std, [0.0, 0.0])
    pred.update(torch.tensor([3.0, -2.0]))
    # samples (1, 3): mean 2, sample std √(((1 − 2)² + (3 − 2)²) / (2 − 1)) = √2; samples (-2, -2): std 0
    np.testing.assert_allclose(pred.mean, [2.0, -2.0], atol=1e-12)
    np.testing.assert_allclose(pred.std, [math.sqrt(2.0), 0.0], atol=1e-12)


def test_regression_memory_is_independent_of_sample_count() -> None:
    gen = torch.Generator().manual_seed(5)
    pred = RegressionPredictive(20)
    pred.update(torch.randn(20, generator=gen))
    after_one = _buffer_bytes(pred)
    for _ in range(99):
        pred.update(torch.randn(20, generator=gen))
    assert after_one == _buffer_bytes(pred) == 2 * 20 * 8
    with pytest.raises(ValueError):
        pred.update(torch.zeros(20, 2))


def test_regression_variance_is_unbiased_for_a_five_member_ensemble() -> None:
    """Five members with means f_s ~ N(0, s²) i.i.d., 20000 independent repetitions (one per example):
    E[std²] = s² within 2%.  The S − 1 divisor makes the variance unbiased (std itself is biased low by
    Jensen's inequality, E[std] = 0.94 s for S = 5); the divide-by-S estimator gives E[std²] = 0.8 s²."""
    s, n_members, n_repetitions = 0.3, 5, 20000
    gen = torch.Generator().manual_seed(11)
    pred = RegressionPredictive(n_repetitions)
    for _ in range(n_members):
        pred.update(s * torch.randn(n_repetitions, dtype=torch.float64, generator=gen))
    # std² / s² ~ χ²_4 / 4 has relative standard deviation 1/√2: the mean's is 0.5% over 20000 repetitions
    assert np.mean(pred.std**2) / s**2 == pytest.approx(1.0, abs=0.02)
