"""Mixed-precision training (``Problem.training_precision`` = bfloat16): the network body under bfloat16
autocast, parameters, optimiser and sampler state and injected noise in float32 master weights.

The same autocast runs on the CPU here.  The Bayesian-linear-regression problem of ``exact_blr.py`` is a
single linear layer; it is *not* kept float32 here, so the whole network (inputs, weights, outputs) runs
in bfloat16 -- a harder test than a trial's, whose output layer stays float32.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import scipy.stats
import torch
from exact_blr import batch_means_mcse, make_blr_problem
from test_hmc import draw as hmc_draw
from test_sgmcmc import CHAINS, N_TRAIN, PRIOR_STD, assert_spread, draw, exact_gradients, lr_for, without_numba  # noqa: F401
from torch import nn

from ursa_ray.methods import get_method, swag
from ursa_ray.methods._training import (
    PRECISIONS,
    autocast_body,
    autocast_dtype,
    default_precision,
    optimiser_options,
    train_sgd,
)
from ursa_ray.methods.base import Gaussian, Problem, flat_parameters, resolve_config
from ursa_ray.methods.batched import StackedNetworks
from ursa_ray.methods.sgmcmc import LangevinChain

BF16 = torch.bfloat16


def mixed(problem: Problem) -> Problem:
    return dataclasses.replace(problem, training_precision=BF16)


def test_precision_names_and_defaults():
    assert PRECISIONS == ("bf16-mixed", "float32")
    assert autocast_dtype("bf16-mixed") is BF16 and autocast_dtype("float32") is None
    with pytest.raises(ValueError, match="precision must be one of"):
        autocast_dtype("float16")
    assert default_precision(torch.device("cuda", 0), "classification") == "bf16-mixed"
    assert default_precision(torch.device("cuda", 0), "regression") == "float32"
    assert default_precision(torch.device("cpu"), "classification") == "float32"
    assert optimiser_options(torch.device("cuda", 0)) == {"fused": True}
    assert optimiser_options(torch.device("cpu")) == {}
    problem, _, _ = make_blr_problem()
    with pytest.raises(ValueError, match="training_precision"):
        dataclasses.replace(problem, training_precision=torch.float16)


def test_autocast_body_computes_the_body_in_bfloat16_and_nothing_without_it():
    layer = nn.Linear(4, 3)
    x = torch.randn(5, 4)
    with autocast_body(torch.device("cpu"), BF16):
        assert layer(x).dtype is BF16
    with autocast_body(torch.device("cpu"), None):
        assert layer(x).dtype is torch.float32


def output_dtypes(problem: Problem) -> tuple[Problem, list[torch.dtype]]:
    """``problem`` whose models record the dtype of every forward pass's output."""
    seen: list[torch.dtype] = []
    build = problem.make_model

    def make_model() -> nn.Module:
        model = build()
        model.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
        return model

    return dataclasses.replace(problem, make_model=make_model), seen


@pytest.mark.parametrize("name", ["sgd", "sgld", "sghmc", "swag", "deep_ensemble", "bdk"])
def test_every_loop_trains_under_bfloat16_with_float32_parameters(name):
    """Each of these methods' training forward passes runs under the autocast (the output's dtype is
    bfloat16) and its parameters stay float32.  Catches a loop that ignores ``training_precision``."""
    problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD)
    if name == "deep_ensemble":  # an augmentation keeps the members off the batched path (batched.py)
        problem = dataclasses.replace(problem, augment=lambda x, generator: x)
    problem, seen = output_dtypes(mixed(problem))
    method = get_method(name)
    declared = {h.name for h in method.hyperparameters}
    overrides = {"epochs": 2, "batch_size": 128} | ({"n_samples": 1} if "n_samples" in declared else {})
    if name in ("sgld", "sghmc", "bdk"):  # bdk: the SGLD teacher and the student's steps
        overrides |= {"burn_in_epochs": 1, "lr": lr_for(0.03, cov), "prior_std": PRIOR_STD}
    elif name == "swag":
        overrides |= {"swa_epochs": 2, "lr": 1e-3, "swa_lr": 1e-3}
    else:
        overrides |= {"lr": 1e-3}
    config = resolve_config(method, overrides)
    for predictor in method.sample_posterior(problem, config, {}):
        assert all(p.dtype is torch.float32 for p in predictor.parameters())
    assert seen and set(seen) == {BF16}, seen


