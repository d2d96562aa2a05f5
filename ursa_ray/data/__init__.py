"""Registry of datasets.  Every module here exports ``DATASETS``, a tuple of :class:`DatasetSpec`."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from ursa_ray.data.base import DatasetSpec


@cache
def registry() -> dict[str, DatasetSpec]:
    found: dict[str, DatasetSpec] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for spec in getattr(module, "DATASETS", ()):
            if spec.name in found:
                raise RuntimeError(f"dataset {spec.name!r} registered twice")
            found[spec.name] = spec
    return dict(sorted(found.items()))


def get_dataset(name: str) -> DatasetSpec:
    datasets = registry()
    if name not in datasets:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(datasets)}")
    return datasets[name]
