"""Plug-in discovery shared by the method, dataset and model registries.

Every public module of a registry package exports a tuple named by the registry (``METHODS``,
``DATASETS``, ``MODELS``); the registry collects those objects by their ``name``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any


def collect(package: str, path: Iterable[str], attribute: str) -> dict[str, Any]:
    """``{obj.name: obj}`` over ``attribute`` of every module of ``package`` not starting with ``_`` or named base."""
    found: dict[str, Any] = {}
    for info in pkgutil.iter_modules(path):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for item in getattr(module, attribute, ()):
            if item.name in found:
                raise RuntimeError(f"{attribute.lower()[:-1]} {item.name!r} registered twice")
            found[item.name] = item
    return dict(sorted(found.items()))


def lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    """``table[name]``, or a KeyError that lists the known names."""
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    return table[name]
