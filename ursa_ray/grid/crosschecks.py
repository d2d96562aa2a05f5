"""The checks across a grid's keys, run once every key is checked (:func:`ursa_ray.grid.schema.parse_grid`):
each method pairs only with models and datasets it can run on, each method's declared constraints hold on every
resolved configuration and at the corners of its search space, the search's selection metric is one every
searched dataset reports, each reference block serves a cell, and the grid's trials are within ``max_trials``."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ursa_ray.grid.entries import MethodEntry
from ursa_ray.grid.expand import Grid, layers
from ursa_ray.grid.fields import fail
from ursa_ray.search_space import SELECTION_METRICS

if TYPE_CHECKING:
    from ursa_ray.methods.base import Constraint


def check_pairings(grid: Grid) -> None:
    """Every (method, model, dataset) the grid pairs fits: the model takes the dataset's task, the method
    supports it (and temperature scaling is asked only on classification), and the method's constraints hold
    (:func:`check_constraints`)."""
    from ursa_ray import methods, models

    for m in grid.methods:
        for mo in grid.models:
            spec = models.get_model(mo.name)
            for d in grid.datasets:
                if m.pairs_with(mo.name, d.name) and d.task not in spec.tasks:
                    raise fail(
                        grid.path,
                        "models",
                        f"model {mo.name!r} does not fit the {d.task} dataset {d.name!r} (method {m.label}); "
                        "restrict the method with 'models:' or 'datasets:'",
                    )
    for i, m in enumerate(grid.methods):
        tasks = methods.get_method(m.name).tasks  # None: every task
        for d in grid.datasets:
            paired = any(m.pairs_with(mo.name, d.name) for mo in grid.models)
            if tasks is not None and d.task not in tasks and paired:
                raise fail(
                    grid.path,
                    f"methods[{i}]",
                    f"method {m.label!r} supports {' and '.join(tasks)} datasets only, not the {d.task} dataset "
                    f"{d.name!r}; restrict it with 'datasets:'",
                )
            if m.calibrate is not None and d.task != "classification" and paired:
                raise fail(
                    grid.path,
                    f"methods[{i}].calibrate",
                    f"temperature scaling applies to classification datasets only, not the {d.task} dataset "
                    f"{d.name!r}; restrict the method with 'datasets:'",
                )
        check_constraints(grid, i, m)


def corners(space: dict[str, dict[str, Any]], names: list[str]) -> list[dict[str, tuple[Any, str]]]:
    """Every combination of the ends of the ranges (each value of a choice) of the searched ``names``, as
    {name: (value, where it sits in the space)}."""
    options = []
    for name in names:
        dist = space[name]
        if dist["type"] == "choice":
            options.append([(name, v, "one of its search choices") for v in dist["values"]])
        else:
            options.append([(name, dist[end], f"the {end} end of its search range") for end in ("low", "high")])
    return [{name: (value, place) for name, value, place in combo} for combo in itertools.product(*options)]


def check_constraints(grid: Grid, index: int, entry: MethodEntry) -> None:
    """Every constraint of ``entry``'s method (:class:`~ursa_ray.methods.base.Constraint`) on the entry's
    resolved configuration with each model it runs on; a constraint on searched hyperparameters at every
    corner of the search space instead; and the method's refusal of a model (:meth:`Method.model_refusal`) at
    every corner.  The GridError names the grid field that set one of the values, and where each value involved
    came from."""
    from ursa_ray import methods, models
    from ursa_ray.methods.base import resolve_config

    method = methods.get_method(entry.name)
    where = f"methods[{index}]"
    for model in [m.name for m in grid.models]:
        if entry.models is not None and model not in entry.models:
            continue
        config, source = _resolved(entry, where, model, grid.budget, method, resolve_config)
        owner = f"method {entry.label}" + (f" on model {model}" if entry.model_hyperparameters else "")
        for constraint in method.constraints:
            searched = [n for n in constraint.names if n in entry.search_space]
            for corner in corners(entry.search_space, searched):  # one empty corner when nothing is searched
                message = constraint.violation({**config, **{n: v for n, (v, _) in corner.items()}}, None)
                if message is None:
                    continue
                field_ = _culprit(constraint, where, searched, source)
                raise fail(grid.path, field_, f"{message} ({owner}; {_origins(constraint, corner, source)})")
        model_spec = models.get_model(model)
        for corner in corners(entry.search_space, list(entry.search_space)):
            message = method.model_refusal(model_spec, {**config, **{n: v for n, (v, _) in corner.items()}})
            if message is not None:
                at = ", ".join(f"{n}={v} ({place})" for n, (v, place) in corner.items())
                searched = f"; with {at}" if corner else ""
                raise fail(grid.path, where, f"{message} (method {entry.label} on model {model}{searched})")


def _resolved(
    entry: MethodEntry, where: str, model: str, budget: dict[str, int], method: Any, resolve_config: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """(``entry``'s resolved configuration on ``model``, {hyperparameter: the grid field that set it})."""
    fields = {
        "budget": "budget",
        "hyperparameters": f"{where}.hyperparameters",
        "model_hyperparameters": f"{where}.model_hyperparameters.{model}",
    }
    given: dict[str, Any] = {}
    source: dict[str, str] = {}
    for kind, layer in layers(entry, model, budget):
        for name, value in layer.items():
            given[name] = value
            source[name] = f"{fields[kind]}.{name}"
    return resolve_config(method, given), source


def _culprit(constraint: Constraint, where: str, searched: list[str], source: dict[str, str]) -> str:
    """The grid field to name for a violated constraint: its first searched hyperparameter's search space,
    else the field that set its first hyperparameter the grid sets, else the method entry."""
    if searched:
        return f"{where}.search.{searched[0]}"
    return next((source[n] for n in constraint.names if n in source), where)


def _origins(constraint: Constraint, corner: dict[str, tuple[Any, str]], source: dict[str, str]) -> str:
    """Where each hyperparameter of ``constraint`` got its value: a corner of the search space, a grid
    field, or the method's default."""
    parts = []
    for name in constraint.names:
        if name in corner:
            value, place = corner[name]
            parts.append(f"{name}={value!r} at {place}")
        else:
            parts.append(f"{name} from {source.get(name, 'the default')}")
    searched = f"every configuration of the search space must satisfy {constraint.rule}; " if corner else ""
    return searched + ", ".join(parts)


def check_selection_metric(grid: Grid) -> None:
    """The search phase's selection metric is one that every searched dataset's task reports on its
    validation split (``val_rmse`` only for regression, ``val_accuracy`` only for classification, ...)."""
    search = grid.search
    if search is None:
        return
    model_names = [m.name for m in grid.models]
    searched = [
        (d, m)
        for m in grid.methods
        if m.search_space
        for d in grid.datasets
        if any(m.pairs_with(model, d.name) for model in model_names)
    ]
    tasks = sorted({d.task for d, _ in searched})
    allowed = [name for name, metric in SELECTION_METRICS.items() if set(tasks) <= set(metric.tasks)]
    for d, m in searched:
        if d.task not in SELECTION_METRICS[search.metric].tasks:
            raise fail(
                grid.path,
                "search.metric",
                f"{search.metric} is not reported on the validation split of the {d.task} dataset {d.name!r} "
                f"(searched by method {m.label}); allowed for {' and '.join(tasks)}: {', '.join(allowed)}",
            )


def check_references_serve(grid: Grid) -> None:
    """Refuse a ``reference`` block that gives no classification cell (model, dataset) of the grid its
    reference: none matches it, or an earlier block matches each first."""
    served = {id(block) for block, _ in grid.reference_cells()}
    for block in grid.references:
        if id(block) not in served:
            cells = [c for c in grid.cells() if c["dataset"].task == "classification"]
            pairs = sorted({f"{c['model'].name}/{c['dataset'].name}" for c in cells}) or ["none"]
            raise fail(
                grid.path,
                block.field_name,
                "gives no cell its reference: it matches no classification (model, dataset) of the grid that an "
                f"earlier block does not (the grid's classification cells, model/dataset: {', '.join(pairs)})",
            )


def check_trial_count(grid: Grid) -> None:
    """The grid's final trials (cells × seeds, counted without building them) are at most its ``max_trials``."""
    n_final = grid.n_final_trials()
    if n_final > grid.max_trials:
        raise fail(
            grid.path,
            "seeds",
            f"{len(grid.cells())} cells x {len(grid.seeds):,} seeds = {n_final:,} final trials, more than "
            f"max_trials ({grid.max_trials:,}); use fewer seeds or cells, or set max_trials: {n_final} to run them all",
        )
