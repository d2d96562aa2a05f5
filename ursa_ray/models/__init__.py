"""Registry of models.  Every module here exports ``MODELS``, a tuple of :class:`ModelSpec`."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ursa_ray.models.base import ModelSpec


@cache
def registry() -> dict[str, ModelSpec]:
    found: dict[str, ModelSpec] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for spec in getattr(module, "MODELS", ()):
            if spec.name in found:
                raise RuntimeError(f"model {spec.name!r} registered twice")
            found[spec.name] = spec
    return dict(sorted(found.items()))


def get_model(name: str) -> ModelSpec:
    models = registry()
    if name not in models:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(models)}")
    return models[name]
