"""Vectorised repetitions (ursa_ray/methods/batched.py): seeds, ensemble members and chains trained as one
batched computation compute, per copy, what they would alone; their random streams are independent; and
chains run side by side report R̂ and ESS that tell mixed chains from unmixed ones."""

from __future__ import annotations

import copy
import dataclasses
import json
from contextlib import contextmanager, nullcontext

import pytest
import torch
from exact_blr import make_blr_problem
from test_sgmcmc import PRIOR_STD, assert_spread, lr_for
from torch import nn

from ursa_ray.grid import parse_grid
from ursa_ray.methods import get_method
from ursa_ray.methods.base import flat_parameters, resolve_config
from ursa_ray.methods.batched import CopyData, StackedNetworks, copy_generators, max_copies
from ursa_ray.methods.sgmcmc import LangevinCopies
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import run_trial, run_trials_batched


def _specs(method: str, hyperparameters: dict, seeds=(0, 1, 2, 3), dataset: str = "digits") -> list[dict]:
    grid = {
        "name": "batched",
        "methods": [{"name": method, "hyperparameters": hyperparameters}],
        "models": [{"name": "mlp", "options": {"widths": [32]}}],
        "datasets": [dataset],
        "seeds": list(seeds),
        "budget": {"epochs": 3, "batch_size": 128},
        "corruptions": {"types": ["gaussian_noise"], "severities": [1], "n_examples": 64},
        "adversarial": {"n_examples": 16, "attacks": ["fgsm"], "transfer": False},
        "bit_depths": ["float16"],
    }
    return parse_grid(grid, "batched.yaml").trial_specs()


def _metrics(outcome) -> dict:
    return {(m["eval_set"], m["metric"]): m["value"] for m in outcome.metrics if m["eval_set"] != "cost"}


FLOAT32_TOLERANCE = 2.0**-15
"""Per-example tolerance of a seed's predictive and uncertainties (probabilities, entropies, MI: absolute)
between its batched and its lone training.  The two differ only in float32 summation order (batched
matrix products against one network's), rounding errors of 2⁻²³ relative that training amplifies; we allow
2⁸ float32 ulps, 2⁻¹⁵ ≈ 3.1e-5 (measured at most 4e-6 on digits)."""

FLOAT16_TOLERANCE = 2.0**-10
"""The same for sets evaluated with every weight stored in float16: a weight whose float32 values differ by
rounding can round to neighbouring float16 values, so outputs agree to float16's resolution, 2⁻¹⁰ ≈ 9.8e-4
(measured at most 7e-5)."""

CONTINUOUS_METRICS = {"nll", "brier", "mean_entropy", "mean_mi", "epsilon", "reference"}
"""Metrics that move continuously with the per-example values; every other one jumps where two scores swap
order or a score crosses a threshold (accuracy, ECE, AUROC, AUPR, AURC, decision cost, attack success), or
is the optimum of a bounded search (``calibration_temperature``, ``nll_calibrated``: on the corrupted set of
a deep ensemble, per-example agreement to 3e-5 moved it from 3.279 to 3.240)."""


def _tolerance(eval_set: str) -> float:
    return FLOAT16_TOLERANCE if eval_set.endswith("@float16") else FLOAT32_TOLERANCE


def _partner(eval_set: str, tables: dict) -> list[str]:
    """The saved tables a set's metrics are computed from: the set itself and, for a set without labels
    (OOD, adversarial), the in-domain table it is scored against."""
    scheme = eval_set[eval_set.index("@") :] if "@" in eval_set else ""
    if eval_set.startswith(("adv:", "transfer:")):
        return [eval_set, eval_set.split(":")[0] + ":clean"]
    if (tables[eval_set]["label"] < 0).all():
        return [eval_set, "test" + scheme]
    return [eval_set]