def test_sngp_trains_its_body_under_bfloat16_and_its_gp_layer_in_float32():
    """SNGP's loop honours ``training_precision``: the spectral-normalised hidden layer's forward passes are
    bfloat16, the GP output layer's float32 (its forward disables the autocast), every parameter float32."""
    from small_problems import regression_problem

    from ursa_ray.methods.sngp import RandomFeatureGP

    problem = mixed(regression_problem())
    hidden: list[torch.dtype] = []
    gp_outputs: list[torch.dtype] = []
    build = problem.make_model

    def make_model() -> nn.Module:
        model = build()
        first = next(m for m in model.modules() if isinstance(m, nn.Linear))
        first.register_forward_hook(lambda m, args, out: hidden.append(out.dtype))
        return model

    method = get_method("sngp")
    config = resolve_config(method, {"epochs": 2, "batch_size": 16, "n_features": 32, "n_samples": 2})
    (predictor, *_) = method.sample_posterior(dataclasses.replace(problem, make_model=make_model), config, {})
    gp = next(m for m in predictor.modules() if isinstance(m, RandomFeatureGP))
    gp.register_forward_hook(lambda m, args, out: gp_outputs.append(out.dtype))
    assert hidden and set(hidden) == {BF16}, hidden  # training passes (the hook sees no evaluation yet)
    assert all(p.dtype is torch.float32 for p in predictor.parameters())
    with autocast_body(torch.device("cpu"), BF16):
        predictor(problem.x[:4])
    assert gp_outputs == [torch.float32]


@pytest.mark.parametrize("name", ["sgld", "swag"])
def test_batched_copies_train_under_bfloat16(monkeypatch, name):
    """Batched copies (``StackedNetworks``): two SGLD chains (``LangevinCopies``) and two seeds' SWAG
    collection phase (``fit_swa_copies``) run their stacked forward passes under the autocast."""
    seen: list[torch.dtype] = []
    forward = StackedNetworks.__call__

    def recording(self, x):
        out = forward(self, x)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(StackedNetworks, "__call__", recording)
    method = get_method(name)
    if name == "sgld":
        problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD)
        config = resolve_config(
            method,
            {
                "epochs": 2,
                "burn_in_epochs": 1,
                "n_samples": 1,
                "n_chains": 2,
                "lr": lr_for(0.03, cov),
                "prior_std": PRIOR_STD,
            },
        )
        list(method.sample_posterior(mixed(problem), config, {}))
        assert seen and set(seen) == {BF16}, seen
    else:
        problems = [mixed(make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=s)[0]) for s in (0, 1)]
        config = resolve_config(method, {"epochs": 1, "swa_epochs": 2, "n_samples": 1, "lr": 1e-3, "swa_lr": 1e-3})
        swag.fit_swa_copies(problems, config, [{}, {}], max_rank=2)
        assert seen and set(seen) == {BF16}, seen  # the burn-in (train_sgd_copies) and the collection phase


def test_float32_problem_trains_in_float32():
    problem, _, _ = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD)
    problem, seen = output_dtypes(problem)
    train_sgd(problem.make_model(), problem, resolve_config(get_method("sgd"), {"epochs": 1, "lr": 1e-3}), {})
    assert seen and set(seen) == {torch.float32}


# --- the injected noise lands on float32 master weights ----------------------------------------------


