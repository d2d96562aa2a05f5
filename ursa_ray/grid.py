"""Grid files: parse with yaml.safe_load, validate everything up front, expand into trial specs.

A grid names methods, models, datasets and seeds; every (method, model, dataset[, complexity], seed) is one
final-phase trial.  Validation rejects a bad grid before any trial starts with a one-line
:class:`GridError` naming the file, the field and what is allowed: field by field, then across fields (each
method's declared constraints on every resolved configuration and at the corners of its search space, and a
selection metric that every searched dataset's task reports).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ursa_ray.registry import RegistryError
from ursa_ray.search_space import (
    SEARCH_KEYS,
    SELECTION_METRICS,
    SearchSettings,
    check_value,
    parse_search_settings,
    parse_search_space,
)
from ursa_ray.spec import REFERENCE_LOCATION_KEYS, TrialSpec

if TYPE_CHECKING:
    from ursa_ray.methods.base import Constraint, Hyperparameter

# The registries (methods, models, datasets) and the evaluation modules import torch: they are imported where a
# grid is validated or its specs built, never on import, so that a run's Tune driver, which gets a validated grid
# with its final specs built (:meth:`Grid.trial_specs`), runs without torch (docs/performance.md, "Driver memory
# per trial").
BUDGET_KEYS = ("epochs", "n_samples", "batch_size")
"""The keys of the grid's ``budget`` block: hyperparameters it sets for every method that declares them."""

DEFAULT_VECTORIZE_SEEDS = 8
"""Seeds per batched trial when a grid does not say (see :meth:`Grid.vectorized_seeds`)."""
MAX_SEED = 2**31 - 1
"""The largest seed a grid may give: every generator a seed reaches accepts it (``numpy.random.SeedSequence``,
``torch.Generator``, and the 32-bit legacy seeding of Optuna's TPE sampler, which the search phase seeds with
the first seed plus the number of search trials), and so do the int64 columns of the results."""
DEFAULT_MAX_TRIALS = 100_000
"""The most final trials a grid may have unless its ``max_trials`` key allows more (validation counts them
without expanding them)."""
MAX_YAML_NODES = 100_000
"""The most YAML nodes a grid file may hold once its aliases are expanded (a few hundred in a real grid; a
"billion laughs" alias bomb is refused before anything reads it)."""
GRID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A grid's name, used as the default results folder ``results/<name>``: one path component."""

TOP_KEYS = {
    "name": "a name for the grid (string)",
    "description": "free text",
    "methods": "a non-empty list of methods",
    "models": "a non-empty list of models",
    "datasets": "a non-empty list of datasets",
    "seeds": f"an integer n (seeds 0..n-1) or a non-empty list of distinct integers in [0, {MAX_SEED}]",
    "max_trials": f"the most final trials the grid may have (a positive integer, default {DEFAULT_MAX_TRIALS:,})",
    "resources": "per-trial resources {cpu, gpu, custom} (a method or model entry may give its own)",
    "budget": f"defaults for {list(BUDGET_KEYS)}",
    "save_predictions": "true or false",
    "adversarial": "adversarial evaluation {attacks, epsilons, n_examples, attack_samples, pgd_steps, transfer}",
    "corruptions": "common-corruption evaluation sets {types, severities, n_examples}; types: a list or all",
    "bit_depths": "weight storage schemes the posterior predictive is also evaluated at: a list of float16, "
    "bfloat16, int8 (default all three; [] for none)",
    "data_root": "a directory (URSA_DATA overrides it)",
    "download": "true or false: let torchvision download missing data (needs internet)",
    "max_concurrent_trials": "a positive integer",
    "precision": "training precision: bf16-mixed or float32 (default: bf16-mixed for classification on a GPU, "
    "float32 otherwise)",
    "max_failures": "retries of a trial whose worker died (non-negative integer)",
    "vectorize_seeds": "the most seeds of one cell trained as one batched computation in one trial "
    f"(a positive integer, default {DEFAULT_VECTORIZE_SEEDS}; 1 runs every seed alone)",
    "search": f"the hyperparameter search phase {sorted(SEARCH_KEYS)}",
    "reference": "a reference posterior for the classification cells: a block {method: hmc, chains, n_samples, "
    "burn_in, prior_std, temperature, ..., dir} or {file: PATH}, or a list of blocks each selecting cells with "
    "models: and datasets: (docs/fidelity.md)",
    "statistics": "how the report's per-cell intervals over seeds are computed {interval: t or bootstrap} "
    "(default t; docs/statistics.md)",
}
STATISTICS_INTERVALS = ("t", "bootstrap")
"""The values of the grid's ``statistics.interval`` (the same as :data:`analysis.intervals.INTERVALS`)."""
REQUIRED = ("name", "methods", "models", "datasets", "seeds")
METHOD_KEYS = (
    "name",
    "label",
    "models",
    "datasets",
    "hyperparameters",
    "model_hyperparameters",
    "search",
    "vectorize_seeds",
    "resources",
    "calibrate",
)
CALIBRATIONS = ("temperature",)
"""The values of a method entry's ``calibrate``: post-hoc temperature scaling (Guo et al. 2017) on a held-out
validation split (:mod:`ursa_ray.evaluation.probes.calibration`)."""
MODEL_KEYS = ("name", "options", "resources")
DATASET_KEYS = ("name", "ood", "complexity", "options", "file")
RESOURCE_KEYS = ("cpu", "gpu", "custom")
DEFAULT_RESOURCES: dict[str, Any] = {"cpu": 1, "gpu": 0, "custom": {}}
"""A trial's resources when neither the grid nor its method or model entry says."""


class GridError(ValueError):
    """A grid that cannot run; the message is one line naming the file, the field and what is allowed."""


@dataclass(frozen=True)
class MethodEntry:
    name: str
    label: str
    models: tuple[str, ...] | None
    hyperparameters: dict[str, Any]
    search_space: dict[str, dict[str, Any]]
    model_hyperparameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasets: tuple[str, ...] | None = None
    vectorize_seeds: int | None = None
    """This entry's own ``vectorize_seeds`` (None: the grid's)."""
    resources: dict[str, Any] = field(default_factory=dict)
    """The resource keys this entry gives itself (``cpu``, ``gpu``, ``custom``; see :meth:`Grid.resources_for`)."""
    calibrate: str | None = None
    """The entry's post-hoc calibration (:data:`CALIBRATIONS`); None: none."""

    def pairs_with(self, model: str, dataset: str) -> bool:
        """Whether this method runs on (model, dataset), given its optional restrictions."""
        return (self.models is None or model in self.models) and (self.datasets is None or dataset in self.datasets)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    options: dict[str, Any]
    resources: dict[str, Any] = field(default_factory=dict)
    """The resource keys this entry gives itself (``cpu``, ``gpu``, ``custom``; see :meth:`Grid.resources_for`)."""


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    task: str
    ood: tuple[str, ...]
    complexity: tuple[float, ...] | None
    options: dict[str, Any]
    file: dict[str, Any] | None = None  # a dataset read from files: its checked `file` block (data/files.py)
    sweep: str | None = None
    """The dataset option ``complexity`` sweeps (:attr:`ursa_ray.data.base.DatasetSpec.sweep`; None: none)."""


