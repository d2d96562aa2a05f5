"""The small checks every grid key is built from: one value against its allowed shape, a GridError in one line
naming the file, the field and what is allowed (:func:`fail`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ursa_ray.registry import RegistryError
from ursa_ray.search_space import check_value

if TYPE_CHECKING:
    from ursa_ray.methods.base import Hyperparameter

RESOURCE_KEYS = ("cpu", "gpu", "custom")
DEFAULT_RESOURCES: dict[str, Any] = {"cpu": 1, "gpu": 0, "custom": {}}
"""A trial's resources when neither the grid nor its method or model entry says."""


class GridError(ValueError):
    """A grid that cannot run; the message is one line naming the file, the field and what is allowed."""


def fail(path: str, where: str, message: str) -> GridError:
    """The GridError ``PATH: FIELD: MESSAGE`` (raised by the caller)."""
    return GridError(f"{path}: {where}: {message}")


def named(path: str, where: str, get: Callable[[str], Any], name: str) -> Any:
    """``get(name)``, a registry's lookup (a registered name or an import path ``package.module:Attribute``),
    or a GridError at ``where`` saying the name is unknown (and what is allowed) or a broken plug-in."""
    try:
        return get(name)
    except RegistryError as exc:
        raise fail(path, where, str(exc)) from None


def reject_former_names(
    path: str, where: str, owner: str, declared: tuple[Hyperparameter, ...], given: Mapping[str, Any]
) -> None:
    """Reject a name that one of ``owner``'s settings had before it was renamed
    (:attr:`Hyperparameter.formerly`), naming the setting to use instead."""
    for h in declared:
        for old in h.formerly:
            if old in given:
                raise fail(path, f"{where}.{old}", f"{owner} renamed {old!r} to {h.name!r}; use {h.name} ({h.doc})")


def check_options(
    path: str, where: str, owner: str, declared: tuple[Hyperparameter, ...], given: Any
) -> dict[str, Any]:
    """``given`` (a mapping of setting name to value) checked against ``declared``, the settings of
    ``owner`` (e.g. "method pca_ess"), for the grid field ``where``."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise fail(path, where, f"expected a mapping, got {type(given).__name__}")
    reject_former_names(path, where, owner, declared, given)
    table = {h.name: h for h in declared}
    out = {}
    for name, value in given.items():
        if name not in table:
            allowed = ", ".join(table) or "none"
            raise fail(path, f"{where}.{name}", f"unknown option; allowed: {allowed}")
        try:
            out[name] = check_value(table[name], value)
        except ValueError as exc:
            raise fail(path, f"{where}.{name}", str(exc)) from None
    return out


def positive_number(path: str, where: str, value: Any, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(path, where, f"expected a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise fail(path, where, f"expected a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def resources(path: str, where: str, raw: Any) -> dict[str, Any]:
    """A ``resources`` mapping (the grid's, or a method or model entry's) checked: only the keys it gives,
    ``cpu`` > 0, ``gpu`` >= 0 (below 1: a share of one GPU), ``custom`` a mapping of resource name to an
    amount > 0.  ``where`` is its field, e.g. ``models[1].resources``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(path, where, f"expected a mapping with keys {list(RESOURCE_KEYS)}, got {raw!r}")
    for key in raw:
        if key not in RESOURCE_KEYS:
            raise fail(path, f"{where}.{key}", f"unknown key; allowed: {', '.join(RESOURCE_KEYS)}")
    out: dict[str, Any] = {}
    if "cpu" in raw:
        out["cpu"] = positive_number(path, f"{where}.cpu", raw["cpu"], allow_zero=False)
    if "gpu" in raw:
        out["gpu"] = positive_number(path, f"{where}.gpu", raw["gpu"], allow_zero=True)
    if "custom" in raw:
        custom = raw["custom"] or {}
        if not isinstance(custom, dict):
            raise fail(path, f"{where}.custom", f"expected a mapping of resource name to amount, got {custom!r}")
        out["custom"] = {
            str(key): positive_number(path, f"{where}.custom.{key}", value, allow_zero=False)
            for key, value in custom.items()
        }
    return out


def integer(path: str, where: str, value: Any, minimum: int) -> int:
    """``value``, an integer >= ``minimum`` (a boolean is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(path, where, f"expected an integer >= {minimum}, got {value!r}")
    return value


def boolean(path: str, where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(path, where, f"expected true or false, got {value!r}")
    return value


def name_subset(path: str, where: str, value: Any, known: list[str], noun: str) -> tuple[str, ...] | None:
    """A method entry's (or a reference block's) optional restriction to some of the grid's models or datasets."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise fail(path, where, f"expected a non-empty list of {noun} names")
    for v in value:
        if v not in known:
            raise fail(path, where, f"{v!r} is not among the grid's {noun}s: {', '.join(known)}")
    return tuple(value)


class Checking:
    """One grid being checked: its file ``path``, its top-level mapping ``raw`` and the schema's ``keys``
    (:class:`ursa_ray.grid.schema.Key`).  ``checking[name]`` is key ``name``'s checked value, its default when
    the grid leaves it out, checked on first use: a key's parser reads the keys it depends on this way (the
    methods read the grid's models, datasets and budget), so each key is checked once and after those."""

    def __init__(self, path: str, raw: Mapping[str, Any], keys: Mapping[str, Any]) -> None:
        self.path = path
        self.raw = raw
        self.keys = keys
        self.checked: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.checked:
            key = self.keys[name]
            self.checked[name] = key.parse(self, self.raw[name] if name in self.raw else key.default_value())
        return self.checked[name]

    def help(self, name: str) -> str:
        """Key ``name``'s one-line help (what it holds and allows)."""
        return self.keys[name].help

    def fail(self, where: str, message: str) -> GridError:
        return fail(self.path, where, message)