def noise_problem(make_model) -> Problem:
    """A regression problem on d = 2000 inputs whose model is a linear layer with every weight at 1.0."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2000, generator=generator)
    return Problem(
        x,
        torch.randn(64, generator=generator),
        Gaussian(1.0),
        make_model,
        generator,
        torch.device("cpu"),
        training_precision=BF16,
    )


def ones_linear(dtype: torch.dtype = torch.float32) -> nn.Module:
    model = nn.Linear(2000, 1).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    return model


def one_step_movement(problem: Problem, momentum: bool) -> torch.Tensor:
    """θ₁ − θ₀ (float64) of one SGLD or SGHMC step with noise σ = 10⁻⁴ and a negligible gradient term:
    η = 10⁻¹² on U (lr = η·N) and T = 5·10³, so √(2αηT) = 10⁻⁴ (α = 1 for SGHMC, whose velocity starts at 0
    and takes the whole noise in its first step), while η‖∇U‖ ≈ 10⁻⁹."""
    config = {"prior_std": 1.0, "temperature": 5e3, "alpha": 1.0}
    chain = LangevinChain(problem.make_model(), problem, config, momentum=momentum)
    before = chain.flat.theta.double().clone()
    chain.model.train()
    chain.step(problem.x, problem.y, lr=1e-12 * problem.n_train)
    return chain.flat.theta.double() - before


@pytest.mark.parametrize("momentum", [False, True], ids=["sgld", "sghmc"])
def test_noise_far_below_bfloat16_resolution_moves_the_float32_master_weights(momentum):
    """Weights of magnitude 1 and noise of scale 10⁻⁴: bfloat16's spacing at 1 is 2⁻⁷ ≈ 0.008, so the
    noise rounds away on bfloat16 weights (shown first); under the mixed path the float32 master weights
    move by it, with the right spread (2001 draws: std within 10 %)."""
    ones = torch.ones(2001, dtype=BF16)
    assert torch.equal(ones + 1e-4 * torch.randn(2001).to(BF16), ones)  # bf16 weights would not move
    movement = one_step_movement(noise_problem(ones_linear), momentum)
    assert movement.abs().min() > 0, "some master weights did not move"
    assert abs(movement.std().item() / 1e-4 - 1) < 0.1, movement.std().item()


def test_master_weight_check_fails_on_bfloat16_weights(without_numba):  # noqa: F811
    """Mutation: the same step on a network converted to bfloat16 (noise added to bfloat16 weights, torch's
    generator: the numba kernel refuses bfloat16) leaves the weights where they were, and the check above
    fails."""
    movement = one_step_movement(noise_problem(lambda: ones_linear(BF16)), momentum=False)
    assert torch.equal(movement, torch.zeros_like(movement))
    with pytest.raises(AssertionError):
        assert movement.abs().min() > 0


# --- injected-noise variance ÷ 2αηT under the mixed path ---------------------------------------------


@pytest.mark.parametrize("name,friction", [("sgld", 1.0), ("sghmc", 0.3)])
def test_one_step_noise_variance_under_bfloat16_is_2_alpha_eta_T(name, friction):
    """θ₁ − θ₀ + η∇U(θ₀) = √(2αηT)·ξ (full batch, v₀ = 0) with the body in bfloat16: the 200 seeds' 1000
    standardised residuals have mean 0 and variance 1 within Monte Carlo error (two-sided 0.1 % bounds of
    the χ² distribution of the sample variance; the bfloat16 gradient's error moves it by about 10⁻³)."""
    seeds, starts, ends = 200, [], []
    for seed in range(seeds):
        problem, _, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=seed)
        made = []

        def make_model(inner=problem.make_model):
            model = inner()
            made.append(flat_parameters(model).double().clone())
            return model

        problem = mixed(dataclasses.replace(problem, make_model=make_model))
        extra = {"alpha": friction, "schedule": "constant"} if name == "sghmc" else {}
        samples, _ = draw(
            name, problem, lr=lr_for(0.03, cov), batch_size=N_TRAIN, epochs=1, burn_in_epochs=0, n_samples=1, **extra
        )
        starts.append(made[0])
        ends.append(samples[0])
    theta0, theta1 = torch.stack(starts), torch.stack(ends)
    grads, etas = exact_gradients(seeds, theta0)
    values = ((theta1 - theta0 + etas[:, None] * grads) / torch.sqrt(2 * friction * etas)[:, None]).flatten()
    n = values.numel()
    low, high = (scipy.stats.chi2.ppf(q, n - 1) / (n - 1) for q in (0.0005, 0.9995))
    variance = values.var().item()
    assert low < variance < high, f"noise variance / 2αηT = {variance:.3f}, expected within [{low:.3f}, {high:.3f}]"
    assert abs(values.mean().item()) < 3.3 / math.sqrt(n)


