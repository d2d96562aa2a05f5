"""Plug-ins: methods, models and datasets from outside this package, and the protocol every item follows.

A plug-in reaches the registries in one of two ways:

- an **entry point** of an installed distribution, in the group ``ursa_ray.methods``, ``ursa_ray.models`` or
  ``ursa_ray.datasets`` (:data:`GROUPS`); its name is the registry name, and must equal the loaded
  object's ``name``;
- an **import path** ``package.module:Attribute`` written as the name in a grid; the registry name is the
  whole path (so trial specs, results and reports carry it, and every Ray worker resolves it the same way).
  The current directory is put on ``sys.path`` first, as ``python -m`` does (Ray workers start there too).

Either way the object loaded is instantiated with no arguments when it is a class, then checked against its
kind's protocol (:func:`check_method`, :func:`check_model`, :func:`check_dataset`; the built-ins pass the
same checks).  A plug-in that fails to load or breaks the protocol does not stop anything else: it becomes
an :class:`Entry` with a ``problem``, listed as broken and rejected where a grid names it.

The protocol's base classes are imported inside the functions here: this module is imported while the
registry packages (which define them) are still initialising.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

GROUPS = {"method": "ursa_ray.methods", "model": "ursa_ray.models", "dataset": "ursa_ray.datasets"}
"""The entry-point group of each kind of registry item."""

TASKS = ("classification", "regression")
BUILT_IN = "built-in"
IMPORT_PATH = "import path"
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_HYPERPARAMETER_KINDS = (bool, int, float, str, list)  # the kinds Hyperparameter.check knows


@dataclass(frozen=True)
class Entry:
    """One registry item: its name, where it comes from (``built-in``, ``entry point ...``, ``import
    path``), and the object, or ``problem``, one line saying why it cannot be used."""

    name: str
    origin: str
    item: Any = None
    problem: str | None = None

    def broken_message(self, kind: str) -> str:
        """The one-line error for a grid that names this broken item."""
        return f"plug-in {kind} {self.name!r} ({self.origin}) is broken: {self.problem}"


# ----------------------------------------------------------------------------------------------------
# The protocol
# ----------------------------------------------------------------------------------------------------


def check_name(name: Any) -> None:
    """A registry name: a non-empty string without ':' (import paths have one) or '/' (cell keys join names
    with it).  ValueError otherwise."""
    if not isinstance(name, str) or not name or ":" in name or "/" in name:
        raise ValueError(f"name must be a non-empty string without ':' or '/', got {name!r}")


def _attribute(item: Any, attribute: str) -> Any:
    if not hasattr(item, attribute):
        raise ValueError(f"missing {attribute}")
    return getattr(item, attribute)


def _check_string(item: Any, attribute: str) -> None:
    value = _attribute(item, attribute)
    if not isinstance(value, str):
        raise ValueError(f"{attribute} must be a string, got {value!r}")


def _check_callable(item: Any, attribute: str, required: bool = True) -> None:
    if not required and getattr(item, attribute, None) is None:
        return
    if not callable(_attribute(item, attribute)):
        raise ValueError(f"{attribute} must be callable, got {getattr(item, attribute)!r}")


def check_hyperparameters(declared: Any, attribute: str = "hyperparameters") -> None:
    """``declared``: a tuple of distinct :class:`~ursa_ray.methods.base.Hyperparameter`, each of a kind that
    ``Hyperparameter.check`` knows (bool, int, float, str, list) and with a default that passes its own
    check (None never does).  ValueError naming the first one that is not."""
    from ursa_ray.methods.base import Hyperparameter

    if not isinstance(declared, tuple) or not all(isinstance(h, Hyperparameter) for h in declared):
        raise ValueError(f"{attribute} must be a tuple of Hyperparameter, got {declared!r}")
    names = [h.name for h in declared]
    if len(set(names)) != len(names):
        raise ValueError(f"{attribute} must have distinct names, got {names}")
    for h in declared:
        if h.kind not in _HYPERPARAMETER_KINDS:
            allowed = ", ".join(k.__name__ for k in _HYPERPARAMETER_KINDS)
            raise ValueError(f"hyperparameter {h.name!r} has kind {h.kind!r}; allowed: {allowed}")
        if h.default is None:
            raise ValueError(f"hyperparameter {h.name!r} has no valid default: None")
        try:
            h.check(h.default)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"hyperparameter {h.name!r} has no valid default: {exc}") from None


def check_method(method: Any) -> None:
    """The method protocol (:class:`ursa_ray.methods.base.Method`, or an object written against the
    earlier protocol without it): ``name``; ``description`` (a string); ``hyperparameters``
    (:func:`check_hyperparameters`); ``constraints``, when present, a tuple of
    :class:`~ursa_ray.methods.base.Constraint` on declared hyperparameters (none when absent); a callable
    ``sample_posterior``; and, when present, callable ``warm_up`` and ``posterior_storage``.  ValueError
    naming the first breach."""
    from ursa_ray.methods.base import Constraint

    check_name(_attribute(method, "name"))
    _check_string(method, "description")
    check_hyperparameters(_attribute(method, "hyperparameters"))
    constraints = getattr(method, "constraints", ())
    if not isinstance(constraints, tuple) or not all(isinstance(c, Constraint) for c in constraints):
        raise ValueError(f"constraints must be a tuple of Constraint (() for none), got {constraints!r}")
    declared = {h.name for h in method.hyperparameters}
    for c in constraints:
        if not set(c.names) <= declared:
            raise ValueError(
                f"constraint {c.rule!r} names undeclared hyperparameters {sorted(set(c.names) - declared)}"
            )
    _check_callable(method, "sample_posterior")
    _check_callable(method, "warm_up", required=False)
    _check_callable(method, "posterior_storage", required=False)


def check_model(spec: Any) -> None:
    """The model protocol: a :class:`~ursa_ray.models.base.ModelSpec` with a valid name, a string
    description, a callable ``build``, valid ``options`` (:func:`check_hyperparameters`), ``tasks`` a
    non-empty tuple of classification/regression and a bool ``needs_feature_map``.  ValueError otherwise."""
    from ursa_ray.models.base import ModelSpec

    if not isinstance(spec, ModelSpec):
        raise ValueError(f"expected a ursa_ray.models.base.ModelSpec, got {type(spec).__name__}")
    check_name(spec.name)
    _check_string(spec, "description")
    _check_callable(spec, "build")
    check_hyperparameters(spec.options, "options")
    if not isinstance(spec.tasks, tuple) or not spec.tasks or not set(spec.tasks) <= set(TASKS):
        raise ValueError(f"tasks must be a non-empty tuple of {', '.join(TASKS)}, got {spec.tasks!r}")
    if not isinstance(spec.needs_feature_map, bool):
        raise ValueError(f"needs_feature_map must be true or false, got {spec.needs_feature_map!r}")


def check_dataset(spec: Any) -> None:
    """The dataset protocol: a :class:`~ursa_ray.data.base.DatasetSpec` with a valid name, ``task`` one of
    classification/regression, a string description, a callable ``load``, ``ood_sets`` a tuple of valid
    names, valid ``options`` (:func:`check_hyperparameters`), ``check`` None or callable, ``sweep`` None or
    the name of an option, and a bool ``decision_task``.  ValueError otherwise."""
    from ursa_ray.data.base import DatasetSpec

    if not isinstance(spec, DatasetSpec):
        raise ValueError(f"expected a ursa_ray.data.base.DatasetSpec, got {type(spec).__name__}")
    check_name(spec.name)
    if spec.task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {spec.task!r}")
    _check_string(spec, "description")
    _check_callable(spec, "load")
    if not isinstance(spec.ood_sets, tuple):
        raise ValueError(f"ood_sets must be a tuple of names, got {spec.ood_sets!r}")
    for ood in spec.ood_sets:
        check_name(ood)
    check_hyperparameters(spec.options, "options")
    _check_callable(spec, "check", required=False)
    if spec.sweep is not None and spec.sweep not in {h.name for h in spec.options}:
        raise ValueError(f"sweep must be None or the name of one of the options, got {spec.sweep!r}")
    if not isinstance(spec.decision_task, bool):
        raise ValueError(f"decision_task must be true or false, got {spec.decision_task!r}")


CHECKS: dict[str, Callable[[Any], None]] = {"method": check_method, "model": check_model, "dataset": check_dataset}
"""The protocol check of each kind."""


def registered(kind: str, item: Any) -> Any:
    """What the registry holds for ``item``, which passed ``kind``'s check: a method as a
    :class:`~ursa_ray.methods.base.Method` (:func:`~ursa_ray.methods.base.as_method` adapts one written
    against the earlier protocol), a model or dataset as it is."""
    from ursa_ray.methods.base import as_method

    return as_method(item) if kind == "method" else item


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _checked(kind: str, load: Callable[[], Any]) -> tuple[Any, str | None]:
    """(the object ``load()`` returns, instantiated if a class, None) when it follows ``kind``'s protocol,
    else (None, why not)."""
    try:
        item = load()
        if isinstance(item, type):
            item = item()
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # a plug-in may raise anything on import, even
        # sys.exit(0) (which would end validate or run with status 0 having done nothing): it must not stop the rest
        return None, f"cannot load: {_one_line(exc)}"
    try:
        CHECKS[kind](item)
    except ValueError as exc:
        return None, str(exc)
    except Exception as exc:  # an attribute that raises when read, a constraint whose names are not a tuple, ...
        return None, f"breaks the protocol: {_one_line(exc)}"
    return registered(kind, item), None


def discover(group: str) -> tuple[EntryPoint, ...]:
    """The installed distributions' entry points in ``group`` (none is loaded)."""
    return tuple(entry_points(group=group))


