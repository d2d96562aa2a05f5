"""The hyperparameter search phase, on Ray Tune, with every search trial's compute recorded.

For each (method, model, dataset[, complexity]) cell whose method declares a search space, a Tuner samples
configurations (random search, or Optuna's TPE through ``OptunaSearch``), runs each as a search-phase
trial (trained on the training set less a seeded validation split, scored on that split only: the test
set is never evaluated), optionally stops poor ones early with ASHA on the running validation metric,
and stops when the cell's trial count or its compute budget (reserved CPU- or GPU-seconds) is spent.
The best configuration of the trials that ran to their end goes on to the final phase.

- A failed search trial (a diverging configuration, say) is recorded as failed with its compute, told to
  the searcher as pruned (worse than any finished configuration), and never selected.  A cell whose
  search trials all failed has no final phase (``RunSummary.failed_cells``).
- The budget counts the cell's recorded search trials (every status, earlier runs included) and the
  reserved seconds of the trials running now, checked at every step of Tune's loop; when it is spent the
  search stops, and the running trials are recorded as early_stopped with the compute they used.
- A resumed run counts the finished (ok or early_stopped) search trials as done, not the failed ones,
  replays every recorded trial to TPE, and seeds the searcher with the number of recorded trials, so it
  neither repeats finished trials nor redraws configurations already evaluated.  Once a cell's final phase
  has started its search is closed: a rerun keeps the configuration its final trials ran with (a new best
  would give the cell a second set of final trials, whose ids depend on the configuration).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from ursa_ray.grid import Grid
from ursa_ray.results import ResultsDirectory
from ursa_ray.tune.trainable import pack
from ursa_ray.tune.trials import run_trials

DISTRIBUTIONS = {
    "uniform": lambda d: tune.uniform(d["low"], d["high"]),
    "loguniform": lambda d: tune.loguniform(d["low"], d["high"]),
    "int": lambda d: tune.randint(d["low"], d["high"] + 1),
    "choice": lambda d: tune.choice(d["values"]),
}

FINISHED = ("ok", "early_stopped")


@dataclass
class ComputeBudget:
    """A cell's search budget in reserved CPU- and GPU-seconds; ``spent_before``: what its recorded search trials
    (of earlier runs, every status) already used."""

    cpu_seconds: float | None
    gpu_seconds: float | None
    spent_before: tuple[float, float] = (0.0, 0.0)

    @property
    def active(self) -> bool:
        return self.cpu_seconds is not None or self.gpu_seconds is not None

    def exhausted(self, spent_now: tuple[float, float] = (0.0, 0.0)) -> bool:
        """Whether earlier trials plus ``spent_now`` (this run's trials, recorded and running) reach a limit."""
        cpu, gpu = self.spent_before[0] + spent_now[0], self.spent_before[1] + spent_now[1]
        return (self.cpu_seconds is not None and cpu >= self.cpu_seconds) or (
            self.gpu_seconds is not None and gpu >= self.gpu_seconds
        )

    def describe(self) -> str:
        limits = [
            f"{k} {v:g}"
            for k, v in (("cpu_seconds", self.cpu_seconds), ("gpu_seconds", self.gpu_seconds))
            if v is not None
        ]
        return " / ".join(limits) + " budget"


def search_rows(results: ResultsDirectory, cell: str) -> pd.DataFrame:
    """The cell's recorded search trials (every status)."""
    trials = results.trials()
    if trials.empty:
        return trials
    return trials[(trials["phase"] == "search") & (trials["cell"] == cell)]


def _selection_value(row: Any, metric: str) -> float:
    value = json.loads(row.selection or "{}").get(metric, math.nan)
    return float(value) if value is not None else math.nan


def best_config(results: ResultsDirectory, cell: str, metric: str, mode: str) -> tuple[dict[str, Any], float] | None:
    """The configuration of the cell's search trial with the best selection metric, and that value.

    Only trials that ran to their end (status ok) with a finite value are candidates: a failed trial never is,
    nor one stopped early (by ASHA or cut short by the budget), whose last figure comes from a shorter run."""
    rows = search_rows(results, cell)
    if rows.empty:
        return None
    best = None
    for row in rows[rows["status"] == "ok"].itertuples():
        value = _selection_value(row, metric)
        if not np.isfinite(value):
            continue
        if best is None or (value < best[1] if mode == "min" else value > best[1]):
            best = (json.loads(row.config), value)
    return best


def final_config(results: ResultsDirectory, cell: str, space: dict[str, Any]) -> dict[str, Any] | None:
    """The searched hyperparameters the cell's final trials ran with (its latest), None before its final phase."""
    trials = results.trials()
    if trials.empty:
        return None
    rows = trials[(trials["phase"] == "final") & (trials["cell"] == cell)]
    if rows.empty:
        return None
    config = json.loads(rows.sort_values("finished_at")["config"].iloc[-1])
    return {name: config[name] for name in space if name in config}


def searcher_history(
    rows: pd.DataFrame, space: dict[str, Any], metric: str
) -> list[tuple[dict[str, Any], float | None, str]]:
    """Recorded search trials as (parameters as the searcher names them, value, state) for :class:`UrsaOptunaSearch`:
    ok with a finite value -> complete; failed, early-stopped or without a finite value -> pruned (the value,
    if any, as its last intermediate value)."""
    history = []
    for row in rows.itertuples():
        config = json.loads(row.config)
        params = {f"hp/{name}": config[name] for name in space}
        value = _selection_value(row, metric)
        finite = bool(np.isfinite(value))
        state = "complete" if row.status == "ok" and finite else "pruned"
        history.append((params, value if finite else None, state))
    return history


def search_plan(rows: pd.DataFrame, settings: Any) -> tuple[int | None, int, ComputeBudget]:
    """A cell's search from its recorded search trials ``rows``: (trials still to run, None when only a budget
    limits it; trials finished, ok or early-stopped; its budget, with what every recorded trial used).

    Failed trials are not counted as done (a rerun runs others in their place), but their compute is spent."""
    finished = int(rows["status"].isin(FINISHED).sum()) if not rows.empty else 0
    spent = (float(rows["reserved_cpu_s"].sum()), float(rows["reserved_gpu_s"].sum())) if not rows.empty else (0.0, 0.0)
    budget = ComputeBudget(settings.cpu_seconds, settings.gpu_seconds, spent)
    n_trials = settings.n_trials  # None: only a budget was given, no trial count is planned
    return (None if n_trials is None else max(0, n_trials - finished)), finished, budget


def run_search_phase(
    grid: Grid, results: ResultsDirectory, summary: Any, echo: Any, stamp: str, interrupt: Any = None
) -> dict[str, dict[str, Any]]:
    """Search every cell that has a search space; return {cell key: best hyperparameters}.

    Stops at once (returns what it has) when ``interrupt`` is set: the caller then runs no final phase."""
    settings = grid.search
    assert settings is not None
    overrides: dict[str, dict[str, Any]] = {}
    for key, search_space in grid.search_cells().items():
        if interrupt is not None and interrupt.is_set():
            break
        pinned = final_config(results, key, search_space)
        if pinned is not None:  # closed: a new best now would give the cell a second set of final trials
            overrides[key] = pinned
            echo(f"search phase: {key}: closed (its final phase has started) with {pinned}")
            continue
        if not _search_cell(grid, key, search_space, results, summary, echo, stamp, interrupt):
            break  # no selection from a cut-short search
        found = best_config(results, key, settings.metric, settings.mode)
        if found is None:
            why = _why_nothing_selected(search_rows(results, key), settings.metric)
            summary.failed_cells.append((key, why))
            echo(f"FAILED search {key}: {why}; its final phase is not run")
            continue
        config, value = found
        chosen = {name: config[name] for name in search_space}
        overrides[key] = chosen
        echo(f"search phase: {key}: best {settings.metric} = {value:.4f} with {chosen}")
    return overrides


def _search_cell(
    grid: Grid,
    key: str,
    search_space: dict[str, Any],
    results: ResultsDirectory,
    summary: Any,
    echo: Any,
    stamp: str,
    interrupt: Any,
) -> bool:
    """Run the cell ``key``'s search trials still to run (none once its trial count or its budget is spent, see
    :func:`search_plan`) as one Tune experiment.  False when Ctrl-C cut it short (nothing is then selected)."""
    settings = grid.search
    rows = search_rows(results, key)
    remaining, finished, budget = search_plan(rows, settings)
    if remaining == 0 or budget.exhausted():
        return True
    spent = budget.spent_before
    plan = [] if remaining is None else [f"{remaining} trial(s)"]
    if budget.active:
        plan.append(f"until its {budget.describe()} is spent ({spent[0]:.1f} CPU-s, {spent[1]:.1f} GPU-s used)")
    echo(
        f"search phase: {key}: {' or '.join(plan)} ({finished} already finished), {settings.algorithm}"
        f"{', asha' if settings.scheduler == 'asha' else ''}, metric {settings.metric}"
    )
    space = {name: DISTRIBUTIONS[d["type"]](d) for name, d in search_space.items()}
    stopper = run_trials(
        [],
        grid,
        results,
        f"search-{key.replace('/', '-')}-{stamp}",
        summary,
        echo,
        interrupt,
        tune_config=_tune_config(grid, search_space, rows, remaining),
        param_space={"spec": pack(grid.search_spec(key)), "hp": space},
        budget=budget if budget.active else None,
        total=remaining,
    )
    if stopper.reason == "interrupt" or (interrupt is not None and interrupt.is_set()):
        return False
    if stopper.reason == "budget":
        rows = search_rows(results, key)
        summary.budget_stopped.append(key)
        echo(
            f"search phase: {key}: its {budget.describe()} is spent after {len(rows)} trial(s) "
            f"({rows['reserved_cpu_s'].sum():.1f} CPU-s, {rows['reserved_gpu_s'].sum():.1f} GPU-s reserved)"
        )
    return True


def _tune_config(
    grid: Grid, search_space: dict[str, Any], rows: pd.DataFrame, remaining: int | None
) -> tune.TuneConfig:
    """A cell's search experiment: ``remaining`` trials (-1: until the budget stops it), its searcher told
    about the cell's recorded trials ``rows``, and the grid's scheduler and concurrency."""
    settings = grid.search
    concurrency = settings.max_concurrent or grid.max_concurrent_trials
    return tune.TuneConfig(
        metric=settings.metric,
        mode=settings.mode,
        num_samples=-1 if remaining is None else remaining,
        search_alg=_search_algorithm(
            settings,
            seed=grid.seeds[0] + len(rows),  # a new stream once trials are recorded: no configuration redrawn
            history=searcher_history(rows, search_space, settings.metric) if not rows.empty else [],
            max_concurrent=concurrency,
        ),
        scheduler=_scheduler(settings),
        # Tune applies max_concurrent_trials to a Searcher (TPE) only; random search takes its own
        max_concurrent_trials=concurrency if settings.algorithm == "tpe" else None,
        reuse_actors=True,
    )


def _why_nothing_selected(rows: pd.DataFrame, metric: str) -> str:
    """Why a cell's recorded search trials ``rows`` leave no configuration to select."""
    failed = int((rows["status"] == "failed").sum()) if not rows.empty else 0
    if rows.empty:
        return "no search trial was recorded"
    if failed == len(rows):
        return f"every one of its {failed} search trial(s) failed (e.g. {rows['error'].iloc[-1]})"
    return f"none of its {len(rows)} search trial(s) ran to its end with a finite {metric} ({failed} failed)"


def _search_algorithm(settings: Any, seed: int, history: list | None = None, max_concurrent: int | None = None) -> Any:
    if settings.algorithm == "tpe":
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return UrsaOptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed), history=history or [])
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=seed, max_concurrent=max_concurrent or 0)