def _separated(lone: list, together: list, tolerance: float) -> bool:
    """Whether no score a rank or threshold metric reads is within 2·tolerance of another (or of an ECE bin
    edge), so that float-order differences of up to ``tolerance`` cannot reorder them: max probability, the
    gap between the two largest probabilities, total entropy and MI, over the pooled tables.  Scores equal
    in the lone run must be equal in the batched run too."""
    import numpy as np

    def scores(tables):
        columns = []
        for table in tables:
            p = np.sort(table[[c for c in table.columns if c[0] == "p" and c[1:].isdigit()]].to_numpy(), axis=1)
            columns.append(
                np.stack(
                    [
                        p[:, -1],
                        p[:, -1] - p[:, -2],
                        table["total_entropy"].to_numpy(),
                        table["mutual_information"].to_numpy(),
                    ]
                )
            )
        return np.concatenate(columns, axis=1)

    a, b = scores(lone), scores(together)
    if np.any(a[1] <= 2 * tolerance):  # a near tie for the predicted class
        return False
    edges = np.arange(1, 15) / 15
    if np.any(np.abs(a[0][:, None] - edges) <= 2 * tolerance):
        return False
    for row_a, row_b in zip(a, b):
        order = np.argsort(row_a, kind="stable")
        gap_a, gap_b = np.diff(row_a[order]), np.diff(row_b[order])
        if np.any((gap_a <= 2 * tolerance) & ~((gap_a == 0) & (gap_b == 0))):
            return False
    return True


def _assert_same_result(alone, together, seed: int) -> None:
    """``together`` (a seed of a batched trial) computed what ``alone`` (its lone trial) did: every saved
    per-example value within its set's tolerance, every continuous metric within it, and every rank or
    threshold metric exactly where the scores it reads are separated by more than it (elsewhere the order of
    near ties is float rounding, the same on no two CPUs, and the per-example check is what is meaningful)."""
    import numpy as np

    assert alone.predictions.keys() == together.predictions.keys()
    for name, table in alone.predictions.items():
        other, tolerance = together.predictions[name], _tolerance(name)
        assert list(other.columns) == list(table.columns) and (other["label"] == table["label"]).all()
        assert (other["n_samples"] == table["n_samples"]).all(), (seed, name)
        values = [c for c in table.select_dtypes("float").columns if c != "n_samples"]
        others = [c for c in table.columns if c not in values]
        assert other[others].equals(table[others]), (seed, name)
        difference = np.abs(other[values].to_numpy() - table[values].to_numpy()).max()
        assert difference <= tolerance, (seed, name, difference)
    a, b = _metrics(alone), _metrics(together)
    assert a.keys() == b.keys()
    for (eval_set, metric), value in a.items():
        if metric in CONTINUOUS_METRICS:
            assert b[eval_set, metric] == pytest.approx(value, rel=1e-4, abs=_tolerance(eval_set)), (
                seed,
                eval_set,
                metric,
            )
            continue
        names = _partner(eval_set, alone.predictions)
        if _separated(
            [alone.predictions[n] for n in names], [together.predictions[n] for n in names], _tolerance(eval_set)
        ):
            assert b[eval_set, metric] == pytest.approx(value, rel=1e-9, abs=1e-12), (seed, eval_set, metric)
    stats_alone, stats_together = json.loads(alone.record["method_stats"]), json.loads(together.record["method_stats"])
    assert stats_together.keys() == stats_alone.keys()
    for key, value in stats_alone.items():  # counts exactly; chain diagnostics (R̂, ESS) of near-equal draws
        assert stats_together[key] == pytest.approx(value, rel=1e-4), (seed, key)


@contextmanager
def lone_loops():
    """Every method's unbatched loop, as for a network too large to batch: deep ensembles train member
    after member, SG-MCMC runs its chains in turn."""
    import ursa_ray.methods.batched as batched_module
    import ursa_ray.methods.ensemble as ensemble_module
    import ursa_ray.methods.sgmcmc as sgmcmc_module

    with pytest.MonkeyPatch.context() as patch:
        for module in (batched_module, ensemble_module, sgmcmc_module):
            patch.setattr(module, "can_batch", lambda model, problem: False)
        yield


