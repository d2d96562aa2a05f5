"""HMC's batched chains (``sample_posterior_batched``, ``n_chains``) against the exact BLR posterior and
against chains run alone.

(a) Four problems (four data seeds of the BLR fixture) run as one batched computation: each chain passes
    :func:`test_hmc.check_exact_posterior` against its own problem's exact posterior.
(b) Every batched chain samples what it would alone: with the batched kernel's potential evaluated one
    chain at a time the batched run is bitwise the unbatched one (step-size search and dual averaging
    included); with the real ``vmap``'d potential (which differs in the last bits of U) the samples agree
    to float tolerance over a non-adaptive run.  (With adaptation the last-bit differences are amplified
    by the dual averaging's feedback at the wild early step sizes, so there only (a) applies.)
(c) ``n_chains`` chains of one problem start apart, draw different momenta and are uncorrelated; the
    stream pools them chain after chain and the stats carry R̂ and ESS.
"""

from __future__ import annotations

import pytest
import torch
from exact_blr import make_blr_problem
from test_hmc import PRIOR_STD, check_exact_posterior

from ursa_ray.methods import get_method, hmc
from ursa_ray.methods.base import flat_parameters, resolve_config

ADAPTIVE = dict(step_size=1e-3, n_leapfrog=2, burn_in=200, n_samples=1000, step_jitter=0.2)


def config(**overrides):
    return resolve_config(get_method("hmc"), {"prior_std": PRIOR_STD, **overrides})


def batched_draws(problems, cfg):
    """(S, K, P) samples of K problems' batched streams, and their stats."""
    stats = [{} for _ in problems]
    rows = [
        torch.stack([flat_parameters(p).double() for p in item])
        for item in get_method("hmc").sample_posterior_batched(problems, cfg, stats)
    ]
    return torch.stack(rows), stats


def alone(problem, cfg):
    stats: dict[str, float] = {}
    rows = [flat_parameters(p).double() for p in get_method("hmc").sample_posterior(problem, cfg, stats)]
    return torch.stack(rows), stats


def count_search_steps(monkeypatch, n_chains: int) -> list[int]:
    """Each chain's one-leapfrog-step proposals in the step-size search, counted as the search makes them."""
    search_steps = [0] * n_chains
    real_search = hmc.initial_step_sizes

    def counted_search(eps, transition):
        def counting(eps, steps, active):
            for c, on in enumerate(active):
                search_steps[c] += steps if on else 0
            return transition(eps, steps, active)

        return real_search(eps, counting)

    monkeypatch.setattr(hmc, "initial_step_sizes", counted_search)
    return search_steps


@pytest.mark.slow
def test_each_chain_of_a_batched_run_matches_its_exact_posterior(monkeypatch):
    fixtures = [make_blr_problem(n=256, prior_std=PRIOR_STD, seed=s) for s in range(4)]
    search_steps = count_search_steps(monkeypatch, 4)
    samples, stats = batched_draws([f[0] for f in fixtures], config(**ADAPTIVE))
    assert samples.shape == (1000, 4, 5)
    for k, (_, mean, cov) in enumerate(fixtures):
        check_exact_posterior(samples[:, k], mean, cov)
        assert stats[k]["n_samples"] == 1000 and stats[k]["divergences"] == 0
        assert 0.7 < stats[k]["accept_rate"] < 0.97
        # the initial gradient, each chain's own search steps (none counted for a chain whose search ended),
        # then 2 leapfrog steps in each of 200 + 1000 iterations
        assert search_steps[k] >= 2
        assert stats[k]["grad_evals"] == 1 + search_steps[k] + 2 * 1200
    # each chain its own adapted step size
    assert len({stats[k]["step_size"] for k in range(4)}) == 4


def test_a_chain_whose_search_ended_counts_no_more_gradients(monkeypatch):
    """Posteriors 25× apart in width (noise std 0.5 and 0.02: different likelihoods, so each chain keeps its
    own potential): the wide one's step-size search runs longer, and each chain's gradient count is its own
    (a chain idle in the other's search steps is not charged for them)."""
    search_steps = count_search_steps(monkeypatch, 2)
    problems = [make_blr_problem(n=128, noise_std=s, seed=0)[0] for s in (0.5, 0.02)]
    _, stats = batched_draws(problems, config(step_size=1e-3, n_leapfrog=2, burn_in=5, n_samples=3))
    assert search_steps[0] != search_steps[1]
    for k in range(2):
        assert stats[k]["grad_evals"] == 1 + search_steps[k] + 2 * 8


