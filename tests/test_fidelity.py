"""Fidelity metrics (ursa_ray.evaluation.fidelity) against closed forms, scipy and hand cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ursa_ray.evaluation import fidelity


def dirichlet(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(k, 0.5), size=n)


def test_uniform_against_a_one_hot_reference_is_the_closed_form():
    k, labels = 10, np.array([0, 3, 3, 7, 9, 0, 1, 2])
    one_hot = np.eye(k)[labels]
    uniform = np.full_like(one_hot, 1 / k)
    assert fidelity.total_variation(one_hot, uniform) == pytest.approx(1 - 1 / k, abs=1e-15)
    assert fidelity.kl_divergence(one_hot, uniform) == pytest.approx(math.log(k), abs=1e-12)
    # uniform's argmax is class 0 (first of the ties): agrees where the label is 0
    assert fidelity.agreement(one_hot, uniform) == pytest.approx(np.mean(labels == 0))


def test_tv_and_kl_match_scipy_and_identical_predictives_score_perfectly():
    p, q = dirichlet(50, 5, 0), dirichlet(50, 5, 1)
    kl = np.mean([stats.entropy(p[i], q[i]) for i in range(50)])
    assert fidelity.kl_divergence(p, q) == pytest.approx(kl, rel=1e-12)
    tv = np.mean([0.5 * sum(abs(a - b) for a, b in zip(p[i], q[i])) for i in range(50)])
    assert fidelity.total_variation(p, q) == pytest.approx(tv, rel=1e-12)
    assert fidelity.agreement(p, q) == pytest.approx(np.mean(p.argmax(1) == q.argmax(1)))
    assert fidelity.classification_fidelity(p, p) == {"agreement": 1.0, "total_variation": 0.0, "kl": 0.0}
    # direction: KL(reference || method), not the reverse (they differ here)
    assert fidelity.kl_divergence(p, q) != pytest.approx(fidelity.kl_divergence(q, p), rel=1e-3)


def test_kl_clips_a_zero_method_probability_at_epsilon():
    p, q = np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])
    expected = 0.5 * math.log(0.5) + 0.5 * math.log(0.5 / fidelity.KL_EPSILON)
    assert fidelity.kl_divergence(p, q) == pytest.approx(expected, rel=1e-12)


def test_w2_of_gaussians_matches_the_quantile_integral():
    m1, s1, m2, s2 = np.array([0.3, -1.0]), np.array([0.5, 2.0]), np.array([1.1, -1.0]), np.array([0.2, 0.7])
    u = (np.arange(200_000) + 0.5) / 200_000  # W2² = ∫₀¹ (F₁⁻¹(u) − F₂⁻¹(u))² du, midpoint rule
    by_quantiles = [
        math.sqrt(np.mean((stats.norm.ppf(u, m1[i], s1[i]) - stats.norm.ppf(u, m2[i], s2[i])) ** 2)) for i in range(2)
    ]
    np.testing.assert_allclose(fidelity.wasserstein2_gaussian(m1, s1, m2, s2), by_quantiles, rtol=1e-3)
    assert fidelity.regression_fidelity(m1, s1, m2, s2)["w2"] == pytest.approx(np.mean(by_quantiles), rel=1e-3)


def test_noise_floor_compares_the_two_halves_of_the_chains():
    a, b = dirichlet(20, 3, 2), dirichlet(20, 3, 3)
    chains = np.stack([a, a, b, b])  # halves: {a, a} vs {b, b}
    assert fidelity.noise_floor(chains) == fidelity.classification_fidelity(a, b)
    assert fidelity.noise_floor(np.stack([a, b, a, b]))["total_variation"] == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError):
        fidelity.noise_floor(a[None])
    # regression: equal halves -> 0; halves with different means -> |Δm| when the spreads agree
    means = np.array([[0.0, 1.0], [0.0, 1.0], [0.5, 1.0], [0.5, 1.0]])
    variances = np.full_like(means, 0.04)
    assert fidelity.regression_noise_floor(means, variances)["w2"] == pytest.approx(0.25)


def test_independent_chains_converge_and_stuck_or_short_chains_do_not():
    rng = np.random.default_rng(0)
    iid = rng.normal(size=(4, 500, 6, 3))
    good = fidelity.convergence(iid)
    assert good.converged and good.rhat_max < 1.02 and good.ess_bulk_min > 1000
    # chains that have not left their starting points: slow AR(1) started apart
    stuck = np.empty((4, 60, 5))
    stuck[:, 0] = np.arange(4)[:, None] * 3.0
    for t in range(1, 60):
        stuck[:, t] = 0.99 * stuck[:, t - 1] + 0.1 * rng.normal(size=(4, 5))
    verdict = fidelity.convergence(stuck)
    assert not verdict.converged and verdict.rhat_max > 1.5
    # mixed but too few draws for the ESS threshold (4 × 10 independent draws: ESS ≈ 40 < 100)
    short = fidelity.convergence(rng.normal(size=(4, 10, 3)))
    assert not short.converged and short.ess_bulk_min < fidelity.ESS_MIN
    one_chain = fidelity.convergence(rng.normal(size=(1, 100, 3)))  # R̂ needs two chains
    assert not one_chain.converged and math.isnan(one_chain.rhat_max)
    # a constant quantity (a saturated class) is skipped, not NaN for the whole
    with_constant = np.concatenate([iid[..., 0], np.ones((4, 500, 1))], axis=-1)
    assert fidelity.convergence(with_constant).converged


def test_the_report_holds_regression_methods_against_the_anchor():
    """Regression trials' ``fidelity:test`` W₂ rows become one table per experiment in the report's regression
    part (mean and Student t interval over repetitions, per complexity, method and model); the classification
    fidelity table leaves them out (its reference is multi-chain HMC, a regression cell's is the anchor)."""
    from analysis.fidelity import anchor_fidelity_markdown, fidelity_frame

    trials, metrics = [], []
    for method, base in (("bd", 0.2), ("sgd", 0.5)):
        for seed in range(3):
            trial_id = f"{method}-{seed}"
            trials.append({"trial_id": trial_id, "phase": "final", "status": "ok", "task": "regression",
                           "complexity": 2.0, "method": method, "model": "mlp", "dataset": "e2", "seed": seed})  # fmt: skip
            for metric, value in (
                ("w2", base + 0.1 * seed),
                ("w2_in_distribution", base),
                ("w2_out_of_distribution", 2 * base),
            ):
                metrics.append({"trial_id": trial_id, "phase": "final", "method": method, "model": "mlp", "dataset": "e2",
                                "seed": seed, "eval_set": "fidelity:test", "eval_kind": "fidelity", "metric": metric,
                                "value": value})  # fmt: skip
    trials, metrics = pd.DataFrame(trials), pd.DataFrame(metrics)
    text = anchor_fidelity_markdown(metrics, trials)
    half = stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert "### e2" in text
    assert f"| 2.000 | bd | mlp | 0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}] n=3 | 0.200" in text
    assert "| 2.000 | sgd | mlp | 0.600" in text and "| 1.000 [1.000, 1.000] n=3 |" in text  # sgd's OOD W₂
    assert fidelity_frame(metrics, trials).empty
    assert anchor_fidelity_markdown(metrics.iloc[:0], trials) == ""


def test_fidelity_against_cost_joins_each_methods_costs_and_draws_a_panel_per_cell_and_axis(tmp_path):
    """The figure's frame: per (cell, method) the seed means of ``fidelity:test`` TV and of the same trials'
    ``train_s`` and ``flops_per_prediction`` cost rows; a figure is written and the report section links it."""
    from analysis.fidelity import fidelity_cost_frame, fidelity_markdown

    trials, metrics = [], []
    for method, tv, seconds, flops in (("hmc", 0.05, 30.0, 2e6), ("sgd", 0.4, 2.0, 1e5), ("swag", 0.3, 4.0, 1e6)):
        for seed in range(2):
            trial_id = f"{method}-{seed}"
            trials.append({"trial_id": trial_id, "phase": "final", "status": "ok", "task": "classification",
                           "method": method, "model": "mlp", "dataset": "digits", "seed": seed})  # fmt: skip
            for eval_set, kind, metric, value in (
                ("fidelity:test", "fidelity", "total_variation", tv + 0.01 * seed),
                ("fidelity:test", "fidelity", "agreement", 1 - tv),
                ("cost", "cost", "train_s", seconds * (1 + seed)),
                ("cost", "cost", "flops_per_prediction", flops),
            ):
                metrics.append({"trial_id": trial_id, "phase": "final", "method": method, "model": "mlp",
                                "dataset": "digits", "seed": seed, "eval_set": eval_set, "eval_kind": kind,
                                "metric": metric, "value": value})  # fmt: skip
    trials, metrics = pd.DataFrame(trials), pd.DataFrame(metrics)
    frame = fidelity_cost_frame(metrics, trials).droplevel(["model", "dataset"])
    assert frame.loc["sgd", "total_variation"] == pytest.approx(0.405)
    assert frame.loc["hmc", "train_s"] == pytest.approx(45.0) and frame.loc["swag", "flops_per_prediction"] == 1e6
    text, figures = fidelity_markdown(metrics, trials, tmp_path)
    assert "### mlp / digits" in text and [f.name for f in figures] == ["fidelity_cost.png"]
    assert figures[0].read_bytes().startswith(b"\x89PNG")
    assert fidelity_markdown(metrics[metrics.eval_kind == "cost"], trials, tmp_path / "none") == ("", [])


@pytest.mark.parametrize("seed", [3, 11])  # pairs whose TV (3) or KL (11) rounds differently by layout without it
def test_the_metrics_are_the_same_to_the_last_bit_whatever_the_memory_layout(seed):
    """A prediction table read back from Parquet is column-ordered where a trial's accumulator is row-ordered,
    and numpy's row sums round by layout: the metrics recomputed from saved tables must equal the trial's."""
    p, q = dirichlet(360, 10, seed), dirichlet(360, 10, seed + 100)
    rows = fidelity.classification_fidelity(p, q)
    assert fidelity.classification_fidelity(np.asfortranarray(p), np.asfortranarray(q)) == rows
