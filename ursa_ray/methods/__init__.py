"""Registry of inference methods: every module here exports ``METHODS``, a tuple of objects following
:class:`ursa_ray.methods.base.Method`; plug-ins come from the entry-point group ``ursa_ray.methods`` and
from import paths (:mod:`ursa_ray.plugins`)."""

from __future__ import annotations

from functools import cache

from ursa_ray.methods.base import Method
from ursa_ray.registry import Catalogue, build_catalogue, collect


@cache
def catalogue() -> Catalogue:
    """The built-in methods and the entry-point plug-ins, broken ones included."""
    return build_catalogue("method", collect("method", __name__, __path__, "METHODS"))


def registry() -> dict[str, Method]:
    """Every usable registered method (built-ins and entry-point plug-ins) by name."""
    return catalogue().usable


def get_method(name: str) -> Method:
    """The method a grid names ``name``: registered, or an import path (RegistryError if none is usable)."""
    return catalogue().get(name)
