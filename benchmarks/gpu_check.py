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
   three comparisons on the device, and E.1 copies per batched step up to 20,000 with their throughput).
4. Ray, where it is installed (a GPU machine without the package index may lack it: its wheel is too
   large to carry there): the quickstart grid, every method but seed 0 only (24 trials, 56 s on a 2-core
   CPU), with ``gpu: 0.25`` per trial through ``run_grid`` (what ``ursa-ray run`` calls) on
   ray.init(num_cpus=4, num_gpus=1); the trials that ran (also when the part times out), failures with
   their errors, and the ``device`` column.

Without CUDA everything runs on the CPU to exercise the script (speed at N=6,000 as a smoke run) and the
GPU-only checks print SKIP.  A watchdog ends the process after ``--deadline`` seconds (default 280), and
the Ray part is abandoned after ``--ray-timeout`` seconds.  Exit status 0 when nothing failed.

    python benchmarks/gpu_check.py [--quick]     # --quick: skip the Ray part
    PYTHONPATH=. python3 benchmarks/gpu_check.py  # where ursa-ray is not installed (a lent GPU machine)
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
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

import torch  # noqa: E402

import bench_corruptions  # noqa: E402
import bench_samplers as bench  # noqa: E402
import test_sgmcmc as sg  # noqa: E402
from exact_blr import batch_means_mcse, make_blr_problem  # noqa: E402
from test_hmc import PRIOR_STD as HMC_PRIOR_STD, draw as hmc_draw  # noqa: E402
from ursa_ray import trial as trial_module  # noqa: E402
from ursa_ray.grid import load_grid  # noqa: E402
from ursa_ray.methods import get_method  # noqa: E402
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise  # noqa: E402
from ursa_ray.methods.base import Categorical, Gaussian, Problem, flat_parameters, resolve_config  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
RESULTS: list[tuple[str, bool]] = []
# test_hmc.chain(): 2 leapfrog steps of the adapted ε, 200 burn-in and 1000 sampling iterations
HMC_CHAIN = dict(step_size=1e-3, n_leapfrog=2, burn_in=200, n_samples=1000, step_jitter=0.2, temperature=1.0)
# the README's mixed-precision tolerances (bfloat16 body, float32 output layer): (absolute, relative)
BF16_TOLERANCE = {"accuracy": (0.01, 0), "nll": (0, 0.02), "ece": (0.01, 0), "brier": (0.01, 0),
                  "misclass_auroc_entropy": (0.01, 0), "misclass_auroc_mi": (0.002, 0),
                  "ood_auroc_entropy": (0.01, 0), "ood_auroc_mi": (0.002, 0)}


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
    ok = (len(samples) == settings["n_samples"] and bool(((ratio - 1).abs() < 0.2).all())
          and bool((mcse < 0.2 * cov.diag().sqrt()).all()) and bool((z.abs() < 3.5).all()))
    report(f"{name} vs exact BLR posterior on {DEVICE}", ok,
           f"std/exact {fmt(ratio)} (within 0.2), (mean-exact)/MCSE {fmt(z)} (|z| < 3.5), {len(samples)} samples")


def hmc_chain() -> None:
    problem, mean, cov = make_blr_problem(n=256, prior_std=HMC_PRIOR_STD, seed=0)
    samples, stats = hmc_draw(on_device(problem), **HMC_CHAIN)
    samples = samples.cpu()
    exact_std = cov.diag().sqrt()
    mcse = batch_means_mcse(samples)
    z = (samples.mean(0) - mean) / mcse
    ratio = samples.std(0) / exact_std
    ok = (bool((mcse < 0.1 * exact_std).all()) and bool((z.abs() < 3).all()) and bool(((ratio - 1).abs() < 0.1).all())
          and 0.7 < stats["accept_rate"] < 0.97 and stats["divergences"] == 0)
    report(f"hmc vs exact BLR posterior on {DEVICE}", ok,
           f"std/exact {fmt(ratio)} (within 0.1), (mean-exact)/MCSE {fmt(z)} (|z| < 3), "
           f"accept {stats['accept_rate']:.3f} (0.7-0.97), divergences {stats['divergences']:.0f}, "
           f"step {stats['step_size']:.4f}")


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
        samples, _ = sg.draw(name, dataclasses.replace(problem, make_model=make_model), lr=sg.lr_for(0.03, cov),
                             temperature=1.0, batch_size=sg.N_TRAIN, epochs=1, burn_in_epochs=0, n_samples=1, **extra)
        starts.append(made[0])
        ends.append(samples[0].cpu())
    theta0, theta1 = torch.stack(starts), torch.stack(ends)
    grads, etas = sg.exact_gradients(seeds, theta0)
    values = ((theta1 - theta0 + etas[:, None] * grads) / torch.sqrt(2 * friction * etas)[:, None]).flatten()
    mean, var = values.mean().item(), values.var().item()
    ok = abs(mean) < 3 / math.sqrt(values.numel()) and 0.75 < var < 1.25
    report(f"{name} one-step injected noise on {DEVICE}", ok,
           f"variance / 2αηT = {var:.3f} (0.75-1.25), mean {mean:+.3f} over {values.numel()} draws")