@dataclass(frozen=True)
class ReferenceBlock:
    """One block of the grid's ``reference``: the settings the final specs of the cells it serves carry
    (:attr:`~ursa_ray.spec.TrialSpec.reference`: HMC settings and an optional ``dir``, absolute; or ``file``,
    absolute, with the ``sha256`` of its bytes) and the cells it may serve (``models``, ``datasets``; None: all)."""

    settings: dict[str, Any]
    models: tuple[str, ...] | None = None
    datasets: tuple[str, ...] | None = None
    field_name: str = "reference"
    """Where the block is in the grid (``reference`` or ``reference[i]``), for error messages."""

    def matches(self, model: str, dataset: str) -> bool:
        return (self.models is None or model in self.models) and (self.datasets is None or dataset in self.datasets)


@dataclass(frozen=True)
class Grid:
    """A validated grid."""

    path: str
    name: str
    description: str
    methods: tuple[MethodEntry, ...]
    models: tuple[ModelEntry, ...]
    datasets: tuple[DatasetEntry, ...]
    seeds: Sequence[int]
    """The seeds, distinct integers in [0, :data:`MAX_SEED`]; ``seeds: n`` gives ``range(n)`` (never a list of n)."""
    resources: dict[str, Any]
    """The grid-level ``resources``, every key filled in: what a trial gets unless its method or model entry
    says otherwise (:meth:`resources_for`)."""
    budget: dict[str, int]
    save_predictions: bool
    bit_depths: tuple[str, ...]
    corruptions: dict[str, Any]
    adversarial: dict[str, Any]
    data_root: str | None
    download: bool
    max_concurrent_trials: int | None
    max_failures: int
    search: SearchSettings | None
    vectorize_seeds: int = DEFAULT_VECTORIZE_SEEDS
    max_trials: int = DEFAULT_MAX_TRIALS
    precision: str | None = None
    """The grid's ``precision`` (:data:`~ursa_ray.methods._training.PRECISIONS`); None: each trial's default."""
    source: str = ""
    """The grid as written (its YAML text), kept beside the results as ``grid.yaml``."""
    references: tuple[ReferenceBlock, ...] = ()
    """The validated ``reference`` blocks (:mod:`ursa_ray.reference`), in the grid's order: a classification
    cell's reference is the first block that matches it (:meth:`reference_for`); empty: no reference."""
    statistics: dict[str, str] = field(default_factory=lambda: {"interval": "t"})
    """The validated ``statistics`` block (:func:`parse_statistics`): how ``ursa-ray report`` computes intervals;
    it changes no trial."""
    _final_specs: list[TrialSpec] = field(default_factory=list, init=False, compare=False, repr=False)
    """The final specs without overrides once built (:meth:`trial_specs`): pickled with the grid, so the driver
    reads them without the registries."""

    def cells(self) -> list[dict[str, Any]]:
        """(method, model, dataset, complexity) combinations, each a dict ready for trial specs."""
        out = []
        for m in self.methods:
            for mo in self.models:
                for d in self.datasets:
                    if not m.pairs_with(mo.name, d.name):
                        continue
                    for c in d.complexity or (None,):
                        options = dict(d.options)
                        if c is not None:
                            options[d.sweep] = c
                        out.append(
                            {"method": m, "model": mo, "dataset": d, "complexity": c, "dataset_options": options}
                        )
        return out

    def reference_for(self, model: str, dataset: str) -> ReferenceBlock | None:
        """The block giving the classification cell (``model``, ``dataset``) its reference: the first that
        matches it; None: the cell has none."""
        return next((block for block in self.references if block.matches(model, dataset)), None)

    def reference_cells(self) -> list[tuple[ReferenceBlock, dict[str, Any]]]:
        """(block, cell) for each classification (model, dataset, dataset options) of the grid with a reference,
        the cell being the first of :meth:`cells` on it."""
        out: dict[str, tuple[ReferenceBlock, dict[str, Any]]] = {}
        for cell in self.cells():
            block = self.reference_for(cell["model"].name, cell["dataset"].name)
            key = json.dumps([cell["model"].name, cell["dataset"].name, cell["dataset_options"]], default=str)
            if block is not None and cell["dataset"].task == "classification":
                out.setdefault(key, (block, cell))
        return list(out.values())

    def n_final_trials(self) -> int:
        """How many final-phase trials the grid has (cells × seeds), counted without building them."""
        return len(self.cells()) * len(self.seeds)

    def check_cells(self) -> None:
        """Resolve every cell's configuration as its trials will (one spec per cell, with the first seed: the
        other seeds differ only in their seed), without building every trial's spec."""
        for cell in self.cells():
            self.spec_for(cell, self.seeds[0], "final", {})

    def trial_specs(self, phase: str = "final", overrides: dict[str, dict[str, Any]] | None = None) -> list[TrialSpec]:
        """Every trial of the grid in ``phase`` (final by default), one spec each.

        ``overrides`` maps a cell key (see :func:`cell_key`) to the hyperparameters found by the search
        phase; they replace the grid's fixed values for that cell.  The final specs without overrides are built
        once (the grid is immutable); each call returns a new list of them.
        """
        if phase == "final" and not overrides and self._final_specs:
            return list(self._final_specs)
        specs = []
        for cell in self.cells():
            key = cell_key(cell)
            extra = (overrides or {}).get(key, {})
            for seed in self.seeds:
                specs.append(self.spec_for(cell, seed, phase, extra))
        if phase == "final" and self.adversarial["transfer"]:
            specs = _link_transfer_sources(specs)
        if phase == "final" and self.references:
            references, specs = _link_references(specs)
            specs = references + specs
        if phase == "final" and not overrides:
            self._final_specs[:] = specs
            return list(specs)
        return specs

    def spec_for(self, cell: dict[str, Any], seed: int, phase: str, extra: dict[str, Any]) -> TrialSpec:
        """The spec of ``cell``'s trial with ``seed`` in ``phase``, its configuration the grid's fixed values
        with ``extra`` (a search's sampled or selected hyperparameters) over them: the one place a
        :class:`~ursa_ray.spec.TrialSpec` is made."""
        from ursa_ray import data, methods
        from ursa_ray.methods.base import resolve_config

        m: MethodEntry = cell["method"]
        fixed = {k: v for _, layer in _layers(m, cell["model"].name, self.budget) for k, v in layer.items()}
        task = cell["dataset"].task
        block = self.reference_for(cell["model"].name, cell["dataset"].name)
        spec = TrialSpec(
            phase=phase,
            method=m.name,
            label=m.label,
            model=cell["model"].name,
            model_options=cell["model"].options,
            dataset=cell["dataset"].name,
            task=task,
            decision_task=data.dataset_spec(cell["dataset"].name, cell["dataset"].file).decision_task,
            dataset_options=cell["dataset_options"],
            dataset_file=cell["dataset"].file,
            complexity=cell["complexity"],
            ood=tuple(cell["dataset"].ood),
            seed=int(seed),
            config=resolve_config(methods.get_method(m.name), {**fixed, **extra}),
            save_predictions=self.save_predictions,
            bit_depths=tuple(self.bit_depths),
            precision=self.precision,
            corruptions=self.corruptions,
            adversarial=self.adversarial,
            data_root=self.data_root,
            download=self.download,
            resources=self.resources_for(m, cell["model"]),
            cell=cell_key(cell),
            vectorize_seeds=self.vectorized_seeds(m, cell["model"].name) if phase == "final" else 1,
            validation_fraction=(
                self.search.validation_fraction if phase == "search" and self.search is not None else None
            ),
            reference=block.settings if block is not None and phase == "final" and task == "classification" else None,
            calibrate=m.calibrate if phase == "final" else None,
        )
        return dataclasses.replace(spec, trial_id=trial_id(spec))

    def resources_for(self, method: MethodEntry, model: ModelEntry) -> dict[str, Any]:
        """The resources one trial of ``method`` on ``model`` asks Ray for, ``{cpu, gpu, custom}``.

        Merged key by key, the most specific first: the method entry's ``resources``, then the model entry's,
        then the grid's (whose missing keys default to ``cpu: 1, gpu: 0, custom: {}``).  A method giving only
        ``gpu`` keeps the model's (or the grid's) ``cpu``.  ``custom`` is one key: the most specific mapping
        given replaces the others whole (``custom: {}`` drops the grid's custom resources).  Resources are
        not part of a trial's identity (:func:`trial_id`): changing them reruns nothing."""
        merged = {**self.resources, **model.resources, **method.resources}
        return {"cpu": merged["cpu"], "gpu": merged["gpu"], "custom": dict(merged["custom"])}

    def vectorized_seeds(self, entry: MethodEntry, model: str) -> int:
        """How many seeds of ``entry`` on ``model`` one final-phase trial trains as one batched computation:
        the entry's ``vectorize_seeds``, else the grid's, when the method has a batched stream
        (``Method.batchable``) and the model declares itself ``batchable``; else 1.  (At run time a
        trial splits its seeds further when their copies would not fit
        :data:`~ursa_ray.methods.batched.COPY_MEMORY_BUDGET`.)"""
        from ursa_ray import methods, models

        method = methods.get_method(entry.name)
        if not method.batchable or not models.get_model(model).batchable:
            return 1
        return entry.vectorize_seeds or self.vectorize_seeds


