"""SWA / SWAG: exact running moments, the draw covariance, distinct draws, batch-norm refresh."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from small_problems import regression_problem
from torch import nn

from ursa_ray.methods import get_method
from ursa_ray.methods.base import flat_parameters, resolve_config
from ursa_ray.methods.swag import SWAGMoments, collect_iterates, fit_swa, has_batch_norm, refresh_batch_norm

SMALL = {"epochs": 3, "swa_epochs": 6, "batch_size": 16, "lr": 0.01, "swa_lr": 0.005}


def test_registered_with_budget_keys():
    for name in ("swag", "swa"):
        method = get_method(name)
        declared = {h.name for h in method.hyperparameters}
        assert {"epochs", "batch_size"} <= declared
    assert "n_samples" in {h.name for h in get_method("swag").hyperparameters}
    assert resolve_config(get_method("swag"), {})["scale"] == 1.0  # the paper's covariance, unscaled


def test_running_mean_is_exact_mean_of_iterates():
    gen = torch.Generator().manual_seed(0)
    iterates = [torch.randn(50, generator=gen) * 3 + 7 for _ in range(13)]
    moments = SWAGMoments(50, max_rank=4)
    for n, theta in enumerate(iterates, start=1):
        moments.collect(theta)
        stacked = torch.stack(iterates[:n]).double()
        torch.testing.assert_close(moments.mean, stacked.mean(0), rtol=0, atol=1e-12)
        torch.testing.assert_close(moments.sq_mean, (stacked**2).mean(0), rtol=1e-12, atol=1e-12)
        # not the biased sum / (n + 1) of URSABench's PCA code
        assert not torch.allclose(moments.mean, stacked.sum(0) / (n + 1))
    assert moments.n == 13 and moments.n_stored == 4


def test_deviation_buffer_keeps_last_k_running_deviations():
    gen = torch.Generator().manual_seed(1)
    iterates = [torch.randn(6, generator=gen) for _ in range(7)]
    moments = SWAGMoments(6, max_rank=3)
    expected = []
    for n, theta in enumerate(iterates, start=1):
        moments.collect(theta)
        expected.append(theta.double() - torch.stack(iterates[:n]).double().mean(0))
    got = sorted(moments.deviation_matrix().tolist())
    want = sorted(torch.stack(expected[-3:]).float().tolist())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    # final-centred variant: raw last-K iterates minus the final mean
    final = SWAGMoments(6, max_rank=3, centre="final")
    for theta in iterates:
        final.collect(theta)
    mean = torch.stack(iterates).mean(0)
    got = sorted(final.deviation_matrix().tolist())
    want = sorted((torch.stack(iterates[-3:]) - mean).tolist())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_draw_covariance_matches_formula(scale):
    """Draws ~ N(θ̄, scale·½(diag σ² + DᵀD/(K−1))): sample mean, variances and covariances agree."""
    gen = torch.Generator().manual_seed(2)
    p, k = 5, 4
    directions = torch.randn(2, p, generator=gen)
    moments = SWAGMoments(p, max_rank=k)
    for _ in range(12):
        moments.collect(1.0 + torch.randn(p, generator=gen) * 0.3 + torch.randn(2, generator=gen) @ directions)
    assert moments.n_stored == k
    d = moments.deviation_matrix().double()
    expected = scale * 0.5 * (torch.diag(moments.sq_mean - moments.mean**2) + d.T @ d / (k - 1))
    torch.testing.assert_close(moments.covariance(scale), expected)
    torch.testing.assert_close(moments.covariance_diagonal(scale), torch.diagonal(expected))

    n = 20000
    draw_gen = torch.Generator().manual_seed(3)
    draws = torch.stack([moments.sample(draw_gen, scale) for _ in range(n)]).double()
    sample_mean = draws.mean(0)
    sample_cov = torch.cov(draws.T)
    sd = torch.diagonal(expected).sqrt()
    # mean within 4 standard errors; covariances within 4 SE of a sample covariance (≈ sd_i sd_j √(2/n))
    assert ((sample_mean - moments.mean).abs() < 4 * sd / math.sqrt(n)).all()
    tolerance = 4 * torch.outer(sd, sd) * math.sqrt(2 / n)
    assert ((sample_cov - expected).abs() < tolerance).all(), (sample_cov, expected)
    # the formula is not scale-free: the other scale is far outside the tolerance
    other = expected * (2.0 if scale == 0.5 else 0.5)
    assert not ((sample_cov - other).abs() < tolerance).all()


def test_diagonal_only_when_fewer_than_two_deviations():
    gen = torch.Generator().manual_seed(4)
    moments = SWAGMoments(3, max_rank=0)
    for _ in range(5):
        moments.collect(torch.randn(3, generator=gen))
    # SWAG-diagonal: Σ = Σ_diag, no ½ (that averages Σ_diag with a low-rank estimate there is none of)
    torch.testing.assert_close(moments.covariance(), torch.diag(moments.variance()))
    torch.testing.assert_close(moments.covariance_diagonal(), moments.variance())
    torch.testing.assert_close(moments.covariance_diagonal(0.5), 0.5 * moments.variance())
    one = SWAGMoments(3, max_rank=5)
    one.collect(torch.ones(3))
    draw = one.sample(torch.Generator().manual_seed(0), 0.5, min_var=1e-30)
    torch.testing.assert_close(draw, torch.ones(3))  # one iterate: zero variance, no low-rank term


@pytest.mark.parametrize("rank", [0, 1])
def test_swag_diagonal_draws_have_variance_sigma_diag(rank):
    """SWAG with rank < 2 is SWAG-diagonal, N(θ̄, Σ_diag) (Maddox et al. 2019): the empirical variance of
    the method's draws matches Σ_diag = mean(θ_i²) − mean(θ_i)² of the collected iterates, not ½Σ_diag."""
    n_draws = 4000
    config = resolve_config(get_method("swag"), {**SMALL, "rank": rank, "n_samples": n_draws})
    draws = torch.stack(
        [flat_parameters(p).double() for p in get_method("swag").sample_posterior(regression_problem(8), config, {})]
    )
    iterates: list[torch.Tensor] = []
    fit_swa(regression_problem(8), config, {}, rank, on_collect=iterates.append)  # the same run, recorded
    stacked = torch.stack(iterates).double()
    sigma_diag = (stacked**2).mean(0) - stacked.mean(0) ** 2
    ratio = draws.var(0) / sigma_diag
    se = math.sqrt(2 / (n_draws - 1))  # relative standard error of a sample variance
    assert ((ratio - 1).abs() < 5 * se).all(), ratio
    assert abs(ratio.mean().item() - 1) < 4 * se / math.sqrt(len(ratio)), ratio.mean()