LONE_LOOPS = {"deep_ensemble", "sghmc"}
"""Methods whose lone trial would otherwise also train batched (its members or chains side by side)."""


@pytest.mark.parametrize(
    ("method", "hyperparameters"),
    [
        ("sgd", {}),
        ("deep_ensemble", {"n_samples": 3, "bootstrap": True, "adversarial_epsilon": 0.02}),
        ("sgld", {"burn_in_epochs": 1, "n_samples": 4}),
        ("sghmc", {"burn_in_epochs": 1, "n_samples": 4, "n_chains": 2}),
        ("swag", {"swa_epochs": 3, "rank": 2, "n_samples": 3}),
        ("swa", {"swa_epochs": 2, "swa_collect_every": 5}),
        ("pca_ess", {"swa_epochs": 3, "rank": 2, "n_samples": 3, "ess_burn_in": 1}),
        ("laplace", {"n_samples": 3}),
        ("bdk", {"burn_in_epochs": 1, "distill_every": 2}),
        ("gped", {"burn_in_epochs": 1}),
    ],
)
@pytest.mark.slow
def test_four_batched_seeds_give_each_seed_its_metrics_alone(method, hyperparameters, stream_calls):
    """Each seed of a batched trial computes what its lone trial computes (:func:`_assert_same_result`:
    test, OOD, corruption, attacked and float16-stored sets), and the seeds differ from each other.  The
    lone trial of ``deep_ensemble`` and of ``sghmc`` with chains runs the unbatched loop (members and chains
    one after another), so the batched loop is held against it, not against itself."""
    specs = [dataclasses.replace(spec, save_predictions=True) for spec in _specs(method, hyperparameters)]
    batched = run_trials_batched(specs)
    assert all(together for _, together in stream_calls) and sum(n for n, _ in stream_calls) == 4  # batched
    for spec, together in zip(specs, batched, strict=True):
        stream_calls.clear()
        with lone_loops() if method in LONE_LOOPS else nullcontext():
            alone = run_trial(spec)
        assert stream_calls == [(1, False)]
        _assert_same_result(alone, together, spec.seed)
    nll = [_metrics(o)[("test", "nll")] for o in batched]
    assert len(set(nll)) == 4


def test_batched_mc_dropout_trains_each_seed_with_its_own_masks():
    """MC dropout's masks come from torch's generator, so batched seeds match their unbatched runs in
    distribution, not value: each seed trains, and the seeds' predictives differ."""
    specs = _specs("mc_dropout", {"p": 0.2, "n_samples": 4}, seeds=(0, 1))
    batched = run_trials_batched(specs)
    alone = [run_trial(spec) for spec in specs]
    for b, a in zip(batched, alone, strict=True):
        assert _metrics(b)[("test", "accuracy")] == pytest.approx(_metrics(a)[("test", "accuracy")], abs=0.1)
        assert _metrics(b)[("test", "accuracy")] > 0.5
    assert _metrics(batched[0])[("test", "nll")] != _metrics(batched[1])[("test", "nll")]


def test_one_stacked_copy_trains_exactly_as_the_plain_network():
    """The batched SGD path (vmap over a (C, P) parameter tensor) against the plain nn.Module loop."""
    from small_problems import regression_problem

    from ursa_ray.methods._training import train_sgd
    from ursa_ray.methods.batched import train_sgd_copies

    config = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3, "epochs": 5, "batch_size": 16, "schedule": "cosine"}
    plain_problem = regression_problem(seed=3)
    plain = train_sgd(plain_problem.make_model(), plain_problem, config, {})
    copy_problem = regression_problem(seed=3)  # the same initialisation and mini-batch order
    stacked = StackedNetworks([copy_problem.make_model()])
    data = CopyData.from_problems([copy_problem], [copy_problem.generator], [None])
    train_sgd_copies(stacked, data, copy_problem.likelihood, config)
    torch.testing.assert_close(flat_parameters(stacked.models[0]), flat_parameters(plain), rtol=1e-5, atol=1e-6)


