"""Registry of inference methods: every module here exports ``METHODS``, a tuple of objects following
:class:`ursa_ray.methods.base.Method`."""

from __future__ import annotations

from functools import cache

from ursa_ray.methods.base import Method
from ursa_ray.registry import collect, lookup


@cache
def registry() -> dict[str, Method]:
    """All registered methods by name."""
    return collect(__name__, __path__, "METHODS")


def get_method(name: str) -> Method:
    return lookup(registry(), "method", name)
