"""Registry of models: every module here exports ``MODELS``, a tuple of :class:`ModelSpec`; plug-ins come
from the entry-point group ``ursa_ray.models`` and from import paths (:mod:`ursa_ray.plugins`)."""

from __future__ import annotations

from functools import cache

from ursa_ray.models.base import ModelSpec
from ursa_ray.registry import Catalogue, build_catalogue, collect


@cache
def catalogue() -> Catalogue:
    """The built-in models and the entry-point plug-ins, broken ones included."""
    return build_catalogue("model", collect("model", __name__, __path__, "MODELS"))


def registry() -> dict[str, ModelSpec]:
    """Every usable registered model (built-ins and entry-point plug-ins) by name."""
    return catalogue().usable


def get_model(name: str) -> ModelSpec:
    """The model a grid names ``name``: registered, or an import path (RegistryError if none is usable)."""
    return catalogue().get(name)
