"""Registry of datasets: every module here exports ``DATASETS``, a tuple of :class:`DatasetSpec`."""

from __future__ import annotations

from functools import cache

from ursa_ray.data.base import DatasetSpec
from ursa_ray.registry import collect, lookup


@cache
def registry() -> dict[str, DatasetSpec]:
    """All registered datasets by name."""
    return collect(__name__, __path__, "DATASETS")


def get_dataset(name: str) -> DatasetSpec:
    return lookup(registry(), "dataset", name)
