"""Grid syntax of the hyperparameter search phase: per-method search spaces and the search settings.

A method entry may carry ``search: {param: {type: uniform|loguniform|int|choice, low, high | values}}``; the
grid's ``search`` block sets the algorithm (random, or Optuna's TPE through Ray Tune's OptunaSearch), the
number of search trials and/or a compute budget in reserved CPU- or GPU-seconds, optional ASHA early
stopping, the concurrency, the selection metric and the validation fraction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the grid's syntax is read without importing torch (the run's driver never does)
    from ursa_ray.methods.base import Hyperparameter

SPACE_TYPES = ("uniform", "loguniform", "int", "choice")
SEARCH_KEYS = {
    "algorithm": "random or tpe",
    "n_trials": "search trials per cell (positive integer)",
    "cpu_seconds": "compute budget per cell in reserved CPU-seconds",
    "gpu_seconds": "compute budget per cell in reserved GPU-seconds",
    "scheduler": "none or asha",
    "metric": "the selection metric",
    "validation_fraction": "share of the training set held out for validation, in (0, 1)",
    "max_concurrent": "search trials running at once (positive integer)",
}


@dataclass(frozen=True)
class SelectionMetric:
    """A validation metric the search phase may select on: whether lower or higher is better, and the
    tasks whose validation evaluation reports it (classification: the keys of
    :func:`~ursa_ray.evaluation.metrics.classification_metrics`; regression: those of
    :func:`~ursa_ray.evaluation.metrics.regression_metrics` against the observed targets), each prefixed
    ``val_``."""

    mode: str
    tasks: tuple[str, ...]


SELECTION_METRICS = {
    "val_nll": SelectionMetric("min", ("classification", "regression")),
    "val_accuracy": SelectionMetric("max", ("classification",)),
    "val_brier": SelectionMetric("min", ("classification",)),
    "val_ece": SelectionMetric("min", ("classification",)),
    "val_rmse": SelectionMetric("min", ("regression",)),
}


@dataclass(frozen=True)
class SearchSettings:
    algorithm: str
    n_trials: int | None  # None: only a compute budget limits the search
    cpu_seconds: float | None
    gpu_seconds: float | None
    scheduler: str
    metric: str
    validation_fraction: float
    max_concurrent: int | None

    @property
    def mode(self) -> str:
        return SELECTION_METRICS[self.metric].mode


Fail = Callable[[str, str, str], Exception]


def check_value(hp: Hyperparameter, value: Any) -> Any:
    """``hp.check(value)`` (the value coerced to its kind, or ValueError naming what is allowed), refusing NaN
    and infinities too: they pass a range check such as ``>= 0`` (``inf``) or every comparison (``nan``)."""
    value = hp.check(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return value


def parse_search_settings(path: str, raw: Any, fail: Fail) -> SearchSettings | None:
    """Validate the grid's ``search`` block (None when absent)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail(path, "search", f"expected a mapping with keys {sorted(SEARCH_KEYS)}")
    for key in raw:
        if key not in SEARCH_KEYS:
            raise fail(path, f"search.{key}", f"unknown key; allowed: {', '.join(SEARCH_KEYS)}")
    algorithm = raw.get("algorithm", "random")
    if algorithm not in ("random", "tpe"):
        raise fail(path, "search.algorithm", f"expected one of random, tpe; got {algorithm!r}")
    scheduler = raw.get("scheduler", "none")
    if scheduler not in ("none", "asha"):
        raise fail(path, "search.scheduler", f"expected one of none, asha; got {scheduler!r}")
    metric = raw.get("metric", "val_nll")
    if metric not in SELECTION_METRICS:
        raise fail(path, "search.metric", f"expected one of {', '.join(SELECTION_METRICS)}; got {metric!r}")

    def positive(key: str, integer: bool) -> Any:
        value = raw.get(key)
        if value is None:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float)) and math.isfinite(value)
        if isinstance(value, bool) or not ok or value <= 0:
            raise fail(
                path, f"search.{key}", f"expected a positive {'integer' if integer else 'number'}, got {value!r}"
            )
        return value

    n_trials = positive("n_trials", True)
    cpu_seconds = positive("cpu_seconds", False)
    gpu_seconds = positive("gpu_seconds", False)
    if n_trials is None and cpu_seconds is None and gpu_seconds is None:
        raise fail(path, "search", "give n_trials, cpu_seconds or gpu_seconds (or several)")
    fraction = raw.get("validation_fraction", 0.2)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise fail(path, "search.validation_fraction", f"expected a number in (0, 1), got {fraction!r}")
    return SearchSettings(
        algorithm=algorithm,
        n_trials=n_trials,
        cpu_seconds=cpu_seconds,
        gpu_seconds=gpu_seconds,
        scheduler=scheduler,
        metric=metric,
        validation_fraction=float(fraction),
        max_concurrent=positive("max_concurrent", True),
    )


def parse_search_space(
    path: str, where: str, declared: tuple[Hyperparameter, ...], raw: Any, fail: Fail
) -> dict[str, dict[str, Any]]:
    """Validate one method's search space; every bound or value must be allowed for its hyperparameter."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise fail(path, where, "expected a mapping of hyperparameter name to {type, low, high | values}")
    table = {h.name: h for h in declared}
    space = {}
    for name, dist in raw.items():
        here = f"{where}.{name}"
        if name not in table:
            raise fail(path, here, f"unknown hyperparameter; allowed: {', '.join(table)}")
        if not isinstance(dist, dict) or dist.get("type") not in SPACE_TYPES:
            raise fail(path, here, f"expected {{type: one of {', '.join(SPACE_TYPES)}, ...}}")
        kind = dist["type"]
        allowed = {"type", "values"} if kind == "choice" else {"type", "low", "high"}
        for key in dist:
            if key not in allowed:
                raise fail(path, f"{here}.{key}", f"unknown key for {kind}; allowed: {', '.join(sorted(allowed))}")
        hp = table[name]
        try:
            if kind == "choice":
                values = dist.get("values")
                if not isinstance(values, list) or not values:
                    raise ValueError("choice needs a non-empty list 'values'")
                space[name] = {"type": kind, "values": [check_value(hp, v) for v in values]}
                continue
            if "low" not in dist or "high" not in dist:
                raise ValueError(f"{kind} needs low and high")
            if kind == "int" and hp.kind is not int:
                raise ValueError(f"{name} is a {hp.kind.__name__}; use uniform or loguniform")
            if kind in ("uniform", "loguniform") and hp.kind is not float:
                raise ValueError(f"{name} is a {hp.kind.__name__}; use {'int' if hp.kind is int else 'choice'}")
            low, high = check_value(hp, dist["low"]), check_value(hp, dist["high"])
            if not low < high:
                raise ValueError(f"expected low < high, got {low} and {high}")
            if kind == "loguniform" and low <= 0:
                raise ValueError(f"loguniform needs low > 0, got {low}")
            space[name] = {"type": kind, "low": low, "high": high}
        except ValueError as exc:
            raise fail(path, here, str(exc)) from None
    return space