def test_collection_schedule_and_grad_evals():
    problem = regression_problem()
    config = resolve_config(get_method("swag"), {**SMALL, "swa_collect_every": 2})
    stats: dict[str, float] = {}
    seen = []
    model = problem.make_model()
    n = collect_iterates(model, problem, config, stats, seen.append)
    steps = config["swa_epochs"] * math.ceil(64 / 16)
    assert n == len(seen) == steps // 2
    assert stats["grad_evals"] == steps
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(seen))
    with pytest.raises(ValueError, match="nothing collected"):
        collect_iterates(model, problem, {**config, "swa_collect_every": 10_000}, {}, seen.append)


def test_swag_draws_distinct_with_spread_and_unbiased_mean():
    problem = regression_problem(seed=5)
    config = resolve_config(get_method("swag"), {**SMALL, "n_samples": 6, "rank": 4})
    stats: dict[str, float] = {}
    x_test = torch.linspace(-3, 3, 20).unsqueeze(1).repeat(1, 3)
    params, preds = [], []
    for predictor in get_method("swag").sample_posterior(problem, config, stats):
        params.append(flat_parameters(predictor))
        with torch.no_grad():
            preds.append(predictor(x_test).squeeze(1))
    assert len(params) == 6 and stats["n_samples"] == 6
    assert stats["grad_evals"] == (config["epochs"] + config["swa_epochs"]) * 4
    assert stats["swa_iterates"] == config["swa_epochs"]
    for a, b in itertools.combinations(range(6), 2):
        assert not torch.equal(params[a], params[b])
        assert not torch.allclose(preds[a], preds[b])
    assert torch.stack(preds).std(0).mean() > 1e-4

    # the same run, recording the iterates: the draws scatter around their exact mean
    problem = regression_problem(seed=5)
    seen: list[torch.Tensor] = []
    _, moments = fit_swa(problem, config, {}, config["rank"], on_collect=seen.append)
    torch.testing.assert_close(moments.mean, torch.stack(seen).double().mean(0), rtol=0, atol=1e-12)
    assert len(seen) == config["swa_epochs"]


def test_swa_yields_mean_of_iterates():
    config = resolve_config(get_method("swa"), SMALL)
    seen: list[torch.Tensor] = []
    fit_swa(regression_problem(seed=6), config, {}, 0, on_collect=seen.append)
    (predictor,) = list(get_method("swa").sample_posterior(regression_problem(seed=6), config, stats := {}))
    torch.testing.assert_close(flat_parameters(predictor), torch.stack(seen).mean(0), rtol=1e-6, atol=1e-7)
    assert stats["n_samples"] == 1 and not predictor.training


def _bn_stats_from_data(model: nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        h = model[0](x)
    return h.mean(0), h.var(0, unbiased=True)


def test_batch_norm_refreshed_for_each_draw():
    problem = regression_problem(seed=7, batch_norm=True)
    config = resolve_config(get_method("swag"), {**SMALL, "n_samples": 3, "rank": 3})
    running_means = []
    for predictor in get_method("swag").sample_posterior(problem, config, {}):
        mean, var = _bn_stats_from_data(predictor, problem.x)
        torch.testing.assert_close(predictor[1].running_mean, mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(predictor[1].running_var, var, rtol=1e-5, atol=1e-5)
        assert not predictor.training
        running_means.append(predictor[1].running_mean.clone())
    assert not torch.allclose(running_means[0], running_means[1])


def test_refresh_skipped_without_batch_norm():
    problem = regression_problem()
    mlp = problem.make_model()
    assert not has_batch_norm(mlp)
    before = {k: v.clone() for k, v in mlp.state_dict().items()}
    assert refresh_batch_norm(mlp, problem) is False
    assert all(torch.equal(before[k], v) for k, v in mlp.state_dict().items())
    bn = regression_problem(batch_norm=True).make_model()
    assert has_batch_norm(bn) and refresh_batch_norm(bn, problem) is True


def test_nan_loss_raises():
    config = resolve_config(get_method("swag"), {**SMALL, "lr": 1e6, "n_samples": 1})
    with pytest.raises(FloatingPointError):
        list(get_method("swag").sample_posterior(regression_problem(), config, {}))