TRANSFER_SOURCE_METHOD = "sgd"
"""The method whose adversarial examples every other method of the same (model, dataset, seed) is scored on."""


def _link_transfer_sources(specs: list[TrialSpec]) -> list[TrialSpec]:
    """Final ``specs`` with the transfer attack's trials marked (in-domain classification only): the first
    ``sgd`` entry's trial of each (model, dataset, dataset options, seed) gets ``transfer_source=True``, every
    other trial of the same (model, dataset, options, seed) ``transfer_from``: that trial's id.  The run
    orchestration runs the sources first and hands the others the examples they saved."""

    def where(spec: TrialSpec) -> str:
        return json.dumps(
            [spec.model, spec.model_options, spec.dataset, spec.dataset_options, spec.seed], sort_keys=True
        )

    sources: dict[str, str] = {}
    for spec in specs:
        if spec.task == "classification" and not spec.decision_task and spec.method == TRANSFER_SOURCE_METHOD:
            sources.setdefault(where(spec), spec.trial_id)
    marked = []
    for spec in specs:
        source = sources.get(where(spec))
        if source == spec.trial_id:
            spec = dataclasses.replace(spec, transfer_source=True)
        elif source is not None:
            spec = dataclasses.replace(spec, transfer_from=source)
        marked.append(spec)
    return marked


def _link_references(specs: list[TrialSpec]) -> tuple[list[TrialSpec], list[TrialSpec]]:
    """(the reference trials, ``specs`` linked to them) of final ``specs``: one reference per classification
    (model, options, dataset, options, file, OOD sets) whose specs carry computed ``reference`` settings, phase
    ``reference`` (:func:`ursa_ray.reference.reference_spec`, cell ``reference/MODEL/DATASET``), made from the
    first spec of that cell; every spec of the cell gets ``reference_from``: its id.  The run orchestration runs
    the references first and the others once theirs has finished.  A reference from file has no trial."""
    from ursa_ray import reference

    def where(spec: TrialSpec) -> str:
        keys = (spec.model, spec.model_options, spec.dataset, spec.dataset_options, spec.dataset_file, spec.ood)
        return json.dumps(list(keys), sort_keys=True, default=str)

    made: dict[str, TrialSpec] = {}
    linked = []
    for spec in specs:
        if spec.reference is None or "file" in spec.reference:
            linked.append(spec)
            continue
        ref = made.get(where(spec))
        if ref is None:
            ref = dataclasses.replace(
                reference.reference_spec(spec, spec.reference),
                cell=f"reference/{spec.model}/{spec.dataset}",
                vectorize_seeds=1,
                transfer_from=None,
            )
            ref = made[where(spec)] = dataclasses.replace(ref, trial_id=trial_id(ref))
        linked.append(dataclasses.replace(spec, reference_from=ref.trial_id))
    return list(made.values()), linked


def _layers(entry: MethodEntry, model: str, budget: Mapping[str, int]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The grid's settings of ``entry``'s fixed configuration on ``model``, lowest precedence first (each
    overrides the method's defaults and the layers before it), each with the kind of field holding it:
    ``budget`` (the keys the method declares), ``hyperparameters`` and ``model_hyperparameters``."""
    from ursa_ray import methods

    declared = {h.name for h in methods.get_method(entry.name).hyperparameters}
    return (
        ("budget", {k: v for k, v in budget.items() if k in declared}),
        ("hyperparameters", entry.hyperparameters),
        ("model_hyperparameters", entry.model_hyperparameters.get(model, {})),
    )


def cell_key(cell: dict[str, Any]) -> str:
    """A readable, unique name of a (method label, model, dataset, complexity) cell."""
    parts = [cell["method"].label, cell["model"].name, cell["dataset"].name]
    if cell["complexity"] is not None:
        parts.append(f"c{cell['complexity']:g}")
    return "/".join(parts)


def trial_id(spec: TrialSpec) -> str:
    """Deterministic id: the same trial in a rerun of the same grid gets the same id (this makes resume work).
    It hashes everything a result depends on: phase, method, model and dataset with their options, OOD sets,
    seed, configuration, the entry's ``calibrate``, and for a dataset read from files its ``file`` block with
    the sha256 of the files' content (so changed data is a new trial, and a new grid for
    :func:`ursa_ray.guard.grid_fingerprint`), but not the files' paths (moving the project keeps a results
    directory resumable); and the settings of the cell's reference, which its fidelity rows depend on (a
    file's sha256, not its path; not the store's ``dir`` nor the reference trial's ``resources``)."""
    identity = {
        k: getattr(spec, k)
        for k in ("phase", "method", "model", "model_options", "dataset", "dataset_options", "ood", "seed", "config")
    }
    if spec.precision is not None:  # a grid without the key keeps its trials' ids
        identity["precision"] = spec.precision
    if spec.calibrate is not None:  # trains on less data: another result (and an entry without it keeps its id)
        identity["calibrate"] = spec.calibrate
    if spec.dataset_file is not None:
        identity["dataset_file"] = {k: v for k, v in spec.dataset_file.items() if k not in ("path", "ood")}
    if spec.reference is not None:  # a grid without a reference keeps its trials' ids
        identity["reference"] = {
            k: v for k, v in spec.reference.items() if k != "file" and k not in REFERENCE_LOCATION_KEYS
        }
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{spec.phase}-{spec.cell_slug}-s{spec.seed}-{digest}"