def entry_point_origin(entry_point: EntryPoint) -> str:
    """``entry point GROUP = VALUE from distribution NAME VERSION``."""
    dist = entry_point.dist
    source = f"distribution {dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"entry point {entry_point.group} = {entry_point.value} from {source}"


def entry_point_entries(kind: str) -> list[Entry]:
    """Every entry point of ``kind``'s group, loaded and checked; an entry point whose object's ``name``
    differs from the entry point's name is broken."""
    out = []
    for entry_point in discover(GROUPS[kind]):
        item, problem = _checked(kind, entry_point.load)
        if problem is None and item.name != entry_point.name:
            item, problem = (
                None,
                f"the entry point is named {entry_point.name!r} but the {kind}'s name is {item.name!r}",
            )
        out.append(Entry(entry_point.name, entry_point_origin(entry_point), item, problem))
    return out


def merge(kind: str, builtins: dict[str, Any], plugins: Iterable[Entry]) -> list[Entry]:
    """The built-ins, then the plug-ins by name.  A plug-in may not take a built-in's name (the built-in
    stays usable) nor another plug-in's (both become broken): each such plug-in is broken, naming the other
    origin; a plug-in broken already keeps its own problem."""
    plugins = sorted(plugins, key=lambda e: (e.name, e.origin))
    entries = [Entry(name, BUILT_IN, registered(kind, item)) for name, item in builtins.items()]
    for entry in plugins:
        others = [o.origin for o in plugins if o.name == entry.name and o is not entry]
        if entry.problem is None and entry.name in builtins:
            entry = Entry(entry.name, entry.origin, problem=f"the name {entry.name!r} is taken by the built-in {kind}")
        elif entry.problem is None and others:
            entry = Entry(
                entry.name, entry.origin, problem=f"{' and '.join(others)} also registers a {kind} {entry.name!r}"
            )
        entries.append(entry)
    return entries


def is_import_path(name: str) -> bool:
    """Whether a grid's name is to be imported (it has a ':'); see :func:`import_path_entry`."""
    return ":" in name


@cache
def import_path_entry(kind: str, path: str) -> Entry:
    """The object at ``package.module:Attribute`` (attributes may be dotted), loaded once per process and
    checked against ``kind``'s protocol; named ``path``.  The current directory goes on ``sys.path`` first
    (where a Ray worker of a local run, or of a job submitted with a working_dir, also starts)."""
    if not _IMPORT_PATH.fullmatch(path):
        return Entry(path, IMPORT_PATH, problem="not an import path; expected package.module:Attribute")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module, _, attributes = path.partition(":")

    def load() -> Any:
        item = importlib.import_module(module)
        for attribute in attributes.split("."):
            item = getattr(item, attribute)
        return item

    item, problem = _checked(kind, load)
    return Entry(path, IMPORT_PATH, item, problem)