def test_copies_have_independent_minibatch_and_noise_streams():
    problem, _, _ = make_blr_problem(seed=0)
    generators = copy_generators(problem, 4)
    data = CopyData.from_problems([problem] * 4, generators, [None] * 4)
    orders = torch.stack([torch.randperm(problem.n_train, generator=copy.deepcopy(g)) for g in generators]).double()
    corr = torch.corrcoef(orders)
    off_diagonal = corr[~torch.eye(4, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 4 / problem.n_train**0.5
    xb, _ = next(data.minibatches(32))
    assert len({tuple(xb[c, :, 0].tolist()) for c in range(4)}) == 4  # four different mini-batches

    # the Langevin noise of two chains from one identical state, with the same full batch: the increments
    # differ from the noise-free step by independent draws
    torch.manual_seed(0)
    model = build_mlp((64,), 10, [32])
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    from ursa_ray.methods.base import Categorical, Problem

    digits_like = Problem(
        x, y, Categorical(), lambda: copy.deepcopy(model), torch.Generator().manual_seed(1), torch.device("cpu")
    )
    config = resolve_config(get_method("sgld"), {"prior_std": 1.0})
    chains = LangevinCopies(
        [copy.deepcopy(model) for _ in range(3)], copy_generators(digits_like, 3), digits_like, config, momentum=False
    )
    start = chains.stacked.theta.detach().clone()
    xs, ys = x.expand(3, *x.shape), y.expand(3, *y.shape)
    noise_free = LangevinCopies([copy.deepcopy(model)], [torch.Generator()], digits_like, config, momentum=False)
    noise_free.step(xs[:1], ys[:1], lr=0.5, noisy=False)
    chains.step(xs, ys, lr=0.5, noisy=True)
    drawn = chains.stacked.theta.detach() - start - (noise_free.stacked.theta.detach() - start[:1])
    assert drawn.std(1).min() > 0  # noise was added to every chain
    corr = torch.corrcoef(drawn)
    off_diagonal = corr[~torch.eye(3, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 4 / drawn.shape[1] ** 0.5


@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_each_chain_of_a_batched_run_samples_its_exact_posterior(name):
    """Four seeds of the Bayesian-linear-regression fixture (each its own data and exact posterior), one
    chain each, sampled as one batched run: every chain's marginal stds match its own posterior's."""
    fixtures = [make_blr_problem(prior_std=PRIOR_STD, seed=seed) for seed in range(4)]
    problems = [f[0] for f in fixtures]
    settings = {
        "sgld": dict(eta_lambda=0.08, batch_size=128, epochs=1100, burn_in_epochs=100, n_samples=500),
        "sghmc": dict(
            eta_lambda=0.03,
            alpha=0.3,
            schedule="constant",
            batch_size=128,
            epochs=900,
            burn_in_epochs=100,
            n_samples=400,
        ),
    }[name]
    eta_lambda = settings.pop("eta_lambda")
    lr = min(lr_for(eta_lambda, cov) for _, _, cov in fixtures)
    method = get_method(name)
    config = resolve_config(method, {"prior_std": PRIOR_STD, "lr": lr, **settings})
    stats = [{} for _ in problems]
    draws = [[] for _ in problems]
    for item in method.sample_posterior_batched(problems, config, stats):
        for rows, predictor in zip(draws, item, strict=True):
            rows.append(flat_parameters(predictor).double())
    for rows, (_, _, cov) in zip(draws, fixtures, strict=True):
        assert len(rows) == settings["n_samples"]
        assert_spread(torch.stack(rows), cov, tol=0.25)


def _chain_stats(name: str, **settings) -> dict[str, float]:
    problem, _, cov = make_blr_problem(prior_std=PRIOR_STD, seed=0, init_std=settings.pop("init_std", 1.0))
    lr = lr_for(settings.pop("eta_lambda"), cov)
    method = get_method(name)
    config = resolve_config(method, {"prior_std": PRIOR_STD, "lr": lr, **settings})
    stats: dict[str, float] = {}
    samples = list(method.sample_posterior(problem, config, stats))
    assert len(samples) == stats["n_samples"] == settings["n_chains"] * settings["n_samples"]
    return stats


def test_rhat_is_near_one_for_chains_on_the_exact_posterior_and_large_for_unmixed_chains():
    mixed = _chain_stats(
        "sgld", eta_lambda=0.2, batch_size=128, epochs=850, burn_in_epochs=50, n_samples=200, n_chains=4
    )
    assert mixed["n_chains"] == 4
    assert mixed["rhat_max"] < 1.06 and mixed["ess_bulk_min"] > 100
    # started far apart (weights drawn with std 30 around the posterior's ~0.03) and stopped early
    unmixed = _chain_stats(
        "sgld", eta_lambda=0.002, batch_size=128, epochs=6, burn_in_epochs=1, n_samples=10, n_chains=4, init_std=30.0
    )
    assert unmixed["rhat_max"] > 1.1


def test_default_copy_count_keeps_memory_in_bounds():
    small = build_mlp((784,), 10, [200, 200])
    assert max_copies(small, batch_size=128, input_numel=784) >= 50
    wide = build_mlp((784,), 10, [4096, 4096])
    assert max_copies(wide, batch_size=128, input_numel=784) < max_copies(small, 128, 784)


def test_what_a_seed_keeps_beside_its_network_limits_the_seeds_batched_together():
    """SWAG's moments and a Laplace posterior count in the memory cap: a full Laplace covariance over all
    weights of the E.1 MLP (P² numbers) batches one seed at a time, last-layer KFAC batches many."""
    e1 = build_mlp((1,), 1, [100, 100, 100])
    cap = max_copies(e1, batch_size=32, input_numel=1)
    laplace = get_method("laplace")
    full = resolve_config(
        laplace, {"subset_of_weights": "all", "hessian_structure": "full", "optimize_prior_precision": "none"}
    )
    assert cap // laplace.batched_copies(full, e1) == 0  # the trial batches max(1, 0) = 1 seed at a time
    assert cap // laplace.batched_copies(resolve_config(laplace, {}), e1) >= 50
    swag = get_method("swag")
    assert swag.batched_copies(resolve_config(swag, {"rank": 20}), e1) == 1 + 6  # ⌈(4 + 20) / 4⌉
    assert swag.batched_copies(resolve_config(swag, {"rank": 20}), e1) > swag.batched_copies(
        resolve_config(swag, {"rank": 2}), e1
    )


def _digits_like_problems(n_problems: int, float32_output: bool = False) -> list:
    """Problems of 256 random 64-feature inputs, 10 classes: each its own data and stream, and a
    ``make_model`` whose k-th call draws the k-th initialisation of its problem (as a trial's own init
    stream), so a lone run and a batched run build the same networks.  ``float32_output``: the output layer
    made :class:`~ursa_ray.evaluation.precision.Float32Linear`, as on a GPU."""
    from ursa_ray.evaluation.precision import keep_output_layer_float32
    from ursa_ray.methods.base import Categorical, Problem

    problems = []
    for seed in range(n_problems):
        data = torch.Generator().manual_seed(100 + seed)
        x, y = torch.randn(256, 64, generator=data), torch.randint(0, 10, (256,), generator=data)
        calls = iter(range(10**6))

        def make_model(seed=seed, calls=calls):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1000 * seed + next(calls))
                model = build_mlp((64,), 10, [32])
            return keep_output_layer_float32(model, 10) if float32_output else model

        problems.append(
            Problem(x, y, Categorical(), make_model, torch.Generator().manual_seed(seed), torch.device("cpu"))
        )
    return problems


def test_batched_gped_with_the_float32_output_layer_runs_batched_and_matches_each_lone_student():
    """A GPU trial makes the output layer a Float32Linear.  The stacked MLP still takes the batched-matrix
    path (it used to fall back to ``vmap``, and GPED's ``forward_with_features`` raised after the whole
    teacher burn-in, every seed then rerun alone), and each batched student equals its lone one."""
    from ursa_ray.evaluation.precision import Float32Linear

    stacked = StackedNetworks([p.make_model() for p in _digits_like_problems(2, float32_output=True)])
    assert isinstance(stacked.template[-1], Float32Linear)
    assert stacked._layers is not None  # the plain (batched matrix product) path, not vmap
    x = torch.randn(2, 5, 64)
    outputs, features = stacked.forward_with_features(x)
    for c, model in enumerate(stacked.models):
        torch.testing.assert_close(outputs[c], model(x[c]))
        torch.testing.assert_close(features[c], model[:-1](x[c]))

    method = get_method("gped")
    config = resolve_config(method, {"epochs": 3, "burn_in_epochs": 1, "batch_size": 64})
    problems = _digits_like_problems(2, float32_output=True)
    (students,) = list(method.sample_posterior_batched(problems, config, [{}, {}]))
    for problem, student in zip(_digits_like_problems(2, float32_output=True), students, strict=True):
        (alone,) = list(method.sample_posterior(problem, config, {}))
        torch.testing.assert_close(flat_parameters(student), flat_parameters(alone), rtol=1e-4, atol=1e-5)


def test_features_of_a_network_that_is_not_a_plain_mlp_come_through_vmap():
    """``forward_with_features`` of a network the batched matrix path does not cover (here a LayerNorm):
    every copy's outputs and output-layer inputs, as the copy's own module computes them."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(3)]
    stacked = StackedNetworks(models)
    assert stacked._layers is None
    x = torch.randn(3, 4, 6)
    outputs, features = stacked.forward_with_features(x)
    for c, model in enumerate(models):
        torch.testing.assert_close(outputs[c], model(x[c]))
        torch.testing.assert_close(features[c], model[:-1](x[c]))


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        (
            "deep_ensemble",
            {"n_samples": 3, "bootstrap": True, "adversarial_epsilon": 0.02, "epochs": 2, "batch_size": 64},
        ),
        ("sghmc", {"n_chains": 2, "n_samples": 3, "epochs": 3, "burn_in_epochs": 1, "batch_size": 64}),
    ],
)
def test_the_lone_loop_draws_what_the_batched_copies_draw(name, settings):
    """The unbatched loop (a network too large to batch: members, or chains, one after another) against
    the batched copies on the same problem: the same samples, member by member and chain by chain (the
    batched stream yields chain 1's then chain 2's sample at each sampling step, the lone loop chain 1's
    samples, then chain 2's).  Catches a lone loop that draws its bootstrap resample or mini-batch order
    from the problem's stream instead of the member's own (the old ensemble loop), or skips the
    adversarial term."""
    method = get_method(name)
    config = resolve_config(method, settings)
    (problem,) = _digits_like_problems(1)
    batched_stats: dict[str, float] = {}
    batched = [
        flat_parameters(m).clone() for (m,) in method.sample_posterior_batched([problem], config, [batched_stats])
    ]
    (problem,) = _digits_like_problems(1)
    lone_stats: dict[str, float] = {}
    with lone_loops():
        lone = [flat_parameters(m).clone() for m in method.sample_posterior(problem, config, lone_stats)]
    if name == "sghmc":  # step-major (batched) against chain-major (lone)
        chains, per_chain = settings["n_chains"], settings["n_samples"]
        batched = [batched[s * chains + c] for c in range(chains) for s in range(per_chain)]
    assert len(lone) == len(batched) == lone_stats["n_samples"] == batched_stats["n_samples"]
    for a, b in zip(lone, batched, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert lone_stats["grad_evals"] == batched_stats["grad_evals"]
    assert not torch.allclose(lone[0], lone[-1])  # members (chains) differ