# --- exact posterior under the mixed path -------------------------------------------------------------


@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_sgmcmc_samples_the_exact_posterior_under_bfloat16(name):
    """``tests/test_sgmcmc.py``'s chains (a third as long: 700 epochs, 300 samples) and checks with the body
    in bfloat16: marginal stds within 20 % of the exact ones, the chain's mean within 3.5 Monte Carlo
    standard errors of the exact mean."""
    problem, mean, cov = make_blr_problem(n=N_TRAIN, prior_std=PRIOR_STD, seed=0)
    settings = dict(CHAINS[name], epochs=700, n_samples=300)
    lr = lr_for(settings.pop("eta_lambda"), cov)
    samples, stats = draw(name, mixed(problem), lr=lr, **settings)
    assert stats["n_samples"] == len(samples) == settings["n_samples"]
    assert_spread(samples, cov, tol=0.2)
    mcse = batch_means_mcse(samples, n_batches=20)
    z = (samples.mean(0) - mean) / mcse
    assert (z.abs() < 3.5).all(), f"(mean − exact) / MCSE = {z.tolist()}"


def test_hmc_ignores_the_mixed_precision_setting():
    """HMC stays float32 on a bfloat16 problem (its module docstring says why: under bfloat16 autocast its
    chain on this problem shrank ε to 10⁻⁴ and its stds to 1–3 % of the exact ones): the potential's
    network computes in float32 and the chain is the float32 chain, draw for draw."""
    settings = dict(step_size=1e-3, n_leapfrog=2, burn_in=20, n_samples=20, step_jitter=0.2)
    problem, _, _ = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)
    reference, _ = hmc_draw(problem, **settings)
    problem, seen = output_dtypes(mixed(make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)[0]))
    samples, _ = hmc_draw(problem, **settings)
    assert seen and set(seen) == {torch.float32}
    assert torch.equal(samples, reference)


# --- benchmarks/gpu_check.py's part 5 runs ----------------------------------------------------------------


