"""The hyperparameter search phase, on Ray Tune, with every search trial's compute recorded.

For each (method, model, dataset[, complexity]) cell whose method declares a search space, a Tuner samples
configurations (random search, or Optuna's TPE through ``OptunaSearch``), runs each as a search-phase
trial (trained on the training set less a seeded validation split, scored on that split only: the test
set is never evaluated), optionally stops poor ones early with ASHA on the running validation metric,
and stops when the cell's trial count or its compute budget (reserved CPU- or GPU-seconds) is spent.
The best configuration goes on to the final phase.  A resumed run counts the search trials already
recorded and only runs the rest.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from ray import tune

from ursa_ray.grid import Grid, cell_key
from ursa_ray.results import ResultsDirectory

DISTRIBUTIONS = {
    "uniform": lambda d: tune.uniform(d["low"], d["high"]),
    "loguniform": lambda d: tune.loguniform(d["low"], d["high"]),
    "int": lambda d: tune.randint(d["low"], d["high"] + 1),
    "choice": lambda d: tune.choice(d["values"]),
}


class ComputeBudget(tune.Stopper):
    """Stops a cell's search once its recorded trials have used the reserved CPU/GPU-second budget."""

    def __init__(self, results: ResultsDirectory, cell: str, cpu_seconds: float | None, gpu_seconds: float | None):
        self.results, self.cell = results, cell
        self.cpu_seconds, self.gpu_seconds = cpu_seconds, gpu_seconds

    def spent(self) -> tuple[float, float]:
        trials = self.results.tables["trials"]
        rows = trials[(trials["phase"] == "search") & (trials["cell"] == self.cell)] if not trials.empty else trials
        if rows.empty:
            return 0.0, 0.0
        return float(rows["reserved_cpu_s"].sum()), float(rows["reserved_gpu_s"].sum())

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        cpu, gpu = self.spent()
        return (self.cpu_seconds is not None and cpu >= self.cpu_seconds) or (
            self.gpu_seconds is not None and gpu >= self.gpu_seconds
        )


def best_config(results: ResultsDirectory, cell: str, metric: str, mode: str) -> tuple[dict[str, Any], float] | None:
    """The configuration of the cell's search trial with the best selection metric, and that value."""
    trials = results.tables["trials"]
    if trials.empty:
        return None
    rows = trials[(trials["phase"] == "search") & (trials["cell"] == cell) & (trials["status"] != "failed")]
    best = None
    for row in rows.itertuples():
        value = json.loads(row.selection or "{}").get(metric, math.nan)
        if not np.isfinite(value):
            continue
        if best is None or (value < best[1] if mode == "min" else value > best[1]):
            best = (json.loads(row.config), value)
    return best


def run_search_phase(grid: Grid, results: ResultsDirectory, summary: Any, echo: Any, stamp: str) -> dict[str, dict[str, Any]]:
    """Search every cell that has a search space; return {cell key: best hyperparameters}."""
    from ursa_ray.tune.runner import run_trials

    settings = grid.search
    assert settings is not None
    overrides: dict[str, dict[str, Any]] = {}
    for cell in grid.cells():
        method = cell["method"]
        if not method.search_space:
            continue
        key = cell_key(cell)
        base = grid.spec_for(cell, grid.seeds[0], "search", {})
        trials = results.tables["trials"]
        done = 0 if trials.empty else int(((trials["phase"] == "search") & (trials["cell"] == key)).sum())
        budget = ComputeBudget(results, key, settings.cpu_seconds, settings.gpu_seconds)
        remaining = settings.n_trials - done
        if remaining > 0 and not budget.stop_all():
            echo(f"search phase: {key}: {remaining} trial(s) ({done} already recorded), {settings.algorithm}, metric {settings.metric}")
            space = {name: DISTRIBUTIONS[d["type"]](d) for name, d in method.search_space.items()}
            tune_config = tune.TuneConfig(
                metric=settings.metric,
                mode=settings.mode,
                num_samples=remaining,
                search_alg=_search_algorithm(settings, seed=grid.seeds[0] + done),
                scheduler=_scheduler(settings),
                max_concurrent_trials=settings.max_concurrent or grid.max_concurrent_trials,
                reuse_actors=True,
            )
            summary.planned += remaining
            run_trials(
                [],
                grid,
                results,
                f"search-{key.replace('/', '-')}-{stamp}",
                summary,
                echo,
                tune_config=tune_config,
                param_space={"spec": base, "hp": space},
                stop=budget,
            )
        found = best_config(results, key, settings.metric, settings.mode)
        if found is None:
            echo(f"search phase: {key}: no search trial finished; the final phase uses the grid's fixed settings")
            continue
        config, value = found
        chosen = {name: config[name] for name in method.search_space}
        overrides[key] = chosen
        echo(f"search phase: {key}: best {settings.metric} = {value:.4f} with {chosen}")
    return overrides


def _search_algorithm(settings: Any, seed: int) -> Any:
    if settings.algorithm == "tpe":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed))
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=seed)


def _scheduler(settings: Any) -> Any:
    if settings.scheduler == "asha":
        return tune.schedulers.ASHAScheduler(time_attr="training_iteration", grace_period=1, reduction_factor=2)
    return None
