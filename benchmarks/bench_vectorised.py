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
* Seeds of one digits cell (``--seeds swag,swa,pca_ess,laplace,bdk,gped``): 8 seeds through a method's batched
  stream against its stream run once per seed, at the quickstart's settings.  No target.
* A batched trial end to end (``--end-to-end``): 50 E.1 seeds of Bernoulli dropout (grids/regression.yaml's
  ``bd`` entry at complexity 2, 150 epochs) as one batched trial (``run_trials_batched``) against 50
  ``run_trial`` calls: whole-trial CPU time (setup, training, evaluation of every posterior sample, metrics,
  points rows), and each side split into those phases.  Target ≥ 5× (issue 26, item 13b).
* The same through ``ursa-ray run`` (``--through-run``): that comparison as two grids run by the command a
  user runs (``vectorize_seeds: 50`` against one trial a seed, 2 one-CPU slots), in alternating order: the
  trials' CPU seconds (``cpu_s`` summed over trials.parquet: what the workers measured), the reserved
  CPU-seconds (``reserved_cpu_s``: Tune trial wall × CPUs, what a user pays for the slots) and the
  command's wall time.  Target ≥ 5× (issue 26, item 13b).
* The regression grid end to end (``--grid SLICE_DIR``): the results of one complete slice of
  grids/regression.yaml (every method, E.1 at complexity 2, 50 repetitions batched, run by ``ursa-ray run``)
  give each method's batched CPU seconds per seed; the same trials run alone here give the unbatched
  cost; both projected to the whole grid (see :func:`grid_projection`).

    python benchmarks/bench_vectorised.py [--quick]
    python benchmarks/bench_vectorised.py --skip-ratios --seeds swag,swa,pca_ess,laplace,bdk,gped
    python benchmarks/bench_vectorised.py --skip-ratios --end-to-end             # ~4 CPU-minutes
    python benchmarks/bench_vectorised.py --skip-ratios --through-run            # ~15 min on 2 cores
    ursa-ray run grids/regression_e1_slice.yaml --out results/e1_slice    # ~40 min on 2 cores
    python benchmarks/bench_vectorised.py --grid results/e1_slice --skip-ratios
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_samplers import clock, interleaved, ratio_line  # noqa: E402 - per-thread CPU time, rotated order

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
        ds.train_x,
        ds.train_y,
        Gaussian(float(ds.noise_std)),
        lambda: build_mlp(ds.input_shape, 1, [100, 100, 100]),
        torch.Generator().manual_seed(seed),
        torch.device("cpu"),
    )