def _fail(path: str, where: str, message: str) -> GridError:
    return GridError(f"{path}: {where}: {message}")


def _named(path: str, where: str, get: Callable[[str], Any], name: str) -> Any:
    """``get(name)``, a registry's lookup (a registered name or an import path ``package.module:Attribute``),
    or a GridError at ``where`` saying the name is unknown (and what is allowed) or a broken plug-in."""
    try:
        return get(name)
    except RegistryError as exc:
        raise _fail(path, where, str(exc)) from None


def _reject_former_names(
    path: str, where: str, owner: str, declared: tuple[Hyperparameter, ...], given: Mapping[str, Any]
) -> None:
    """Reject a name that one of ``owner``'s settings had before it was renamed
    (:attr:`Hyperparameter.formerly`), naming the setting to use instead."""
    for h in declared:
        for old in h.formerly:
            if old in given:
                raise _fail(path, f"{where}.{old}", f"{owner} renamed {old!r} to {h.name!r}; use {h.name} ({h.doc})")


def _check_options(
    path: str, where: str, owner: str, declared: tuple[Hyperparameter, ...], given: Any
) -> dict[str, Any]:
    """``given`` (a mapping of setting name to value) checked against ``declared``, the settings of
    ``owner`` (e.g. "method pca_ess"), for the grid field ``where``."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise _fail(path, where, f"expected a mapping, got {type(given).__name__}")
    _reject_former_names(path, where, owner, declared, given)
    table = {h.name: h for h in declared}
    out = {}
    for name, value in given.items():
        if name not in table:
            allowed = ", ".join(table) or "none"
            raise _fail(path, f"{where}.{name}", f"unknown option; allowed: {allowed}")
        try:
            out[name] = check_value(table[name], value)
        except ValueError as exc:
            raise _fail(path, f"{where}.{name}", str(exc)) from None
    return out


def _entries(path: str, raw: dict[str, Any], key: str, allowed_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    value = raw[key]
    if not isinstance(value, list) or not value:
        raise _fail(path, key, f"expected {TOP_KEYS[key]}, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict):
            raise _fail(path, f"{key}[{i}]", f"expected a name or a mapping with keys {list(allowed_keys)}")
        for k in item:
            if k not in allowed_keys:
                raise _fail(path, f"{key}[{i}].{k}", f"unknown key; allowed: {', '.join(allowed_keys)}")
        if not isinstance(item.get("name"), str):
            raise _fail(path, f"{key}[{i}].name", "required, a string")
        out.append(item)
    return out


def _positive_number(path: str, where: str, value: Any, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(path, where, f"expected a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise _fail(path, where, f"expected a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def _resources(path: str, where: str, raw: Any) -> dict[str, Any]:
    """A ``resources`` mapping (the grid's, or a method or model entry's) checked: only the keys it gives,
    ``cpu`` > 0, ``gpu`` >= 0 (below 1: a share of one GPU), ``custom`` a mapping of resource name to an
    amount > 0.  ``where`` is its field, e.g. ``models[1].resources``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, where, f"expected a mapping with keys {list(RESOURCE_KEYS)}, got {raw!r}")
    for key in raw:
        if key not in RESOURCE_KEYS:
            raise _fail(path, f"{where}.{key}", f"unknown key; allowed: {', '.join(RESOURCE_KEYS)}")
    out: dict[str, Any] = {}
    if "cpu" in raw:
        out["cpu"] = _positive_number(path, f"{where}.cpu", raw["cpu"], allow_zero=False)
    if "gpu" in raw:
        out["gpu"] = _positive_number(path, f"{where}.gpu", raw["gpu"], allow_zero=True)
    if "custom" in raw:
        custom = raw["custom"] or {}
        if not isinstance(custom, dict):
            raise _fail(path, f"{where}.custom", f"expected a mapping of resource name to amount, got {custom!r}")
        out["custom"] = {
            str(key): _positive_number(path, f"{where}.custom.{key}", value, allow_zero=False)
            for key, value in custom.items()
        }
    return out