def gaussian_noise_direct(n: int = 1_000_000, sigma: float = 0.3) -> None:
    like = torch.empty(n, device=DEVICE)
    noise = GaussianNoise(like, torch.Generator().manual_seed(0))
    once = noise.add_to_(torch.zeros_like(like), sigma)
    twice = noise.add_to_(noise.add_to_(torch.zeros_like(like), sigma), sigma)  # two fresh draws: std σ√2
    std1, std2, mean1 = once.std().item() / sigma, twice.std().item() / (sigma * math.sqrt(2)), once.mean().item()
    ok = abs(std1 - 1) < 0.01 and abs(std2 - 1) < 0.01 and abs(mean1) < 5 * sigma / math.sqrt(n)
    ok = ok and once.device == like.device and (noise.bits == "torch") == CUDA
    report(f"GaussianNoise.add_to_ on {DEVICE} ({noise.bits})", ok,
           f"std/σ {std1:.4f}, two draws std/(σ√2) {std2:.4f} (within 0.01), mean {mean1:+.2e}")


# --- 2. a trial through run_trial ---------------------------------------------------------------------


def trial_check() -> None:
    device = trial_module.pick_device(0.25)
    report("pick_device(0.25)", device == DEVICE, f"{device} (expected {DEVICE})")
    if CUDA:
        cls = trial_module.evaluation_precision(device, "classification")
        reg = trial_module.evaluation_precision(device, "regression")
        report("evaluation_precision on cuda", cls is torch.bfloat16 and reg is None,
               f"classification {cls}, regression {reg}")
    else:
        skip("evaluation_precision on cuda", "no CUDA; the bfloat16 run below forces bfloat16 autocast on the CPU")
    grid = load_grid(ROOT / "grids" / "quickstart.yaml")
    spec = next(s for s in grid.trial_specs() if (s["label"], s["dataset"], s["seed"]) == ("sgld", "digits", 0))
    spec = {**spec, "resources": {**spec["resources"], "gpu": 0.25}}

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
    report("sgld digits trial: device and metrics", low.record["device"] == str(DEVICE) and not bad and accuracy > 0.8,
           f"device {low.record['device']}, {len(values)} metrics, non-finite {bad or 'none'}, test accuracy "
           f"{accuracy:.3f} (> 0.8), nll {values[('test', 'nll')]:.3f}, train {low.record['train_s']:.1f} s, "
           f"eval {low.record['eval_s']:.2f} s")
    diffs, worst = [], []
    for (eval_set, metric), value in values.items():
        if metric in BF16_TOLERANCE:
            absolute, relative = BF16_TOLERANCE[metric]
            delta = abs(value - reference[(eval_set, metric)])
            diffs.append(f"{eval_set}.{metric} {value:.4f}/{reference[(eval_set, metric)]:.4f}")
            if delta > absolute + relative * abs(reference[(eval_set, metric)]):
                worst.append(f"{eval_set}.{metric} off by {delta:.4f}")
    dp = max(float(abs(low.predictions[k].filter(regex=r"^p\d+$").to_numpy()
                       - full.predictions[k].filter(regex=r"^p\d+$").to_numpy()).max()) for k in low.predictions)
    in_effect = values[("test", "nll")] != reference[("test", "nll")]
    report("bfloat16 evaluation vs float32 (same trial)", not worst and in_effect,
           f"out of tolerance: {worst or 'none'}; bfloat16 in effect (nll differs): {in_effect}; "
           f"max |Δp| over saved predictions {dp:.2e}")
    info("bf16/fp32: " + "; ".join(diffs))