def digits_problem(seed: int) -> Problem:
    from ursa_ray.data.digits import load_digits_dataset

    ds = load_digits_dataset({}, (), Path("."), False, seed)
    torch.manual_seed(seed)
    return Problem(
        ds.train_x,
        ds.train_y,
        Categorical(),
        lambda: build_mlp(ds.input_shape, 10, [200, 200]),
        torch.Generator().manual_seed(seed),
        torch.device("cpu"),
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
    print(
        f"  batched step ÷ its matmul floor: {min(times['batched']) / floor:.2f} "
        f"({1e3 * min(times['batched']) / steps:.3f} ms a step, floor {1e3 * floor / steps:.3f} ms)"
    )


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


QUICKSTART_SETTINGS = {  # grids/quickstart.yaml's settings of the methods batched since the first build
    "swag": {"epochs": 10, "swa_epochs": 10, "swa_lr": 0.01, "rank": 10},
    "swa": {"epochs": 10, "swa_epochs": 10, "swa_lr": 0.01},
    "pca_ess": {"epochs": 10, "swa_epochs": 10, "swa_lr": 0.01, "rank": 10},
    "laplace": {"lr": 0.05},
    "bdk": {"lr": 0.1, "prior_std": 0.17, "epochs": 20, "burn_in_epochs": 5},
    "gped": {"lr": 0.1, "prior_std": 0.17, "epochs": 20, "burn_in_epochs": 5},
}


def seeds_comparison(seeds: int, repeats: int, names: list[str]) -> None:
    """``seeds`` seeds of one digits cell, each method's batched stream against its stream run once per seed
    (training and sampling; no evaluation), at the quickstart's settings."""
    print(f"seeds of one cell, digits MLP 64-200-200-10, {seeds} seeds (quickstart settings, sampling included):")
    for name in names:
        method = get_method(name)
        config = resolve_config(method, QUICKSTART_SETTINGS[name])

        def one_after_another() -> None:
            for seed in range(seeds):
                list(method.sample_posterior(digits_problem(seed), config, {}))

        def batched() -> None:
            problems = [digits_problem(seed) for seed in range(seeds)]
            list(method.sample_posterior_batched(problems, config, [{} for _ in problems]))

        times = interleaved({"alone": one_after_another, "batched": batched}, repeats)
        print(ratio_line(f"{name}: {seeds} seeds alone ÷ batched", times["alone"], times["batched"], "none"))


def end_to_end_comparison(seeds: int, epochs: int, repeats: int) -> None:
    """``seeds`` E.1 seeds of the regression grid's ``bd`` (MC dropout, complexity 2, ``epochs`` epochs,
    50 samples a seed) as one batched trial against one lone trial per seed: whole-trial CPU time, and each
    side's phases summed over its seeds (setup, training, evaluation: the trials' own ``setup_s``,
    ``train_s``, ``eval_s``, timed here in thread CPU time; the rest: metrics, points rows, the cost
    metrics).  Writing the rows (the Tune trainable's, per seed) is not included."""
    from unittest import mock

    from ursa_ray.grid import load_grid
    from ursa_ray.trial import run_trial, run_trials_batched

    every = load_grid(str(Path(__file__).parent.parent / "grids" / "regression.yaml")).trial_specs()
    cell = [s for s in every if s.label == "bd" and s.dataset == "e1" and s.complexity == 2.0]
    specs = [dataclasses.replace(s, config={**s.config, "epochs": epochs}) for s in cell[:seeds]]
    records: dict[str, list[dict]] = {}

    def alone() -> None:
        records["alone"] = [run_trial(spec).record for spec in specs]

    def batched() -> None:
        records["batched"] = [outcome.record for outcome in run_trials_batched(specs)]

    run_trial(specs[0])  # first-call costs (imports, the data generator) out of the comparison
    with mock.patch("time.perf_counter", clock):  # the trials' phase timers in thread CPU seconds
        times = interleaved({"alone": alone, "batched": batched}, repeats)
    print(f"a batched trial end to end: E.1 bd, {len(specs)} seeds × {epochs} epochs, 50 samples a seed:")
    print(ratio_line(f"{len(specs)} lone trials ÷ one batched trial", times["alone"], times["batched"], "≥ 5"))
    for name, rows in records.items():
        phases = {k: sum(r[k] for r in rows) for k in ("setup_s", "train_s", "eval_s")}
        rest = times[name][-1] - sum(phases.values())
        print(
            f"  {name:8s} last repeat {times[name][-1]:7.2f} CPU-s: setup {phases['setup_s']:.2f}, "
            f"training {phases['train_s']:.2f}, evaluation {phases['eval_s']:.2f}, rest {rest:.2f}"
        )


THROUGH_RUN_GRID = """\
name: bench_through_run_{name}
methods:
  - {{name: mc_dropout, label: bd, models: [mlp],
     hyperparameters: {{p: 0.05, lr: 1.0e-4, momentum: 0.9, weight_decay: 1.0e-4, schedule: cosine}}}}
models:
  - {{name: mlp, options: {{widths: [100, 100, 100]}}}}
datasets:
  - {{name: e1, complexity: [2]}}
seeds: {seeds}
resources: {{cpu: 1, gpu: 0}}
vectorize_seeds: {vectorize}
budget: {{epochs: {epochs}, n_samples: 50, batch_size: 32}}
save_predictions: false
"""


def through_run_comparison(seeds: int, epochs: int, repeats: int) -> None:
    """:func:`end_to_end_comparison`'s two sides as grids run by ``ursa-ray run`` (grids/regression.yaml's
    ``bd`` at complexity 2, ``epochs`` epochs, 50 samples a seed), ``repeats`` times each in alternating
    order, every run into a fresh results directory.  Printed per run and as ratios (lone ÷ batched, best and
    median of the per-repeat ratios): Σ ``cpu_s``, Σ ``reserved_cpu_s`` and the command's wall seconds."""
    import subprocess
    import tempfile

    import pandas as pd

    totals: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="through_run") as tmp:
        for repeat in range(repeats):
            order = ("alone", "batched") if repeat % 2 == 0 else ("batched", "alone")
            for name in order:
                grid = Path(tmp) / f"{name}.yaml"
                vectorize = seeds if name == "batched" else 1
                grid.write_text(THROUGH_RUN_GRID.format(name=name, seeds=seeds, vectorize=vectorize, epochs=epochs))
                out = Path(tmp) / f"{name}_{repeat}"
                started = time.perf_counter()
                subprocess.run(
                    ["ursa-ray", "run", str(grid), "--out", str(out), "--progress", "log"],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                wall = time.perf_counter() - started
                trials = pd.read_parquet(out / "trials.parquet")
                assert (trials["status"] == "ok").all() and len(trials) == seeds, trials[["status", "error"]]
                run = {"cpu_s": trials["cpu_s"].sum(), "reserved_cpu_s": trials["reserved_cpu_s"].sum(), "wall_s": wall}
                for key, value in run.items():
                    totals.setdefault(name, {}).setdefault(key, []).append(float(value))
                print(f"  run {repeat} {name:8s} " + ", ".join(f"{k} {v:8.1f}" for k, v in run.items()), flush=True)
    print(f"through ursa-ray run: E.1 bd, {seeds} seeds × {epochs} epochs, lone ÷ batched (best, median of repeats):")
    for key in ("cpu_s", "reserved_cpu_s", "wall_s"):
        print(ratio_line(f"Σ {key}", totals["alone"][key], totals["batched"][key], "≥ 5"))


def grid_projection(slice_dir: str, alone_seeds: int) -> None:
    """The regression grid's CPU-hours alone and batched, from measured full-length per-trial costs.

    Batched: the mean ``cpu_s`` per seed of each method in ``slice_dir``, the results of one complete
    (experiment, complexity) slice of ``grids/regression.yaml`` run by ``ursa-ray run``
    (``grids/regression_e1_slice.yaml``: E.1 at complexity 2, 50 repetitions, each method's seeds one batched
    trial).  Alone: ``alone_seeds`` trials of each method at the grid's full settings through ``run_trial``,
    one after another, here.  A grid trial is projected as its method's cost × its N / 200 (E.2 has
    N = 200·d), an upper bound: the fixed part of a trial's cost does not grow with N."""
    import pandas as pd

    from ursa_ray.data.synthetic_regression import default_n_train
    from ursa_ray.grid import load_grid
    from ursa_ray.trial import run_trial

    batched = pd.read_parquet(Path(slice_dir) / "trials.parquet")
    batched = batched[(batched["dataset"] == "e1") & (batched["status"] == "ok")]
    complexity = float(batched["complexity"].iloc[0])
    per_seed = batched.groupby("method")["cpu_s"].mean()
    shared = batched.groupby("method")["seeds_in_trial"].max()
    grid = load_grid(str(Path(__file__).parent.parent / "grids" / "regression.yaml"))
    every = grid.trial_specs()
    print(
        f"regression grid: CPU seconds per trial at E.1 complexity {complexity:g} "
        f"(alone: {alone_seeds} trials here; batched: per seed, from {slice_dir})"
    )
    totals = {"alone": 0.0, "batched": 0.0}
    for label in dict.fromkeys(s.label for s in every):
        cell = [s for s in every if s.label == label and s.dataset == "e1" and s.complexity == complexity]
        start = time.process_time()
        for spec in cell[:alone_seeds]:
            run_trial(spec)
        alone = (time.process_time() - start) / alone_seeds
        cost = {"alone": alone, "batched": float(per_seed[label])}
        for spec in every:
            if spec.label == label:
                scale = default_n_train(spec.dataset, float(spec.complexity)) / default_n_train("e1", complexity)
                for name in totals:
                    totals[name] += cost[name] * scale
        print(
            f"  {label:10s} alone {alone:7.1f} s   batched {cost['batched']:6.2f} s ({int(shared[label])} seeds a trial)"
            f"   ratio {alone / cost['batched']:5.2f}"
        )
    print(
        f"  projected grid ({len(every)} trials): {totals['alone'] / 3600:.0f} CPU-hours alone, "
        f"{totals['batched'] / 3600:.0f} batched (ratio {totals['alone'] / totals['batched']:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument(
        "--grid",
        metavar="SLICE_DIR",
        help="also project the regression grid's CPU-hours from "
        "the results of a complete E.1 slice (see grid_projection)",
    )
    parser.add_argument("--skip-ratios", action="store_true", help="only the --grid projection")
    parser.add_argument("--alone-seeds", type=int, default=2, help="trials per method run alone for --grid")
    parser.add_argument(
        "--seeds",
        metavar="METHODS",
        help="also compare 8 batched seeds against 8 alone for "
        f"these methods (comma-separated, of {','.join(QUICKSTART_SETTINGS)})",
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="also compare 50 E.1 bd seeds as one batched trial against 50 lone trials, whole trials "
        "(--quick: 8 seeds × 20 epochs)",
    )
    parser.add_argument(
        "--through-run",
        action="store_true",
        help="also compare them through ursa-ray run: two grids, alternating (--quick: 8 seeds × 20 epochs)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as the trials run (ursa_ray/tune/trainable.py)
    repeats = 3 if args.quick else 5
    if not args.skip_ratios:
        e1_comparison(50, 5 if args.quick else 20, repeats)
        ensemble_comparison(5, 3 if args.quick else 20, repeats)
        chains_comparison(8, 4 if args.quick else 20, repeats)
    if args.seeds:
        seeds_comparison(8, repeats, args.seeds.split(","))
    if args.end_to_end:
        end_to_end_comparison(8 if args.quick else 50, 20 if args.quick else 150, 1 if args.quick else 2)
    if args.through_run:
        through_run_comparison(8 if args.quick else 50, 20 if args.quick else 150, 2 if args.quick else 3)
    if args.grid:
        grid_projection(args.grid, args.alone_seeds)


if __name__ == "__main__":
    main()
