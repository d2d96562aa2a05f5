"""Registry of datasets: every module here exports ``DATASETS``, a tuple of :class:`DatasetSpec`; plug-ins
come from the entry-point group ``ursa_ray.datasets`` and from import paths (:mod:`ursa_ray.plugins`)."""

from __future__ import annotations

from functools import cache

from ursa_ray.data.base import DatasetSpec
from ursa_ray.data.files import dataset_spec  # noqa: F401  (a registered dataset, or one read from files)
from ursa_ray.registry import Catalogue, build_catalogue, collect


@cache
def catalogue() -> Catalogue:
    """The built-in datasets and the entry-point plug-ins, broken ones included."""
    return build_catalogue("dataset", collect("dataset", __name__, __path__, "DATASETS"))


def registry() -> dict[str, DatasetSpec]:
    """Every usable registered dataset (built-ins and entry-point plug-ins) by name."""
    return catalogue().usable


def get_dataset(name: str) -> DatasetSpec:
    """The dataset a grid names ``name``: registered, or an import path (RegistryError if none is usable)."""
    return catalogue().get(name)