def every_quickstart_trial() -> None:
    """Each method × dataset of the quickstart grid (seed 0) through ``run_trial`` on the device: the Ray
    run's trials without Ray (which a GPU machine may lack)."""
    grid = load_grid(ROOT / "grids" / "quickstart.yaml")
    specs = [s for s in grid.trial_specs() if s["seed"] == 0]
    failed, slowest = [], (0.0, "")
    for spec in specs:
        name = f"{spec['label']}/{spec['dataset']}"
        start = time.perf_counter()
        try:
            outcome = trial_module.run_trial({**spec, "resources": {**spec["resources"], "gpu": 0.25}})
            values = [m["value"] for m in outcome.metrics]
            if outcome.record["device"] != str(DEVICE) or not values or not all(map(math.isfinite, values)):
                failed.append(f"{name}: device {outcome.record['device']}, {len(values)} metrics, some not finite")
        except Exception as error:  # noqa: BLE001 - listed in the report
            failed.append(f"{name}: {type(error).__name__}: {error}")
        slowest = max(slowest, (time.perf_counter() - start, name))
    report(f"every quickstart trial (seed 0) on {DEVICE} without Ray", not failed,
           f"{len(specs) - len(failed)}/{len(specs)} ran with finite metrics on {DEVICE}; slowest {slowest[1]} "
           f"{slowest[0]:.1f} s" + "".join(f"\n      {f}" for f in failed))


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
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(timed(variants[name]))
    return times


def ratios(num: list[float], den: list[float]) -> str:
    return f"best {min(num) / min(den):.3f}, median of repeats {statistics.median(a / b for a, b in zip(num, den)):.3f}"


def device_problem(n: int) -> Problem:
    base = bench.make_problem(n, 784)  # built on the CPU; a plain Problem (no per-step CPU clock) on DEVICE
    return Problem(base.x.to(DEVICE), base.y.to(DEVICE), base.likelihood, lambda: base.make_model().to(DEVICE),
                   base.generator, DEVICE)


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
    info(f"MLP 784-200-200-10, N={n}, batch {batch}, {repeats} interleaved repeats of 1 epoch on {DEVICE}: "
         + ", ".join(f"{k} {min(v) * 1e3:.1f} ms" for k, v in times.items()))
    info(f"SGLD epoch / plain SGD epoch:  {ratios(times['sgld'], times['sgd'])}  (CPU target <= 1.15)")
    info(f"SGHMC epoch / plain SGD epoch: {ratios(times['sghmc'], times['sgd'])}  (CPU target <= 1.15)")


def speed_hmc(n: int, n_leapfrog: int, repeats: int = 3) -> None:
    problem = device_problem(n)
    method = get_method("hmc")
    config = resolve_config(method, {"n_leapfrog": n_leapfrog, "burn_in": 0, "n_samples": 1,
                                     "adapt_step_size": False, "step_size": 1e-5, "prior_std": 1.0})
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
    info(f"HMC full batch N={n}, {n_leapfrog + 1} gradients per run on {DEVICE}: HMC gradient {per['hmc']:.2f} ms, "
         f"plain fwd+bwd {per['plain']:.2f} ms")
    info(f"HMC grads/s / plain fwd+bwd/s: {ratios(times['plain'], times['hmc'])}  (CPU target >= 0.9)")


# --- 4. Ray -------------------------------------------------------------------------------------------