def _int(path: str, where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, where, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _seeds(path: str, raw: Any) -> Sequence[int]:
    """The grid's ``seeds``: ``n`` is ``range(n)`` (counted, never listed), a list its distinct values; every
    seed in [0, :data:`MAX_SEED`]."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if not 1 <= raw <= MAX_SEED + 1:
            raise _fail(
                path, "seeds", f"expected a number of seeds from 1 to {MAX_SEED + 1} (seeds 0..n-1), got {raw!r}"
            )
        return range(raw)
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "seeds", f"expected {TOP_KEYS['seeds']}, got {raw!r}")
    for i, seed in enumerate(raw):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise _fail(path, f"seeds[{i}]", f"expected an integer in [0, {MAX_SEED}] (2^31 - 1), got {seed!r}")
    if len(set(raw)) != len(raw):
        raise _fail(path, "seeds", "seeds must be distinct")
    return tuple(raw)


def _bool(path: str, where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, where, f"expected true or false, got {value!r}")
    return value


def _name_subset(path: str, where: str, value: Any, known: list[str], noun: str) -> tuple[str, ...] | None:
    """A method entry's optional restriction to some of the grid's models or datasets."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, f"expected a non-empty list of {noun} names")
    for v in value:
        if v not in known:
            raise _fail(path, where, f"{v!r} is not among the grid's {noun}s: {', '.join(known)}")
    return tuple(value)


def _corners(space: dict[str, dict[str, Any]], names: list[str]) -> list[dict[str, tuple[Any, str]]]:
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


def _check_constraints(
    path: str, index: int, entry: MethodEntry, model_names: list[str], budget: Mapping[str, int]
) -> None:
    """Every constraint of ``entry``'s method (:class:`~ursa_ray.methods.base.Constraint`) on the entry's
    resolved configuration with each model it runs on; a constraint on searched hyperparameters at every
    corner of the search space instead.  The GridError names the grid field that set one of the values, and
    where each value involved came from."""
    from ursa_ray import methods, models
    from ursa_ray.methods.base import resolve_config

    method = methods.get_method(entry.name)
    where = f"methods[{index}]"
    for model in model_names:
        if entry.models is not None and model not in entry.models:
            continue
        fields = {
            "budget": "budget",
            "hyperparameters": f"{where}.hyperparameters",
            "model_hyperparameters": f"{where}.model_hyperparameters.{model}",
        }
        given: dict[str, Any] = {}
        source: dict[str, str] = {}  # hyperparameter -> the grid field that set it
        for kind, layer in _layers(entry, model, budget):
            for name, value in layer.items():
                given[name] = value
                source[name] = f"{fields[kind]}.{name}"
        config = resolve_config(method, given)
        owner = f"method {entry.label}" + (f" on model {model}" if entry.model_hyperparameters else "")
        for constraint in method.constraints:
            searched = [n for n in constraint.names if n in entry.search_space]
            for corner in _corners(entry.search_space, searched):  # one empty corner when nothing is searched
                message = constraint.violation({**config, **{n: v for n, (v, _) in corner.items()}}, None)
                if message is None:
                    continue
                field_ = _culprit(constraint, where, searched, source)
                raise _fail(path, field_, f"{message} ({owner}; {_origins(constraint, corner, source)})")
        model_spec = models.get_model(model)
        for corner in _corners(entry.search_space, list(entry.search_space)):
            message = method.model_refusal(model_spec, {**config, **{n: v for n, (v, _) in corner.items()}})
            if message is not None:
                at = ", ".join(f"{n}={v} ({place})" for n, (v, place) in corner.items())
                searched = f"; with {at}" if corner else ""
                raise _fail(path, where, f"{message} (method {entry.label} on model {model}{searched})")


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


def _check_selection_metric(
    path: str, search: SearchSettings, entries: list[MethodEntry], datasets: list[DatasetEntry], model_names: list[str]
) -> None:
    """The search phase's selection metric is one that every searched dataset's task reports on its
    validation split (``val_rmse`` only for regression, ``val_accuracy`` only for classification, ...)."""
    searched = [
        (d, m)
        for m in entries
        if m.search_space
        for d in datasets
        if any(m.pairs_with(model, d.name) for model in model_names)
    ]
    tasks = sorted({d.task for d, _ in searched})
    allowed = [name for name, metric in SELECTION_METRICS.items() if set(tasks) <= set(metric.tasks)]
    for d, m in searched:
        if d.task not in SELECTION_METRICS[search.metric].tasks:
            raise _fail(
                path,
                "search.metric",
                f"{search.metric} is not reported on the validation split of the {d.task} dataset {d.name!r} "
                f"(searched by method {m.label}); allowed for {' and '.join(tasks)}: {', '.join(allowed)}",
            )


def _file_dataset_entry(path: str, where: str, item: Mapping[str, Any]) -> DatasetEntry:
    """A dataset entry with a ``file`` block (:mod:`ursa_ray.data.files`): a name of its own, the block
    checked and its paths made absolute from the grid file's folder.  The files themselves are checked by
    :func:`check_data`."""
    from ursa_ray import data
    from ursa_ray.data.files import SET_NAME, FileDatasetError, parse_file_settings

    name = item["name"]
    if name in data.registry():
        raise _fail(
            path,
            f"{where}.name",
            f"{name!r} is a registered dataset; a dataset read from files needs a name of its own",
        )
    if not SET_NAME.fullmatch(name):
        raise _fail(path, f"{where}.name", "a dataset read from files is named with letters, digits, '_' and '-'")
    for key, why in (
        ("ood", "name its OOD files in file.ood"),
        ("complexity", "sweep no complexity"),
        ("options", "take no options"),
    ):
        if key in item:
            raise _fail(path, f"{where}.{key}", f"datasets read from files {why}")
    try:
        settings = parse_file_settings(item["file"], Path(path).parent)
    except FileDatasetError as exc:
        raise _fail(path, ".".join(filter(None, (f"{where}.file", exc.field))), str(exc)) from None
    return DatasetEntry(name, settings["task"], tuple(settings["ood"]), None, {}, settings)


def parse_grid(raw: Any, path: str = "<grid>") -> Grid:
    """Validate a grid (the result of yaml.safe_load) and return it; GridError on the first problem."""
    from ursa_ray import data, methods, models
    from ursa_ray.evaluation.adversarial import validate_adversarial
    from ursa_ray.evaluation.test_time_cost import QUANTISATION_SCHEMES
    from ursa_ray.methods._training import PRECISIONS

    if not isinstance(raw, dict):
        raise _fail(path, "top level", f"expected a mapping with keys {sorted(TOP_KEYS)}")
    for key in raw:
        if key not in TOP_KEYS:
            raise _fail(path, str(key), f"unknown key; allowed: {', '.join(TOP_KEYS)}")
    for key in REQUIRED:
        if key not in raw:
            raise _fail(path, key, f"required: {TOP_KEYS[key]}")
    if not isinstance(raw["name"], str) or not GRID_NAME.fullmatch(raw["name"]):
        raise _fail(
            path,
            "name",
            "expected letters, digits, '_', '-' and '.', starting with a letter or digit, at most 100 "
            f"characters (the name is the folder results/<name>), got {raw['name']!r}",
        )
    if not isinstance(raw.get("description", ""), str):
        raise _fail(path, "description", "expected a string (free text)")

    model_entries = []
    for i, item in enumerate(_entries(path, raw, "models", MODEL_KEYS)):
        spec = _named(path, f"models[{i}].name", models.get_model, item["name"])
        options = _check_options(path, f"models[{i}].options", f"model {spec.name}", spec.options, item.get("options"))
        own = _resources(path, f"models[{i}].resources", item.get("resources"))
        model_entries.append(ModelEntry(item["name"], options, own))
    if len({m.name for m in model_entries}) != len(model_entries):
        raise _fail(path, "models", "each model may appear once")

    dataset_entries = []
    for i, item in enumerate(_entries(path, raw, "datasets", DATASET_KEYS)):
        where = f"datasets[{i}]"
        if "file" in item:  # a dataset read from files
            dataset_entries.append(_file_dataset_entry(path, where, item))
            continue
        spec = _named(path, f"{where}.name", data.get_dataset, item["name"])
        ood = item.get("ood", [])
        if not isinstance(ood, list) or not all(isinstance(o, str) for o in ood):
            raise _fail(path, f"{where}.ood", "expected a list of OOD dataset names")
        for o in ood:
            if o not in spec.ood_sets:
                raise _fail(
                    path,
                    f"{where}.ood",
                    f"unknown OOD set {o!r} for {spec.name}; allowed: {', '.join(spec.ood_sets) or 'none'}",
                )
        complexity = item.get("complexity")
        if complexity is not None:
            if spec.sweep is None:
                raise _fail(
                    path,
                    f"{where}.complexity",
                    f"{spec.name} has no complexity to sweep (only synthetic regression sets do)",
                )
            sweep_param = next(h for h in spec.options if h.name == spec.sweep)
            if not isinstance(complexity, list) or not complexity:
                raise _fail(path, f"{where}.complexity", "expected a non-empty list of numbers")
            checked = []
            for j, c in enumerate(complexity):
                try:
                    checked.append(check_value(sweep_param, c))
                except ValueError as exc:
                    raise _fail(path, f"{where}.complexity[{j}]", str(exc)) from None
            complexity = tuple(checked)
        options = _check_options(path, f"{where}.options", f"dataset {spec.name}", spec.options, item.get("options"))
        dataset_entries.append(DatasetEntry(item["name"], spec.task, tuple(ood), complexity, options, sweep=spec.sweep))
    if len({d.name for d in dataset_entries}) != len(dataset_entries):  # a cell is named by its dataset
        raise _fail(path, "datasets", "each dataset may appear once")

    budget_raw = raw.get("budget") or {}
    if not isinstance(budget_raw, dict):
        raise _fail(path, "budget", f"expected a mapping with keys {list(BUDGET_KEYS)}")
    budget = {}
    for key, value in budget_raw.items():
        if key not in BUDGET_KEYS:
            raise _fail(path, f"budget.{key}", f"unknown key; allowed: {', '.join(BUDGET_KEYS)}")
        budget[key] = _int(path, f"budget.{key}", value, 1)

    method_entries = []
    model_names = [m.name for m in model_entries]
    dataset_names = [d.name for d in dataset_entries]
    for i, item in enumerate(_entries(path, raw, "methods", METHOD_KEYS)):
        where = f"methods[{i}]"
        method = _named(path, f"{where}.name", methods.get_method, item["name"])
        label = item.get("label", item["name"])
        if not isinstance(label, str) or not label or "/" in label:
            raise _fail(path, f"{where}.label", "expected a non-empty string without '/'")
        only = _name_subset(path, f"{where}.models", item.get("models"), model_names, "model")
        only_data = _name_subset(path, f"{where}.datasets", item.get("datasets"), dataset_names, "dataset")
        owner = f"method {method.name}"
        hyper = _check_options(
            path, f"{where}.hyperparameters", owner, method.hyperparameters, item.get("hyperparameters")
        )
        if isinstance(item.get("search"), dict):
            _reject_former_names(path, f"{where}.search", owner, method.hyperparameters, item["search"])
        space = parse_search_space(path, f"{where}.search", method.hyperparameters, item.get("search"), _fail)
        per_model_raw = item.get("model_hyperparameters") or {}
        if not isinstance(per_model_raw, dict):
            raise _fail(path, f"{where}.model_hyperparameters", "expected a mapping of model name to hyperparameters")
        per_model = {}
        for model_name, values in per_model_raw.items():
            if model_name not in model_names:
                raise _fail(
                    path,
                    f"{where}.model_hyperparameters.{model_name}",
                    f"not among the grid's models: {', '.join(model_names)}",
                )
            per_model[model_name] = _check_options(
                path, f"{where}.model_hyperparameters.{model_name}", owner, method.hyperparameters, values
            )
        vectorize = item.get("vectorize_seeds")
        if vectorize is not None:
            _int(path, f"{where}.vectorize_seeds", vectorize, 1)
        own = _resources(path, f"{where}.resources", item.get("resources"))
        calibrate = item.get("calibrate")
        if calibrate is not None and calibrate not in CALIBRATIONS:
            raise _fail(path, f"{where}.calibrate", f"expected one of {', '.join(CALIBRATIONS)}, got {calibrate!r}")
        method_entries.append(
            MethodEntry(item["name"], label, only, hyper, space, per_model, only_data, vectorize, own, calibrate)
        )
    labels = [m.label for m in method_entries]
    duplicates = sorted({lab for lab in labels if labels.count(lab) > 1})
    if duplicates:
        raise _fail(
            path,
            "methods",
            f"labels must be unique; give each repeated method a label (repeated: {', '.join(duplicates)})",
        )

    seeds = _seeds(path, raw["seeds"])
    max_trials = _int(path, "max_trials", raw.get("max_trials", DEFAULT_MAX_TRIALS), 1)

    resources = {**DEFAULT_RESOURCES, "custom": {}, **_resources(path, "resources", raw.get("resources") or {})}

    for key in ("save_predictions", "download"):
        if key in raw:
            _bool(path, key, raw[key])
    corruptions = _parse_corruptions(path, raw.get("corruptions", {}))
    try:
        adversarial_settings = validate_adversarial(raw.get("adversarial"))
    except ValueError as error:
        raise GridError(f"{path}: {error}") from None  # the message names its field, adversarial.…
    for d in dataset_entries:
        spec = None if d.file is not None else data.get_dataset(d.name)
        if spec is not None and d.task == "classification" and not spec.decision_task and spec.images:
            try:
                adversarial_settings.epsilons_for(d.name)
            except ValueError as error:
                raise _fail(path, "adversarial.epsilons", f"{error}; give epsilons for {d.name!r}") from None
    adversarial = dataclasses.asdict(adversarial_settings)
    bit_depths = raw.get("bit_depths", list(QUANTISATION_SCHEMES))
    if not isinstance(bit_depths, list) or any(b not in QUANTISATION_SCHEMES for b in bit_depths):
        raise _fail(path, "bit_depths", f"expected a list of {', '.join(QUANTISATION_SCHEMES)}, got {bit_depths!r}")
    data_root = raw.get("data_root")
    if data_root is not None and not isinstance(data_root, str):
        raise _fail(path, "data_root", "expected a directory path (string)")
    precision = raw.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise _fail(path, "precision", f"expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    max_concurrent = raw.get("max_concurrent_trials")
    if max_concurrent is not None:
        _int(path, "max_concurrent_trials", max_concurrent, 1)
    max_failures = _int(path, "max_failures", raw.get("max_failures", 0), 0)
    vectorize_seeds = _int(path, "vectorize_seeds", raw.get("vectorize_seeds", DEFAULT_VECTORIZE_SEEDS), 1)
    search = parse_search_settings(path, raw.get("search"), _fail)
    references = _parse_references(path, raw.get("reference"), model_names, dataset_names)
    statistics = parse_statistics(path, raw.get("statistics"))
    if search is None and any(m.search_space for m in method_entries):
        raise _fail(path, "search", "methods declare search spaces but the grid has no search block")

    for m in method_entries:
        for mo in model_entries:
            spec = models.get_model(mo.name)
            for d in dataset_entries:
                if m.pairs_with(mo.name, d.name) and d.task not in spec.tasks:
                    raise _fail(
                        path,
                        "models",
                        f"model {mo.name!r} does not fit the {d.task} dataset {d.name!r} (method {m.label}); "
                        "restrict the method with 'models:' or 'datasets:'",
                    )
    for i, m in enumerate(method_entries):
        tasks = methods.get_method(m.name).tasks  # None: every task
        for d in dataset_entries:
            paired = any(m.pairs_with(mo.name, d.name) for mo in model_entries)
            if tasks is not None and d.task not in tasks and paired:
                raise _fail(
                    path,
                    f"methods[{i}]",
                    f"method {m.label!r} supports {' and '.join(tasks)} datasets only, not the {d.task} dataset "
                    f"{d.name!r}; restrict it with 'datasets:'",
                )
            if m.calibrate is not None and d.task != "classification" and paired:
                raise _fail(
                    path,
                    f"methods[{i}].calibrate",
                    f"temperature scaling applies to classification datasets only, not the {d.task} dataset "
                    f"{d.name!r}; restrict the method with 'datasets:'",
                )
        _check_constraints(path, i, m, model_names, budget)
    if search is not None:
        _check_selection_metric(path, search, method_entries, dataset_entries, model_names)

    grid = Grid(
        path=path,
        name=raw["name"],
        description=raw.get("description", ""),
        methods=tuple(method_entries),
        models=tuple(model_entries),
        datasets=tuple(dataset_entries),
        seeds=seeds,
        resources=resources,
        budget=budget,
        save_predictions=bool(raw.get("save_predictions", False)),
        bit_depths=tuple(dict.fromkeys(bit_depths)),
        corruptions=corruptions,
        adversarial=adversarial,
        data_root=data_root,
        download=bool(raw.get("download", False)),
        max_concurrent_trials=max_concurrent,
        precision=precision,
        max_failures=max_failures,
        search=search,
        vectorize_seeds=vectorize_seeds,
        max_trials=max_trials,
        source=yaml.safe_dump(raw, sort_keys=False),
        references=references,
        statistics=statistics,
    )
    _check_references_serve(grid)
    n_final = grid.n_final_trials()
    if n_final > max_trials:
        raise _fail(
            path,
            "seeds",
            f"{len(grid.cells())} cells x {len(seeds):,} seeds = {n_final:,} final trials, more than "
            f"max_trials ({max_trials:,}); use fewer seeds or cells, or set max_trials: {n_final} to run them all",
        )
    return grid


def parse_statistics(path: str, raw: Any) -> dict[str, str]:
    """The grid-wide ``statistics`` block, ``{interval: t | bootstrap}`` (default ``t``); ``ursa-ray report``
    reads it from the results' ``grid.yaml``.  A bad value is one line naming ``statistics.KEY``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise _fail(path, "statistics", f"expected {TOP_KEYS['statistics']}, got {raw!r}")
    for key in raw:
        if key != "interval":
            raise _fail(path, f"statistics.{key}", "unknown key; allowed: interval")
    interval = raw.get("interval", "t")
    if interval not in STATISTICS_INTERVALS:
        raise _fail(path, "statistics.interval", f"expected one of {', '.join(STATISTICS_INTERVALS)}, got {interval!r}")
    return {"interval": interval}


REFERENCE_BLOCK_KEYS = ("models", "datasets", "file", *REFERENCE_LOCATION_KEYS)
"""A ``reference`` block's keys besides the settings of a computed reference (:func:`ursa_ray.reference.declared_settings`)."""


def _parse_references(
    path: str, raw: Any, model_names: list[str], dataset_names: list[str]
) -> tuple[ReferenceBlock, ...]:
    """The grid's ``reference``: one block (a mapping) or a list of blocks, each checked by :func:`_reference_block`;
    empty when absent."""
    if raw is None:
        return ()
    if isinstance(raw, list) and raw:
        return tuple(
            _reference_block(path, f"reference[{i}]", block, model_names, dataset_names) for i, block in enumerate(raw)
        )
    return (_reference_block(path, "reference", raw, model_names, dataset_names),)


def _reference_block(
    path: str, where: str, raw: Any, model_names: list[str], dataset_names: list[str]
) -> ReferenceBlock:
    """One ``reference`` block: optional ``models`` / ``datasets`` selectors (names of the grid's), then either
    ``file`` alone (a path, relative to the grid file's folder) or the settings of a computed reference (keys from
    :func:`ursa_ray.reference.declared_settings` with their ranges, the unset ones left to
    :data:`ursa_ray.reference.SETTINGS_DEFAULTS` and HMC's defaults; a burn-in it cannot afford is not checked
    here, HMC's adaptation runs within it) with an optional ``dir`` and ``resources`` (the reference trial's
    request, each key over the cell's: :func:`_resources`)."""
    from ursa_ray import reference
    from ursa_ray.data.files import content_digest

    declared = reference.declared_settings()
    allowed = [h.name for h in declared] + list(REFERENCE_BLOCK_KEYS)
    if not isinstance(raw, dict) or not raw:
        listed = ", or a list of such blocks" if where == "reference" else ""
        raise _fail(path, where, f"expected a mapping with keys among {', '.join(allowed)}{listed}")
    _reject_former_names(path, where, "reference", declared, raw)
    for key in raw:
        if key not in allowed:
            raise _fail(path, f"{where}.{key}", f"unknown option; allowed: {', '.join(allowed)}")
    models = _name_subset(path, f"{where}.models", raw.get("models"), model_names, "model")
    datasets = _name_subset(path, f"{where}.datasets", raw.get("datasets"), dataset_names, "dataset")
    given = {k: v for k, v in raw.items() if k not in ("models", "datasets")}
    if "file" in given:
        for key in given:
            if key != "file":
                raise _fail(path, f"{where}.{key}", "a reference from file is not computed: give file alone")
        file = _reference_path(path, f"{where}.file", given["file"])
        settings = {"file": file, "sha256": content_digest([file])}
    else:
        hmc = {k: v for k, v in given.items() if k not in REFERENCE_LOCATION_KEYS}
        settings = _check_options(path, where, "reference", declared, hmc)
        if "dir" in given:
            settings["dir"] = _reference_path(path, f"{where}.dir", given["dir"])
        if "resources" in given:  # the reference trial's own request (more CPUs: its chains' passes use them)
            settings["resources"] = _resources(path, f"{where}.resources", given["resources"])
    return ReferenceBlock(settings, models, datasets, where)


def _reference_path(path: str, where: str, value: Any) -> str:
    """A block's ``file`` or ``dir``: absolute, a relative path taken from the grid file's folder; a ``dir`` may
    be an object-store URI (``s3://...``), kept as given."""
    if not isinstance(value, str) or not value:
        raise _fail(path, where, f"expected a path (relative to the grid file's folder), got {value!r}")
    if "://" in value:
        return value
    return str((Path(path).parent / Path(value).expanduser()).resolve())


def _check_references_serve(grid: Grid) -> None:
    """Refuse a ``reference`` block that gives no classification cell (model, dataset) of the grid its
    reference: none matches it, or an earlier block matches each first."""
    served = {id(block) for block, _ in grid.reference_cells()}
    for block in grid.references:
        if id(block) not in served:
            cells = [c for c in grid.cells() if c["dataset"].task == "classification"]
            pairs = sorted({f"{c['model'].name}/{c['dataset'].name}" for c in cells}) or ["none"]
            raise _fail(
                grid.path,
                block.field_name,
                "gives no cell its reference: it matches no classification (model, dataset) of the grid that an "
                f"earlier block does not (the grid's classification cells, model/dataset: {', '.join(pairs)})",
            )


CORRUPTION_KEYS = ("types", "severities", "n_examples")


def _parse_corruptions(path: str, raw: Any) -> dict[str, Any]:
    """The ``corruptions`` block with its defaults: every type, severities 1–5, the first 1,000 test examples;
    ``types: []`` turns the corruption sets off."""
    from ursa_ray.evaluation.corruptions import CORRUPTIONS, SEVERITIES, validate_corruptions

    if not isinstance(raw, dict):
        raise _fail(path, "corruptions", f"expected a mapping with keys {', '.join(CORRUPTION_KEYS)}")
    for key in raw:
        if key not in CORRUPTION_KEYS:
            raise _fail(path, f"corruptions.{key}", f"unknown key; allowed: {', '.join(CORRUPTION_KEYS)}")
    types = raw.get("types", "all")
    types = list(CORRUPTIONS) if types == "all" else types
    severities = raw.get("severities", list(SEVERITIES))
    for key, value in (("types", types), ("severities", severities)):
        if not isinstance(value, list):
            raise _fail(path, f"corruptions.{key}", f"expected a list, got {value!r}")
    try:
        validate_corruptions(types, severities)
    except ValueError as error:
        raise _fail(path, "corruptions", str(error)) from None
    n_examples = _int(path, "corruptions.n_examples", raw.get("n_examples", 1000), 1)
    return {"types": list(dict.fromkeys(types)), "severities": sorted(set(severities)), "n_examples": n_examples}


class GridLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (YAML would keep the last silently) and
    a document of more than :data:`MAX_YAML_NODES` nodes once its aliases are expanded (an alias bomb), counted
    on the composed node graph before anything is built from it."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _count_nodes(node, {}, node.start_mark)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        line_of: dict[Any, int] = {}  # each scalar key -> the line it first appears on
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in line_of:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice (first on line {line_of[key]}); give each key once",
                    key_node.start_mark,
                )
            line_of[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _count_nodes(node: yaml.Node, memo: dict[int, int], mark: yaml.Mark) -> int:
    """The number of nodes under ``node`` with every alias expanded (each shared node counted once per use,
    computed once: linear in the file's size); a ConstructorError past :data:`MAX_YAML_NODES`."""
    if id(node) not in memo:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        memo[id(node)] = 0  # a recursive structure (an alias inside its own anchor) counts what is seen so far
        total = 1 + sum(_count_nodes(child, memo, mark) for child in children)
        if total > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"expands to more than {MAX_YAML_NODES:,} values through its aliases (&anchor / *alias)",
                mark,
            )
        memo[id(node)] = total
    return memo[id(node)]


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid file (UTF-8 YAML, read by :class:`GridLoader`)."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"{path}: cannot read the grid file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise GridError(
            f"{path}: byte {exc.start}: not UTF-8 text ({exc.reason}); a grid file is YAML saved as UTF-8"
        ) from None
    try:
        raw = yaml.load(text, Loader=GridLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        raise GridError(f"{path}: {where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise GridError(
            f"{path}: YAML: nested too deeply to read; a grid is a few levels of mappings and lists"
        ) from None
    return dataclasses.replace(parse_grid(raw, path), source=text)


def check_data(grid: Grid) -> None:
    """Raise GridError when a dataset's files are missing (before any trial starts), a dataset read from files
    cannot be used (each is loaded once, see :func:`_check_file_dataset`), or a cell's reference cannot be: a
    computed one too large for full-batch HMC, a file that does not fit the cell's evaluation sets."""
    from ursa_ray import data

    root = data.base.data_root(grid.data_root)
    for i, d in enumerate(grid.datasets):
        if d.file is not None:
            _check_file_dataset(grid, i, d)
            continue
        spec = data.get_dataset(d.name)
        if spec.check is None or grid.download:
            continue
        try:
            spec.check(root, d.ood)
        except data.base.DatasetMissing as exc:
            raise GridError(f"{grid.path}: datasets[{i}]: {exc}") from None
    loaded: dict[str, Any] = {}  # each dataset (and options) loaded once for the reference checks
    for block, cell in grid.reference_cells():
        d, ood = cell["dataset"], cell["dataset"].ood if "file" in block.settings else ()  # a file may hold OOD sets
        key = json.dumps([d.name, cell["dataset_options"], ood], sort_keys=True, default=str)
        if key not in loaded:
            loaded[key] = data.dataset_spec(d.name, d.file).load(
                dict(cell["dataset_options"]), ood, root, grid.download, 0
            )
        if "file" in block.settings:
            _check_reference_file(grid, block, loaded[key])
        else:
            _check_reference_fits(grid, block, cell["model"], d.name, loaded[key])


def _check_reference_file(grid: Grid, block: ReferenceBlock, ds: Any) -> None:
    """Refuse a reference file that is missing, unreadable, or whose sets, examples, classes or test labels (a
    saved prediction table's) do not fit the evaluation sets of a cell it serves, or, without labels, whose test
    predictions agree with the set's labels no more than in a random order
    (:func:`ursa_ray.reference.check_reference_sets`, :func:`~ursa_ray.reference.check_reference_labels`,
    :func:`~ursa_ray.reference.check_reference_order`): one line naming the file and ``reference.file``."""
    from ursa_ray import reference

    sizes = {"test": int(ds.test_x.shape[0]), **{name: int(x.shape[0]) for name, x in ds.ood.items()}}
    try:
        sets = reference.read_reference_file(block.settings["file"])
        reference.check_reference_sets(sets, sizes, ds.n_outputs)
        labels = reference.file_test_labels(block.settings["file"])
        if labels is None:
            reference.check_reference_order(sets["test"], ds.test_y.numpy())
        else:
            reference.check_reference_labels(labels, ds.test_y.numpy())
    except reference.ReferenceFileError as exc:
        raise _fail(grid.path, f"{block.field_name}.file", f"{block.settings['file']}: {exc}") from None


def _check_reference_fits(grid: Grid, block: ReferenceBlock, mo: ModelEntry, dataset: str, ds: Any) -> None:
    """Refuse a computed reference on a classification (model, dataset) whose full-batch memory estimate
    (:func:`ursa_ray.reference.full_batch_bytes`) exceeds :data:`ursa_ray.reference.MAX_FULL_BATCH_BYTES`; the
    model is built once on the CPU."""
    from ursa_ray import models, reference

    chains = int({**reference.SETTINGS_DEFAULTS, **block.settings}["chains"])
    model_spec = models.get_model(mo.name)
    kwargs = dict(mo.options)
    if model_spec.needs_feature_map:
        kwargs["feature_map"] = ds.feature_map
    n_params = sum(p.numel() for p in model_spec.build(ds.input_shape, ds.n_outputs, **kwargs).parameters())
    need = reference.full_batch_bytes(len(ds.train_y), math.prod(ds.input_shape), n_params, chains)
    if need > reference.MAX_FULL_BATCH_BYTES:
        raise _fail(
            grid.path,
            block.field_name,
            f"full-batch HMC on {mo.name}/{dataset} needs at least {need / 2**20:,.0f} MiB "
            f"({len(ds.train_y):,} training inputs of {math.prod(ds.input_shape):,} values and {chains} chains of "
            f"{n_params:,} parameters); the limit is {reference.MAX_FULL_BATCH_BYTES / 2**20:,.0f} MiB",
        )


def _check_padding_readers(grid: Grid, dataset: str, ds: Any) -> None:
    """Refuse a model paired with ``dataset`` whose inputs hold NaN padding (variable-length sequences) unless
    it reads padded sequences (:attr:`~ursa_ray.models.base.ModelSpec.reads_padded_sequences`): any other
    network would put the padding's NaN into every output."""
    from ursa_ray import models

    inputs = [ds.train_x, ds.test_x, *ds.ood.values()]
    if not any(bool(x.isnan().any()) for x in inputs):
        return
    paired = dict.fromkeys(c["model"].name for c in grid.cells() if c["dataset"].name == dataset)
    refused = [name for name in paired if not models.get_model(name).reads_padded_sequences]
    if refused:
        readers = [name for name, spec in models.registry().items() if spec.reads_padded_sequences]
        raise _fail(
            grid.path,
            "models",
            f"{', '.join(refused)} cannot read the padded sequences of {dataset!r} (NaN steps past each "
            f"sequence's length); models that can: {', '.join(readers)}",
        )


def _check_file_dataset(grid: Grid, index: int, entry: DatasetEntry) -> None:
    """Load a dataset read from files as a trial will (:func:`ursa_ray.data.files.load_file_dataset`): a file
    that cannot be used is a GridError at ``datasets[index].file.KEY``; an image classification set needs
    the grid's ``adversarial.epsilons`` (pixel units; there are no family defaults for it)."""
    from ursa_ray import data
    from ursa_ray.data.files import FileDatasetError
    from ursa_ray.evaluation.adversarial import AdversarialSettings

    where = f"datasets[{index}].file"
    try:
        ds = data.dataset_spec(entry.name, entry.file).load({}, entry.ood, Path(), False, 0)
    except FileDatasetError as exc:
        raise GridError(f"{grid.path}: {'.'.join(filter(None, (where, exc.field)))}: {exc}") from None
    _check_padding_readers(grid, entry.name, ds)
    if ds.task == "classification" and ds.pixel_mean is not None:
        try:
            AdversarialSettings(**grid.adversarial).epsilons_for(entry.name)
        except ValueError as error:
            raise _fail(
                grid.path,
                "adversarial.epsilons",
                f"{error}; give epsilons (pixel units) for the images of {entry.name!r}",
            ) from None
