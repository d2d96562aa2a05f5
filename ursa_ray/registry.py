"""The registries of methods, models and datasets: built-ins, entry-point plug-ins and import paths.

Every public module of a registry package exports a tuple named by the registry (``METHODS``,
``DATASETS``, ``MODELS``); the registry collects those objects by their ``name``, adds the plug-ins of its
entry-point group and resolves import paths on demand (:mod:`ursa_ray.plugins`).  Each item passes its
kind's protocol check: a built-in that does not is a bug (RuntimeError), a plug-in that does not is kept as
broken.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ursa_ray.plugins import BUILT_IN, CHECKS, Entry, entry_point_entries, import_path_entry, is_import_path, merge


class RegistryError(KeyError):
    """A name that names nothing usable: unknown, or a broken plug-in.  ``str()`` is the one-line message
    (a grid's validation puts it after the field)."""

    def __str__(self) -> str:
        return str(self.args[0])


def collect(kind: str, package: str, path: Iterable[str], attribute: str) -> dict[str, Any]:
    """``{obj.name: obj}`` over ``attribute`` of every module of ``package`` not starting with ``_`` or
    named base, sorted by name; each object checked against ``kind``'s protocol."""
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(path):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for item in getattr(module, attribute, ()):
            try:
                CHECKS[kind](item)
            except ValueError as exc:
                raise RuntimeError(f"built-in {kind} in {module.__name__} breaks the protocol: {exc}") from None
            if item.name in found:
                raise RuntimeError(f"{kind} {item.name!r} registered twice")
            found[item.name] = item
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Catalogue:
    """Everything of one kind.  ``entries``: the listing, built-ins first, then the entry-point plug-ins by
    name, broken ones included; ``usable``: the objects a grid may name, by name; ``broken``: the names
    that lead only to a broken plug-in."""

    kind: str
    entries: tuple[Entry, ...]
    usable: dict[str, Any]
    broken: dict[str, Entry]

    @property
    def built_ins(self) -> dict[str, Any]:
        """The built-in items by name (what this package ships, whatever plug-ins are installed)."""
        return {e.name: e.item for e in self.entries if e.origin == BUILT_IN}

    def get(self, name: str) -> Any:
        """The object named ``name``: a registered one, else the object at an import path.  RegistryError
        when the name is unknown or leads to a broken plug-in."""
        if name in self.usable:
            return self.usable[name]
        if name in self.broken:
            raise RegistryError(self.broken[name].broken_message(self.kind))
        if is_import_path(name):
            entry = import_path_entry(self.kind, name)
            if entry.problem is not None:
                raise RegistryError(entry.broken_message(self.kind))
            return entry.item
        allowed = ", ".join(self.usable)
        raise RegistryError(
            f"unknown {self.kind} {name!r}; allowed: {allowed}, or an import path package.module:Attribute"
        )


def build_catalogue(kind: str, builtins: dict[str, Any]) -> Catalogue:
    """The catalogue of ``builtins`` (see :func:`collect`) and the entry points of ``kind``'s group."""
    entries = tuple(merge(kind, builtins, entry_point_entries(kind)))
    usable = {e.name: e.item for e in entries if e.problem is None}
    broken: dict[str, Entry] = {}
    for e in entries:
        if e.problem is not None and e.name not in usable:
            broken.setdefault(e.name, e)
    return Catalogue(kind, entries, usable, broken)
