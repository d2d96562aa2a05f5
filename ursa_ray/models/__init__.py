"""Registry of models: every module here exports ``MODELS``, a tuple of :class:`ModelSpec`."""

from __future__ import annotations

from functools import cache

from ursa_ray.models.base import ModelSpec
from ursa_ray.registry import collect, lookup


@cache
def registry() -> dict[str, ModelSpec]:
    """All registered models by name."""
    return collect(__name__, __path__, "MODELS")


def get_model(name: str) -> ModelSpec:
    return lookup(registry(), "model", name)
