"""The grid's ``methods``, ``models`` and ``datasets`` lists: their entries (frozen dataclasses) and how each
entry is checked against its registry (names, options, search spaces, a dataset read from files)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ursa_ray.grid.fields import (
    Checking,
    check_options,
    fail,
    integer,
    name_subset,
    named,
    reject_former_names,
    resources,
)
from ursa_ray.search_space import check_value, parse_search_space

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


def entry_list(checking: Checking, key: str, value: Any, allowed_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The grid's list ``key`` (methods, models or datasets): a non-empty list of names or mappings with
    ``allowed_keys`` and a string ``name``, each name made ``{name: NAME}``."""
    if not isinstance(value, list) or not value:
        raise checking.fail(key, f"expected {checking.help(key)}, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict):
            raise checking.fail(f"{key}[{i}]", f"expected a name or a mapping with keys {list(allowed_keys)}")
        for k in item:
            if k not in allowed_keys:
                raise checking.fail(f"{key}[{i}].{k}", f"unknown key; allowed: {', '.join(allowed_keys)}")
        if not isinstance(item.get("name"), str):
            raise checking.fail(f"{key}[{i}].name", "required, a string")
        out.append(item)
    return out


def parse_models(checking: Checking, value: Any) -> tuple[ModelEntry, ...]:
    """The ``models`` list: registered models (or plug-ins) with their checked options and resources, each once."""
    from ursa_ray import models

    path, out = checking.path, []
    for i, item in enumerate(entry_list(checking, "models", value, MODEL_KEYS)):
        spec = named(path, f"models[{i}].name", models.get_model, item["name"])
        options = check_options(path, f"models[{i}].options", f"model {spec.name}", spec.options, item.get("options"))
        own = resources(path, f"models[{i}].resources", item.get("resources"))
        out.append(ModelEntry(item["name"], options, own))
    if len({m.name for m in out}) != len(out):
        raise checking.fail("models", "each model may appear once")
    return tuple(out)


def parse_datasets(checking: Checking, value: Any) -> tuple[DatasetEntry, ...]:
    """The ``datasets`` list: registered datasets with their OOD sets, complexity sweep and options, or datasets
    read from files (:func:`file_dataset_entry`), each once (a cell is named by its dataset)."""
    out = []
    for i, item in enumerate(entry_list(checking, "datasets", value, DATASET_KEYS)):
        where = f"datasets[{i}]"
        if "file" in item:
            out.append(file_dataset_entry(checking.path, where, item))
        else:
            out.append(_registered_dataset_entry(checking, where, item))
    if len({d.name for d in out}) != len(out):
        raise checking.fail("datasets", "each dataset may appear once")
    return tuple(out)


def _registered_dataset_entry(checking: Checking, where: str, item: Mapping[str, Any]) -> DatasetEntry:
    from ursa_ray import data

    path = checking.path
    spec = named(path, f"{where}.name", data.get_dataset, item["name"])
    ood = item.get("ood", [])
    if not isinstance(ood, list) or not all(isinstance(o, str) for o in ood):
        raise checking.fail(f"{where}.ood", "expected a list of OOD dataset names")
    for o in ood:
        if o not in spec.ood_sets:
            raise checking.fail(
                f"{where}.ood", f"unknown OOD set {o!r} for {spec.name}; allowed: {', '.join(spec.ood_sets) or 'none'}"
            )
    complexity = _complexity(checking, where, spec, item.get("complexity"))
    options = check_options(path, f"{where}.options", f"dataset {spec.name}", spec.options, item.get("options"))
    return DatasetEntry(item["name"], spec.task, tuple(ood), complexity, options, sweep=spec.sweep)


def _complexity(checking: Checking, where: str, spec: Any, complexity: Any) -> tuple[float, ...] | None:
    """A registered dataset's ``complexity``: values of the option it sweeps (:attr:`DatasetSpec.sweep`)."""
    if complexity is None:
        return None
    if spec.sweep is None:
        raise checking.fail(
            f"{where}.complexity", f"{spec.name} has no complexity to sweep (only synthetic regression sets do)"
        )
    sweep_param = next(h for h in spec.options if h.name == spec.sweep)
    if not isinstance(complexity, list) or not complexity:
        raise checking.fail(f"{where}.complexity", "expected a non-empty list of numbers")
    checked = []
    for j, c in enumerate(complexity):
        try:
            checked.append(check_value(sweep_param, c))
        except ValueError as exc:
            raise checking.fail(f"{where}.complexity[{j}]", str(exc)) from None
    return tuple(checked)


def file_dataset_entry(path: str, where: str, item: Mapping[str, Any]) -> DatasetEntry:
    """A dataset entry with a ``file`` block (:mod:`ursa_ray.data.files`): a name of its own, the block
    checked and its paths made absolute from the grid file's folder.  The files themselves are checked by
    :func:`ursa_ray.grid.data_checks.check_data`."""
    from ursa_ray import data
    from ursa_ray.data.files import SET_NAME, FileDatasetError, parse_file_settings

    name = item["name"]
    if name in data.registry():
        raise fail(
            path,
            f"{where}.name",
            f"{name!r} is a registered dataset; a dataset read from files needs a name of its own",
        )
    if not SET_NAME.fullmatch(name):
        raise fail(path, f"{where}.name", "a dataset read from files is named with letters, digits, '_' and '-'")
    for key, why in (
        ("ood", "name its OOD files in file.ood"),
        ("complexity", "sweep no complexity"),
        ("options", "take no options"),
    ):
        if key in item:
            raise fail(path, f"{where}.{key}", f"datasets read from files {why}")
    try:
        settings = parse_file_settings(item["file"], Path(path).parent)
    except FileDatasetError as exc:
        raise fail(path, ".".join(filter(None, (f"{where}.file", exc.field))), str(exc)) from None
    return DatasetEntry(name, settings["task"], tuple(settings["ood"]), None, {}, settings)


def parse_methods(checking: Checking, value: Any) -> tuple[MethodEntry, ...]:
    """The ``methods`` list: registered methods (or plug-ins) with a label each (unique), optional restrictions
    to some of the grid's models and datasets, and their checked hyperparameters and search spaces."""
    model_names = [m.name for m in checking["models"]]
    dataset_names = [d.name for d in checking["datasets"]]
    out = [
        _method_entry(checking, f"methods[{i}]", item, model_names, dataset_names)
        for i, item in enumerate(entry_list(checking, "methods", value, METHOD_KEYS))
    ]
    labels = [m.label for m in out]
    duplicates = sorted({lab for lab in labels if labels.count(lab) > 1})
    if duplicates:
        raise checking.fail(
            "methods", f"labels must be unique; give each repeated method a label (repeated: {', '.join(duplicates)})"
        )
    return tuple(out)


def _method_entry(
    checking: Checking, where: str, item: Mapping[str, Any], model_names: list[str], dataset_names: list[str]
) -> MethodEntry:
    from ursa_ray import methods

    path = checking.path
    method = named(path, f"{where}.name", methods.get_method, item["name"])
    label = item.get("label", item["name"])
    if not isinstance(label, str) or not label or "/" in label:
        raise checking.fail(f"{where}.label", "expected a non-empty string without '/'")
    only = name_subset(path, f"{where}.models", item.get("models"), model_names, "model")
    only_data = name_subset(path, f"{where}.datasets", item.get("datasets"), dataset_names, "dataset")
    owner = f"method {method.name}"
    hyper = check_options(path, f"{where}.hyperparameters", owner, method.hyperparameters, item.get("hyperparameters"))
    if isinstance(item.get("search"), dict):
        reject_former_names(path, f"{where}.search", owner, method.hyperparameters, item["search"])
    space = parse_search_space(path, f"{where}.search", method.hyperparameters, item.get("search"), fail)
    per_model = _model_hyperparameters(checking, where, owner, method, item.get("model_hyperparameters"), model_names)
    vectorize = item.get("vectorize_seeds")
    if vectorize is not None:
        integer(path, f"{where}.vectorize_seeds", vectorize, 1)
    own = resources(path, f"{where}.resources", item.get("resources"))
    calibrate = item.get("calibrate")
    if calibrate is not None and calibrate not in CALIBRATIONS:
        raise checking.fail(f"{where}.calibrate", f"expected one of {', '.join(CALIBRATIONS)}, got {calibrate!r}")
    return MethodEntry(item["name"], label, only, hyper, space, per_model, only_data, vectorize, own, calibrate)


def _model_hyperparameters(
    checking: Checking, where: str, owner: str, method: Any, raw: Any, model_names: list[str]
) -> dict[str, dict[str, Any]]:
    """A method entry's ``model_hyperparameters``: for some of the grid's models, hyperparameters over its own."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise checking.fail(f"{where}.model_hyperparameters", "expected a mapping of model name to hyperparameters")
    out = {}
    for model_name, values in raw.items():
        field_ = f"{where}.model_hyperparameters.{model_name}"
        if model_name not in model_names:
            raise checking.fail(field_, f"not among the grid's models: {', '.join(model_names)}")
        out[model_name] = check_options(checking.path, field_, owner, method.hyperparameters, values)
    return out
