"""A validated grid (:class:`Grid`) and its expansion: its cells (method, model, dataset, complexity), then one
:class:`~ursa_ray.spec.TrialSpec` per cell and seed (:meth:`Grid.spec_for`, the one place a spec is made), with
the trials that feed others linked to them (the transfer attack's source, a cell's reference posterior) and each
trial's deterministic id (:func:`trial_id`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ursa_ray.grid.blocks import DEFAULT_MAX_TRIALS, DEFAULT_VECTORIZE_SEEDS
from ursa_ray.grid.entries import DatasetEntry, MethodEntry, ModelEntry, ReferenceBlock
from ursa_ray.search_space import SearchSettings
from ursa_ray.spec import REFERENCE_LOCATION_KEYS, TrialSpec

# The registries (methods, models, datasets) and the evaluation modules import torch: they are imported where a
# grid is validated or its specs built, never on import, so that a run's Tune driver, which gets a validated grid
# with its final specs built (:meth:`Grid.trial_specs`), runs without torch (docs/performance.md, "Driver memory
# per trial").


@dataclass(frozen=True)
class Grid:
    """A validated grid: each top-level key's checked value (:data:`ursa_ray.grid.schema.KEYS`), as a typed field
    where the class declares one and in :attr:`settings` for every key (``grid.KEY`` reads a key without a field
    of its own from there), and its expansion into cells and trial specs."""

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
    """The validated ``statistics`` block (:func:`ursa_ray.grid.parse_statistics`): how ``ursa-ray report``
    computes intervals; it changes no trial."""
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Every top-level key's checked value by key (its default where the grid leaves it out), as the schema
    checked it; a key added to the schema without a field here is read as ``grid.KEY`` from this mapping."""
    _final_specs: list[TrialSpec] = field(default_factory=list, init=False, compare=False, repr=False)
    """The final specs without overrides once built (:meth:`trial_specs`): pickled with the grid, so the driver
    reads them without the registries."""

    def __getattr__(self, name: str) -> Any:
        """A top-level key without a field of its own (see :attr:`settings`)."""
        settings = self.__dict__.get("settings", {})  # not self.settings: absent while a copy is being unpickled
        if name in settings:
            return settings[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        fixed = {k: v for _, layer in layers(m, cell["model"].name, self.budget) for k, v in layer.items()}
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

    def search_cells(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{cell key: its search space} of every cell whose method entry declares one, in the grid's order: the
        search phase's walk of the grid (with :meth:`search_spec`)."""
        return {cell_key(c): c["method"].search_space for c in self.cells() if c["method"].search_space}

    def search_spec(self, key: str) -> TrialSpec:
        """The search-phase spec of the cell ``key`` (its first seed; the searcher's sampled hyperparameters go
        over its configuration)."""
        cell = next(c for c in self.cells() if cell_key(c) == key)
        return self.spec_for(cell, self.seeds[0], "search", {})

    def trial_requests(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(method label, model, resources) of every cell's trials (both phases ask for the same) and, label
        ``reference``, of each reference trial whose block gives its own ``resources`` (over its cell's): what
        the cluster check walks (:func:`ursa_ray.tune.cluster.grid_requests`)."""
        asked = [
            (c["method"].label, c["model"].name, self.resources_for(c["method"], c["model"])) for c in self.cells()
        ]
        for block, cell in self.reference_cells():
            if "resources" in block.settings:
                cells = self.resources_for(cell["method"], cell["model"])
                asked.append(("reference", cell["model"].name, {**cells, **block.settings["resources"]}))
        return asked

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


def layers(entry: MethodEntry, model: str, budget: Mapping[str, int]) -> tuple[tuple[str, dict[str, Any]], ...]:
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