def _scheduler(settings: Any) -> Any:
    if settings.scheduler == "asha":
        return tune.schedulers.ASHAScheduler(time_attr="training_iteration", grace_period=1, reduction_factor=2)
    return None


class UrsaOptunaSearch(OptunaSearch):
    """Ray Tune's OptunaSearch, told about failed trials and about the trials of earlier runs.

    - A result without a finite selection metric (a failed trial reports none) is not an intermediate value,
      and a trial that ends without one, or failed, is told to Optuna as pruned: TPE ranks it below every
      completed configuration (a failed trial is never a good value).
    - ``history`` (:func:`searcher_history`): the cell's recorded search trials, added to the study as soon
      as Tune has given it its search space, so a resumed search learns from them.
    """

    def __init__(self, *args: Any, history: list | None = None, **kwargs: Any):
        self._history = list(history or [])
        super().__init__(*args, **kwargs)

    def _setup_study(self, mode: Any) -> None:
        super()._setup_study(mode)
        for params, value, state in self._history:
            pruned = state == "pruned"
            self.add_evaluated_point(
                params, value, pruned=pruned, intermediate_values=[value] if pruned and value is not None else None
            )

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if _finite(result.get(self.metric)):
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result and (result.get("status") == "failed" or not _finite(result.get(self.metric))):
            result = {k: v for k, v in result.items() if k != self.metric}  # no value: pruned (error: failed)
        super().on_trial_complete(trial_id, result=result, error=error)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