@pytest.mark.slow
def test_gpu_check_cpu_smoke_runs_every_part_of_issue_33():
    """``gpu_check.py --cpu-smoke`` (part 5 at tiny sizes on the CPU, CUDA hidden) exits 0 and prints every
    figure the GPU run reports: a step time with its MFU for each network × precision × method, the
    SG-MCMC ÷ SGD ratios, the speed-ups and the concurrency figures.  Catches a part that raises or a figure
    left out.  (Takes 30-60 s on an idle 2-core machine.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_check.py"), "--cpu-smoke"],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=root,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert not [line for line in out.splitlines() if line.startswith("FAIL")], out[-3000:]
    assert "SUMMARY: 3 PASS, 0 FAIL" in out, out[-3000:]
    for label in ("ResNet50 (width 1)", "WRN-10-1"):
        for precision in ("float32", "bf16-mixed"):
            for method in ("sgd", "sgld", "sghmc", "swag_collection", "ensemble_member"):
                assert f"step {label} batch 4 {precision:10s} {method:16s}" in out, (label, precision, method)
            assert f"ratio {label} {precision}: SGLD ÷ SGD" in out
        assert f"speed-up {label} sgld: float32 ÷ bf16-mixed" in out
    assert "MFU n/a" in out and "MFU denominator" in out
    assert "concurrency: 2 trials sgd/mlp/e1" in out and "throughput gain" in out
    assert "smoke (not judged)" in out
    # torch.compile of WRN-10-1's step (backend "eager": dynamo traces the network, generates no code)
    assert "SKIP  torch.compile WRN-10-1" not in out, out[-3000:]
    graphs = re.search(r"compile WRN-10-1 bf16-mixed sgld \(eager\): compiling epoch [\d.]+ s .*, (\d+) graphs", out)
    assert graphs and int(graphs[1]) >= 1, out[-3000:]
    assert "compile WRN-10-1 bf16-mixed sgld: compiled " in out and "eager ÷ compiled" in out
    assert "compile WRN-10-1 verdict: not decided (one repeat" in out and "compiles within the bound" in out
    assert "SKIP  torch.compile ResNet50 (width 1): not in the sizes' compiled models" in out


def test_compile_verdict_helps_only_beyond_the_repeat_spread_and_within_the_bound(monkeypatch):
    """gpu_check's verdict on ``torch.compile`` (hand cases, per-step seconds of 3 repeats): "helps" only
    when the best compiled step beats the best eager one by more than the larger max − min of the repeats;
    a compile over the bound says so and rules the grid option out; one repeat decides nothing."""
    import importlib.util
    import sys
    from pathlib import Path

    monkeypatch.setattr(sys, "path", list(sys.path))  # gpu_check prepends tests/ and benchmarks/
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)
    spec.loader.exec_module(gpu_check)
    verdict = gpu_check.compile_verdict
    eager = [0.0100, 0.0102, 0.0101]  # spread 0.2 ms
    faster = [0.0080, 0.0081, 0.0085]  # 2.0 ms faster, spread 0.5 ms
    assert verdict(10, 300, eager, faster) == (
        "helps: compiled faster by 2.00 ms a step, more than the spread 0.50 ms; "
        "compiles within the bound (10.0 s <= 300 s): a grid option is worth building"
    )
    noisy = [0.0096, 0.0097, 0.0101]  # 0.4 ms faster, spread 0.5 ms
    assert verdict(10, 300, eager, noisy).startswith("does not help: compiled faster by +0.40 ms a step, not more")
    assert verdict(10, 300, eager, noisy).endswith(": no grid option")
    slower = [0.0110, 0.0111, 0.0112]
    assert verdict(10, 300, eager, slower).startswith("does not help: compiled faster by -1.00 ms")
    too_slow = verdict(301, 300, eager, faster)
    assert too_slow.startswith("helps") and "NOT within the bound (301.0 s > 300 s): no grid option" in too_slow
    assert verdict(10, 300, eager[:1], faster[:1]).startswith("not decided (one repeat")


# --- the grid key ``precision`` ----------------------------------------------------------------------------


def test_grid_precision_reaches_the_problem_and_the_trial_record():
    """``precision`` in a grid: checked before any trial (one line naming the field and what is allowed),
    carried by every trial spec, part of a trial's id only when set (grids without it keep their ids), put
    on the trial's ``Problem`` and recorded (the ``precision`` column of trials.parquet); absent, a CPU trial
    trains in float32.  Catches the key dropped anywhere between the grid file and the trials table."""
    import pyarrow as pa

    from ursa_ray.grid import GridError, parse_grid
    from ursa_ray.results import TRIAL_SCHEMA
    from ursa_ray.trial import TrialRun, run_trial

    raw = {
        "name": "precision",
        "methods": ["sgd"],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": [{"name": "e1", "complexity": [1]}],
        "seeds": [0],
        "budget": {"epochs": 1},
    }
    with pytest.raises(GridError, match=r"^<grid>: precision: expected one of bf16-mixed, float32, got 'fp16'$"):
        parse_grid({**raw, "precision": "fp16"})
    specs = {p: parse_grid({**raw, "precision": p} if p else raw).trial_specs()[0] for p in (None, *PRECISIONS)}
    assert [spec.precision for spec in specs.values()] == [None, "bf16-mixed", "float32"]
    assert len({spec.trial_id for spec in specs.values()}) == 3
    cpu = torch.device("cpu")
    assert TrialRun(specs["bf16-mixed"], cpu).problem.training_precision is BF16
    assert TrialRun(specs[None], cpu).problem.training_precision is None
    assert run_trial(specs["bf16-mixed"], cpu).record["precision"] == "bf16-mixed"
    assert run_trial(specs[None], cpu).record["precision"] == "float32"
    column = pa.Table.from_pylist([{"trial_id": "t", "precision": "bf16-mixed"}], schema=TRIAL_SCHEMA)["precision"]
    assert column.to_pylist() == ["bf16-mixed"]
