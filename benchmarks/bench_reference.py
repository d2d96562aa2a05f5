"""Cost of a cell's reference posterior (issue 29, docs/fidelity.md), measured side by side in one run
(ratios, no asserts).

* **reference ÷ SGD trial**: one reference (:func:`ursa_ray.trial.compute_reference`: HMC's chains batched,
  their predictives on the test and OOD sets accumulated per chain and pooled, the R̂/ESS check and the
  noise floor) ÷ one SGD trial of the same cell (:func:`ursa_ray.trial.run_trial`: training and the whole
  evaluation the quickstart asks for: OOD sets, corruptions, attacks, bit depths).
* **4 chains ÷ 1 chain**: HMC's stream alone (training, no evaluation) with ``n_chains`` 4 against 1, the
  same per-chain settings (issue 29's target: ≤ 2).
* **4 chains' potential ÷ 1 chain's**: 200 evaluations of the full-batch potential and its gradient, the four
  chains' ``vmap``'d (:func:`~ursa_ray.methods.hmc.stacked_potential`, HMC's path for a small network) and
  looped one chain after another (:func:`~ursa_ray.methods.hmc.looped_potential`), against one chain's.

The cell is the quickstart's digits cell (``grids/quickstart.yaml``: MLP 64-200-200-10, OOD sets
digits_inverted, digits_rotated and noise; SGD lr 0.05, 20 epochs, batch 64, its corruptions and attacks).
The reference's settings are ``--reference`` (JSON; default below), the chains' comparison uses
``--chains-settings`` (per chain).  torch runs on ``--threads`` threads (default 1, a trial with ``cpu: 1``); each variant runs
once untimed first (the process's and the method's one-off costs), then the timed repeats, interleaved;
the best (minimum) of each is kept, since other processes only ever add time.  Both wall seconds and the
process's CPU seconds are printed (on a shared machine CPU seconds are the steadier of the two).

    python benchmarks/bench_reference.py [--repeats N] [--reference JSON] [--chains-settings JSON] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from ursa_ray.grid import parse_grid
from ursa_ray.methods import get_method
from ursa_ray.methods.base import flat_parameters, resolve_config
from ursa_ray.methods.batched import StackedNetworks
from ursa_ray.methods.hmc import looped_potential, stacked_potential
from ursa_ray.reference import reference_spec
from ursa_ray.spec import TrialSpec
from ursa_ray.trial import TrialRun, compute_reference, run_trial

QUICKSTART = Path(__file__).resolve().parents[1] / "grids" / "quickstart.yaml"
REFERENCE = {"chains": 4, "n_samples": 60, "burn_in": 40, "n_leapfrog": 40, "prior_std": 0.1}
CHAINS = {"n_samples": 20, "burn_in": 10, "n_leapfrog": 10, "prior_std": 0.1}


def quickstart_sgd_spec() -> TrialSpec:
    """The quickstart's final SGD trial on its digits cell (seed 0), as the grid makes it."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["methods"] = [{**m, "datasets": ["digits"]} for m in raw["methods"] if m.get("label", m["name"]) == "sgd"]
    raw["datasets"] = [d for d in raw["datasets"] if isinstance(d, dict) and d["name"] == "digits"]
    raw["seeds"] = [0]
    raw.pop("reference", None)  # the benchmark runs the reference itself
    grid = parse_grid(raw, str(QUICKSTART))
    (spec,) = [s for s in grid.trial_specs("final") if s.model == "mlp"]
    return spec


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``work()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def hmc_stream(
    spec: TrialSpec, n_chains: int, per_chain: dict, device: torch.device | None = None
) -> Callable[[], None]:
    """Run HMC's stream (training only) with ``n_chains`` chains of ``per_chain`` settings on ``spec``'s cell, its
    data and networks on ``device`` (None: the trial's own choice, the CPU here)."""
    run = TrialRun(reference_spec(spec, {"chains": 2, **per_chain}), device)
    config = resolve_config(get_method("hmc"), {**per_chain, "n_chains": n_chains})

    def work() -> None:
        for _ in run.method.sample_posterior(run.problem, config, {}):
            pass

    return work


def potential_evaluations(
    spec: TrialSpec, n_chains: int, vmapped: bool, prior_std: float, evaluations: int = 200
) -> Callable[[], None]:
    """``evaluations`` evaluations of ``n_chains`` chains' HMC potential on ``spec``'s cell (each chain its own
    network), ``vmapped`` as one batched computation or looped one chain after another."""
    problem = TrialRun(spec).problem
    models = [problem.make_model() for _ in range(n_chains)]
    theta = torch.stack([flat_parameters(m) for m in models])
    copies = [problem] * n_chains
    if vmapped:
        potential = stacked_potential(StackedNetworks(models), copies, prior_std, 1.0)
    else:
        potential = looped_potential(copies, models, prior_std, 1.0)

    def work() -> None:
        for _ in range(evaluations):
            potential(theta)

    return work


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(w for w, _ in runs), min(c for _, c in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reference", type=json.loads, default=REFERENCE)
    parser.add_argument("--chains-settings", type=json.loads, default=CHAINS)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial's cpu)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = quickstart_sgd_spec()
    variants: dict[str, Callable[[], object]] = {
        "sgd trial": lambda: run_trial(spec),
        "reference": lambda: compute_reference(spec, args.reference),
        "hmc 1 chain": hmc_stream(spec, 1, args.chains_settings),
        "hmc 4 chains": hmc_stream(spec, 4, args.chains_settings),
        "potential 1": potential_evaluations(spec, 1, False, args.chains_settings["prior_std"]),
        "potential 4 vmap": potential_evaluations(spec, 4, True, args.chains_settings["prior_std"]),
        "potential 4 loop": potential_evaluations(spec, 4, False, args.chains_settings["prior_std"]),
    }
    short = {**args.reference, "n_samples": 4, "burn_in": 2}
    warm_ups = {**variants, "reference": lambda: compute_reference(spec, short)}
    for work in warm_ups.values():
        work()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, work in variants.items():
            times[name].append(timed(work))
    print(f"cell: quickstart digits, mlp 64-200-200-10; torch threads {args.threads}; best of {args.repeats}")
    print(
        f"reference settings: {json.dumps(args.reference)}; chains' per-chain settings: {json.dumps(args.chains_settings)}"
    )
    for name, runs in times.items():
        wall, cpu = best(runs)
        print(f"{name:>16}: wall {wall:7.2f} s   cpu {cpu:7.2f} s   (every repeat: {[round(w, 2) for w, _ in runs]})")
    ratios = (
        ("reference", "sgd trial"),
        ("hmc 4 chains", "hmc 1 chain"),
        ("potential 4 vmap", "potential 1"),
        ("potential 4 loop", "potential 1"),
    )
    for top, bottom in ratios:
        (wall_top, cpu_top), (wall_bottom, cpu_bottom) = best(times[top]), best(times[bottom])
        print(f"{top} / {bottom}: wall {wall_top / wall_bottom:.2f}x   cpu {cpu_top / cpu_bottom:.2f}x")


if __name__ == "__main__":
    main()
