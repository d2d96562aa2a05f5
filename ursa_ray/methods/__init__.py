"""Registry of inference methods.

Every module in this package (other than ``base``) exports ``METHODS``, a tuple of objects following
:class:`ursa_ray.methods.base.Method`; the registry collects them by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ursa_ray.methods.base import Method


@cache
def registry() -> dict[str, Method]:
    """All registered methods by name."""
    found: dict[str, Method] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for method in getattr(module, "METHODS", ()):
            if method.name in found:
                raise RuntimeError(f"method {method.name!r} registered twice")
            found[method.name] = method
    return dict(sorted(found.items()))


def get_method(name: str) -> Method:
    """The method called ``name``; KeyError listing the known names otherwise."""
    methods = registry()
    if name not in methods:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(methods)}")
    return methods[name]