def speed_corruptions(n: int) -> None:
    """Corrupting n CIFAR-sized images at every type and severity ÷ one ResNet50 evaluation pass over them
    on the device (``benchmarks/bench_corruptions.py``'s functions; target < 1)."""
    images = torch.randn(n, 3, 32, 32, device=DEVICE)
    bench_corruptions.corrupt_all(images[: bench_corruptions.WARM_UP_IMAGES])  # one-off costs, untimed
    corrupting = sum(bench_corruptions.corrupt_all(images).values())
    evaluating = bench_corruptions.evaluation_pass(images)
    info(f"corruptions, n = {n}, 10 types x 5 severities: {corrupting:.1f} s; one ResNet50 pass {evaluating:.1f} s; "
         f"ratio {corrupting / evaluating:.3f} (target < 1)")


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
        return [Problem(x, y, likelihood, lambda: build_mlp(tuple(x.shape[1:]), int(widths[-1]), widths[:-1]).to(DEVICE),
                        torch.Generator().manual_seed(i), DEVICE) for i in range(n)]

    def alone(ps, config):
        for p in ps:
            train_sgd(p.make_model(), p, config, {})

    def batched(ps, config):
        stacked = StackedNetworks([p.make_model() for p in ps])
        data = CopyData.from_problems(ps, [p.generator for p in ps], [None] * len(ps))
        train_sgd_copies(stacked, data, ps[0].likelihood, config)

    cases = (("E.1 MLP, 50 repetitions", x1, y1, Gaussian(0.1), [100, 100, 100, 1], 50, sgd),
             ("digits-sized MLP, 5 ensemble members", xd, yd, Categorical(), [200, 200, 10], 5, {**sgd, "batch_size": 128}),
             ("digits-sized MLP, 8 copies (the SGLD chains' shape)", xd, yd, Categorical(), [200, 200, 10], 8, {**sgd, "batch_size": 128}))
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
        info(f"vectorised E.1: {n} copies, {seconds / steps * 1e3:.2f} ms a step, "
             f"{n * steps / seconds:,.0f} copy-steps/s")


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

            ray.init(address="local", num_cpus=4, num_gpus=1, object_store_memory=256 * 1024**2,
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR", _temp_dir="/tmp/rg")
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
    report("ray run of the quickstart grid (seed 0, gpu 0.25 per trial)", ok,
           ("" if finished else f"NOT FINISHED after {timeout:.0f} s (abandoned); ")
           + f"{len(trials)}/{n_trials} trials written, {len(failed)} failed, device column {devices} "
           f"(expected all {DEVICE}), results in {folder / 'results'}")
    if len(trials):
        info(f"ray trials wall_s: {trials['wall_s'].sum():.1f} s summed, {trials['wall_s'].max():.1f} s longest")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the Ray part")
    parser.add_argument("--deadline", type=float, default=280.0, help="watchdog: exit after this many seconds")
    parser.add_argument("--ray-timeout", type=float, default=150.0, help="abandon the Ray part after this long")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    start = time.perf_counter()
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # a GPU machine may lack it (its wheel is too large to carry there)
        ray_version = None

    name = torch.cuda.get_device_name(0) if CUDA else "none"
    info(f"torch {torch.__version__} (CUDA {torch.version.cuda}), ray {ray_version}, {os.cpu_count()} CPUs, "
         f"GPU: {name}; checks run on {DEVICE}")
    if not CUDA:
        print("SKIP  GPU: no CUDA device; every part runs on the CPU to exercise this script, GPU-only checks skip")
    torch.manual_seed(0)

    print("\n== 1. exact posterior (tests/exact_blr.py) ==")
    guarded("sgld chain", lambda: sgmcmc_chain("sgld"))
    guarded("sghmc chain", lambda: sgmcmc_chain("sghmc"))
    guarded("hmc chain", hmc_chain)
    guarded("sgld one step", lambda: one_step_noise("sgld", 1.0))
    guarded("sghmc one step", lambda: one_step_noise("sghmc", 0.3))
    guarded("GaussianNoise", gaussian_noise_direct)

    print("\n== 2. trial without Ray ==")
    guarded("trial", trial_check)
    guarded("every quickstart trial", every_quickstart_trial)

    print("\n== 3. speed (figures, no asserts) ==")
    if not CUDA:
        skip("GPU speed figures", "no CUDA; a CPU smoke run at N=6,000 follows (not a GPU figure)")
    guarded("sgmcmc speed", lambda: speed_sgmcmc(60_000 if CUDA else 6_000))
    for n_leapfrog in (20, 200) if CUDA else (3,):  # the second: setup amortised as over a real chain
        guarded("hmc speed", lambda: speed_hmc(60_000 if CUDA else 6_000, n_leapfrog=n_leapfrog))
    guarded("corruption speed", lambda: speed_corruptions(10_000 if CUDA else 200))
    guarded("vectorised speed", lambda: speed_vectorised(3 if CUDA else 1))

    print("\n== 4. Ray ==")
    if args.quick:
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
    print(f"\nSUMMARY: {len(RESULTS) - len(failed)} PASS, {len(failed)} FAIL"
          f"{': ' + ', '.join(failed) if failed else ''} in {time.perf_counter() - start:.0f} s on {DEVICE}")
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: an abandoned Ray thread or CUDA teardown cannot hang the exit
