"""Vectorised repetitions against the same repetitions run one after another (ratios, no asserts).

Each comparison trains the same copies for the same steps both ways, side by side in one run, on one
thread, timed in per-thread CPU time (``bench_samplers.interleaved``: variants interleaved, order
rotated every repeat).  Printed: the ratio of best times and the median of the per-repeat ratios.

* E.1: the regression MLP 1-100-100-100-1 on E.1 (N = 200, batch 32, SGD with momentum and the cosine
  schedule of grids/regression.yaml), 50 repetitions batched (``train_sgd_copies``) against 50 ``train_sgd``
  runs.  Target ≥ 5×.  Also printed: the batched step against the floor of its matrix multiplications
  (the same batched matmuls, forward and backward, with nothing else).
* A 5-member deep ensemble of the digits MLP 64-200-200-10 (batched members against one member after
  another).  Target ≥ 2.5×.
* 8 SGLD chains on the digits MLP (``n_chains: 8`` against 8 single chains).  Target ≥ 3×.
* The regression grid end to end (``--grid``): each method of grids/regression.yaml on E.1 at complexity 2,
  per-trial CPU seconds alone (``run_trial``) and per seed of a 50-seed batched trial
  (``run_trials_batched``), each measured at two training lengths and extrapolated linearly to the grid's
  (fixed cost + cost per epoch or HMC iteration), then the grid's projected CPU-hours before and after.

    python benchmarks/bench_vectorised.py [--quick] [--grid]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_samplers import interleaved, ratio_line  # noqa: E402 - per-thread CPU time, rotated order

from ursa_ray.data.synthetic_regression import make_dataset  # noqa: E402
from ursa_ray.methods import get_method  # noqa: E402
from ursa_ray.methods._training import train_sgd  # noqa: E402
from ursa_ray.methods.base import Categorical, Gaussian, Problem, resolve_config  # noqa: E402
from ursa_ray.methods.batched import CopyData, StackedNetworks, train_sgd_copies  # noqa: E402
from ursa_ray.models.mlp import build_mlp  # noqa: E402

REGRESSION_SGD = {"lr": 1e-4, "momentum": 0.9, "weight_decay": 1e-4, "schedule": "cosine", "batch_size": 32}


def e1_problem(seed: int) -> Problem:
    ds = make_dataset("e1", 2.0, seed)
    torch.manual_seed(seed)
    return Problem(
        ds.train_x, ds.train_y, Gaussian(float(ds.noise_std)),
        lambda: build_mlp(ds.input_shape, 1, [100, 100, 100]), torch.Generator().manual_seed(seed), torch.device("cpu"),
    )


def digits_problem(seed: int) -> Problem:
    from ursa_ray.data.digits import load_digits_dataset

    ds = load_digits_dataset({}, (), Path("."), False, seed)
    torch.manual_seed(seed)
    return Problem(
        ds.train_x, ds.train_y, Categorical(), lambda: build_mlp(ds.input_shape, 10, [200, 200]),
        torch.Generator().manual_seed(seed), torch.device("cpu"),
    )


def e1_comparison(copies: int, epochs: int, repeats: int) -> None:
    config = {**REGRESSION_SGD, "epochs": epochs}
    problems = [e1_problem(seed) for seed in range(copies)]
    models = [p.make_model() for p in problems]

    def one_after_another() -> None:
        for problem, model in zip(problems, models, strict=True):
            train_sgd(copy.deepcopy(model), problem, config, {})

    def batched() -> None:
        stacked = StackedNetworks([copy.deepcopy(m) for m in models])
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * copies)
        train_sgd_copies(stacked, data, problems[0].likelihood, config)

    times = interleaved({"alone": one_after_another, "batched": batched}, repeats)
    steps = epochs * -(-problems[0].n_train // config["batch_size"])
    print(f"E.1 MLP 1-100-100-100-1, {copies} repetitions × {steps} steps (batch 32):")
    print(ratio_line(f"{copies} alone ÷ {copies} batched", times["alone"], times["batched"], "≥ 5"))
    floor = matmul_floor(copies, 32, [1, 100, 100, 100, 1], steps)
    print(f"  batched step ÷ its matmul floor: {min(times['batched']) / floor:.2f} "
          f"({1e3 * min(times['batched']) / steps:.3f} ms a step, floor {1e3 * floor / steps:.3f} ms)")


def matmul_floor(copies: int, batch: int, widths: list[int], steps: int) -> float:
    """CPU seconds of the batched step's matrix multiplications alone: per layer, the forward
    (C, B, in) × (C, in, out) and the backward products for the input and the weight gradients."""
    from bench_samplers import clock

    shapes = list(zip(widths[:-1], widths[1:]))
    xs = [torch.randn(copies, batch, i) for i, _ in shapes]
    ws = [torch.randn(copies, i, o) for i, o in shapes]
    gs = [torch.randn(copies, batch, o) for _, o in shapes]
    start = clock()
    for _ in range(steps):
        for x, w, g in zip(xs, ws, gs, strict=True):
            torch.bmm(x, w)
            torch.bmm(g, w.transpose(1, 2))
            torch.bmm(x.transpose(1, 2), g)
    return clock() - start


def ensemble_comparison(members: int, epochs: int, repeats: int) -> None:
    method = get_method("deep_ensemble")
    config = resolve_config(method, {"n_samples": members, "epochs": epochs, "lr": 0.05})

    def batched() -> None:
        problem = digits_problem(0)
        list(method.sample_posterior(problem, config, {}))

    def one_after_another() -> None:
        problem = digits_problem(0)
        for _ in range(members):
            train_sgd(problem.make_model(), problem, config, {})

    times = interleaved({"alone": one_after_another, "batched": batched}, repeats)
    print(f"deep ensemble, digits MLP 64-200-200-10, {members} members × {epochs} epochs:")
    print(ratio_line(f"{members} members alone ÷ batched", times["alone"], times["batched"], "≥ 2.5"))
    steps = epochs * -(-digits_problem(0).n_train // config["batch_size"])
    floor = matmul_floor(members, config["batch_size"], [64, 200, 200, 10], steps)
    print(f"  alone ÷ the batched run's matmul floor (the most batching could save): {min(times['alone']) / floor:.2f}")


def chains_comparison(chains: int, epochs: int, repeats: int) -> None:
    method = get_method("sgld")
    settings = {"epochs": epochs, "burn_in_epochs": epochs // 2, "n_samples": 10}
    single = resolve_config(method, settings)
    pooled = resolve_config(method, {**settings, "n_chains": chains})

    def one_after_another() -> None:
        for seed in range(chains):
            list(method.sample_posterior(digits_problem(seed), single, {}))

    def batched() -> None:
        list(method.sample_posterior(digits_problem(0), pooled, {}))

    times = interleaved({"alone": one_after_another, "batched": batched}, repeats)
    print(f"SGLD, digits MLP 64-200-200-10, {chains} chains × {epochs} epochs (R̂ and ESS included):")
    print(ratio_line(f"{chains} single chains ÷ n_chains={chains}", times["alone"], times["batched"], "≥ 3"))
    steps = epochs * -(-digits_problem(0).n_train // single["batch_size"])
    floor = matmul_floor(chains, single["batch_size"], [64, 200, 200, 10], steps)
    print(f"  alone ÷ the batched run's matmul floor (the most batching could save): {min(times['alone']) / floor:.2f}")


def grid_projection(seeds: int) -> None:
    """Per-trial CPU seconds of every regression method, alone and batched, extrapolated to the grid."""
    from ursa_ray.grid import load_grid
    from ursa_ray.trial import run_trial, run_trials_batched

    grid = load_grid(str(Path(__file__).parent.parent / "grids" / "regression.yaml"))
    specs = [s for s in grid.trial_specs() if s["dataset"] == "e1" and s["complexity"] == 2]
    by_label: dict[str, list[dict]] = {}
    for spec in specs:
        by_label.setdefault(spec["label"], []).append(spec)
    print(f"regression grid, E.1 complexity 2: CPU seconds per trial (alone: 2 seeds; batched: {seeds} seeds, per seed)")
    totals = {"alone": 0.0, "batched": 0.0}
    every = grid.trial_specs()
    n_trials = len(every)
    for label, cell in by_label.items():
        full = _length(cell[0]["config"])
        costs = {}
        for name, run, n in (("alone", lambda s: [run_trial(x) for x in s], 2), ("batched", run_trials_batched, seeds)):
            points = []
            for short in (full / 100, full / 50):
                chosen = [_shortened(s, short) for s in cell[:n]]
                start = time.process_time()
                run(chosen)
                points.append((short, (time.process_time() - start) / n))
            (a, ca), (b, cb) = points
            slope = (cb - ca) / (b - a)
            costs[name] = ca + slope * (full - a)
        label_trials = sum(s["label"] == label for s in every)
        totals["alone"] += costs["alone"] * label_trials
        totals["batched"] += costs["batched"] * label_trials
        print(f"  {label:10s} alone {costs['alone']:8.1f} s   batched {costs['batched']:8.1f} s   ratio {costs['alone'] / costs['batched']:5.2f}")
    print(f"  projected grid ({n_trials} trials, E.1's per-trial costs for every experiment, E.2 is ~d times longer): "
          f"{totals['alone'] / 3600:.0f} CPU-hours alone, {totals['batched'] / 3600:.0f} batched")


def _length(config: dict) -> float:
    return float(config.get("epochs") or config["burn_in"] + config["n_samples"])


def _shortened(spec: dict, length: float) -> dict:
    config = dict(spec["config"])
    scale = length / _length(config)
    if "epochs" in config:
        config["epochs"] = max(2, round(config["epochs"] * scale))
        if "burn_in_epochs" in config:
            config["burn_in_epochs"] = max(1, round(config["burn_in_epochs"] * scale))
            config["n_samples"] = min(config["n_samples"], config["epochs"] - config["burn_in_epochs"])
    else:
        config["burn_in"] = max(1, round(config["burn_in"] * scale))
        config["n_samples"] = max(1, round(config["n_samples"] * scale))
    return {**spec, "config": config}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--grid", action="store_true", help="also project the regression grid's CPU-hours")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 5
    e1_comparison(50, 5 if args.quick else 20, repeats)
    ensemble_comparison(5, 3 if args.quick else 20, repeats)
    chains_comparison(8, 4 if args.quick else 20, repeats)
    if args.grid:
        grid_projection(50)


if __name__ == "__main__":
    main()