def test_batched_kernel_is_bitwise_the_lone_chain(monkeypatch):
    """The batched bookkeeping (per-chain streams, step-size search, dual averaging, MH, (C, P) leapfrog) is
    exactly per chain: evaluating the potential chain by chain, a 3-problem batched run reproduces each
    problem's lone run bit for bit."""
    monkeypatch.setattr(hmc, "stackable", lambda models, problems: False)  # the looped potential
    cfg = config(step_size=1e-3, n_leapfrog=3, burn_in=60, n_samples=60, step_jitter=0.2)
    samples, stats = batched_draws([make_blr_problem(n=128, seed=s)[0] for s in range(3)], cfg)
    for k in range(3):
        lone, lone_stats = alone(make_blr_problem(n=128, seed=k)[0], cfg)
        assert torch.equal(samples[:, k], lone)
        assert stats[k] == lone_stats


@pytest.mark.slow
def test_vmapped_potential_matches_lone_chains_to_float_tolerance():
    cfg = config(step_size=0.02, adapt_step_size=False, n_leapfrog=3, burn_in=20, n_samples=300, step_jitter=0.2)
    samples, stats = batched_draws([make_blr_problem(n=128, seed=s)[0] for s in range(3)], cfg)
    for k in range(3):
        lone, lone_stats = alone(make_blr_problem(n=128, seed=k)[0], cfg)
        torch.testing.assert_close(samples[:, k], lone, rtol=1e-4, atol=1e-4)
        assert stats[k]["accept_rate"] == lone_stats["accept_rate"]
        assert stats[k]["grad_evals"] == lone_stats["grad_evals"]
    # the potential itself: U to float32 round-off of the per-example terms, gradients to float tolerance
    problems = [make_blr_problem(n=128, seed=s)[0] for s in range(3)]
    models = [p.make_model() for p in problems]
    q = torch.stack([flat_parameters(m) for m in models]) + 0.1
    g1, u1 = hmc.looped_potential(problems, models, 1.0, 0.7)(q)
    g2, u2 = hmc.stacked_potential(hmc.StackedNetworks([p.make_model() for p in problems]), problems, 1.0, 0.7)(q)
    assert u2.dtype == torch.float64 and g2.dtype == torch.float32
    torch.testing.assert_close(u2, u1, rtol=1e-7, atol=1e-3)
    torch.testing.assert_close(g2, g1, rtol=1e-5, atol=1e-3)


def test_chains_of_one_problem_are_independent_and_pooled():
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=5)
    cfg = config(**{**ADAPTIVE, "n_samples": 400, "n_chains": 3})
    stats: dict[str, float] = {}
    seen, rows = [], []
    for predictor in get_method("hmc").sample_posterior(problem, cfg, stats):
        seen.append(predictor)
        rows.append(flat_parameters(predictor).double())
    assert len(seen) == 1200 and stats["n_samples"] == 1200
    # pooled chain after chain: three distinct networks, in turn
    assert len({id(p) for p in seen[:3]}) == 3
    assert all(seen[i] is seen[i % 3] for i in range(len(seen)))
    chains = torch.stack(rows).reshape(400, 3, -1).transpose(0, 1)  # (chain, draw, P)
    for c in range(3):
        check_exact_posterior(chains[c], mean, cov)
    # uncorrelated: the iteration-to-iteration moves of different chains (driven by their own momenta)
    moves = chains.diff(dim=1)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert not torch.equal(chains[a, 0], chains[b, 0])
        corr = torch.corrcoef(torch.stack([moves[a].flatten(), moves[b].flatten()]))[0, 1]
        assert abs(float(corr)) < 0.1, (a, b, float(corr))
    assert stats["n_chains"] == 3.0 and stats["rhat_max"] < 1.05 and stats["ess_bulk_min"] > 100
    assert stats["divergences"] == 0 and 0.7 < stats["accept_rate"] < 0.97
    assert 3 * (1 + 2 * 600) <= stats["grad_evals"] < 3 * (1 + 2 * 600 + 100)


def test_chains_batched_over_problems_are_the_chains_of_each_problem():
    """problems × chains as one batched computation: problem k's j-th chain is the j-th chain of its lone
    ``n_chains`` run (each problem's chain generators come from its own generator)."""
    cfg = config(step_size=0.02, adapt_step_size=False, n_leapfrog=3, burn_in=10, n_samples=50, n_chains=2)
    samples, stats = batched_draws([make_blr_problem(n=128, seed=s)[0] for s in range(2)], cfg)
    assert samples.shape[0] == 100
    for k in range(2):
        lone, lone_stats = alone(make_blr_problem(n=128, seed=k)[0], cfg)
        torch.testing.assert_close(samples[:, k], lone, rtol=1e-4, atol=1e-4)
        assert stats[k]["n_samples"] == lone_stats["n_samples"] == 100
        assert stats[k]["accept_rate"] == lone_stats["accept_rate"]
