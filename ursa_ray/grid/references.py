"""The grid's ``reference``: one block or a list of blocks, each the settings of a computed reference
posterior (multi-chain HMC, :mod:`ursa_ray.reference`) or a file, and the cells it serves (docs/fidelity.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ursa_ray.grid.entries import ReferenceBlock
from ursa_ray.grid.fields import Checking, check_options, fail, name_subset, reject_former_names, resources
from ursa_ray.spec import REFERENCE_LOCATION_KEYS

REFERENCE_BLOCK_KEYS = ("models", "datasets", "file", *REFERENCE_LOCATION_KEYS)
"""A ``reference`` block's keys besides the settings of a computed reference (:func:`ursa_ray.reference.declared_settings`)."""


def parse_references(checking: Checking, value: Any) -> tuple[ReferenceBlock, ...]:
    """The grid's ``reference``: one block (a mapping) or a list of blocks, each checked by :func:`reference_block`;
    empty when absent."""
    if value is None:
        return ()
    names = ([m.name for m in checking["models"]], [d.name for d in checking["datasets"]])
    if isinstance(value, list) and value:
        return tuple(reference_block(checking.path, f"reference[{i}]", block, *names) for i, block in enumerate(value))
    return (reference_block(checking.path, "reference", value, *names),)


def reference_block(
    path: str, where: str, raw: Any, model_names: list[str], dataset_names: list[str]
) -> ReferenceBlock:
    """One ``reference`` block: optional ``models`` / ``datasets`` selectors (names of the grid's), then either
    ``file`` alone (a path, relative to the grid file's folder) or the settings of a computed reference (keys from
    :func:`ursa_ray.reference.declared_settings` with their ranges, the unset ones left to
    :data:`ursa_ray.reference.SETTINGS_DEFAULTS` and HMC's defaults; a burn-in it cannot afford is not checked
    here, HMC's adaptation runs within it) with an optional ``dir`` and ``resources`` (the reference trial's
    request, each key over the cell's: :func:`ursa_ray.grid.fields.resources`)."""
    from ursa_ray import reference

    declared = reference.declared_settings()
    allowed = [h.name for h in declared] + list(REFERENCE_BLOCK_KEYS)
    if not isinstance(raw, dict) or not raw:
        listed = ", or a list of such blocks" if where == "reference" else ""
        raise fail(path, where, f"expected a mapping with keys among {', '.join(allowed)}{listed}")
    reject_former_names(path, where, "reference", declared, raw)
    for key in raw:
        if key not in allowed:
            raise fail(path, f"{where}.{key}", f"unknown option; allowed: {', '.join(allowed)}")
    models = name_subset(path, f"{where}.models", raw.get("models"), model_names, "model")
    datasets = name_subset(path, f"{where}.datasets", raw.get("datasets"), dataset_names, "dataset")
    given = {k: v for k, v in raw.items() if k not in ("models", "datasets")}
    if "file" in given:
        settings = _from_file(path, where, given)
    else:
        hmc = {k: v for k, v in given.items() if k not in REFERENCE_LOCATION_KEYS}
        settings = check_options(path, where, "reference", declared, hmc)
        if "dir" in given:
            settings["dir"] = _reference_path(path, f"{where}.dir", given["dir"])
        if "resources" in given:  # the reference trial's own request (more CPUs: its chains' passes use them)
            settings["resources"] = resources(path, f"{where}.resources", given["resources"])
    return ReferenceBlock(settings, models, datasets, where)


def _from_file(path: str, where: str, given: dict[str, Any]) -> dict[str, Any]:
    """A block's settings for a reference read from ``file`` (given alone): the absolute path and its sha256."""
    from ursa_ray.data.files import content_digest

    for key in given:
        if key != "file":
            raise fail(path, f"{where}.{key}", "a reference from file is not computed: give file alone")
    file = _reference_path(path, f"{where}.file", given["file"])
    return {"file": file, "sha256": content_digest([file])}


def _reference_path(path: str, where: str, value: Any) -> str:
    """A block's ``file`` or ``dir``: absolute, a relative path taken from the grid file's folder; a ``dir`` may
    be an object-store URI (``s3://...``), kept as given."""
    if not isinstance(value, str) or not value:
        raise fail(path, where, f"expected a path (relative to the grid file's folder), got {value!r}")
    if "://" in value:
        return value
    return str((Path(path).parent / Path(value).expanduser()).resolve())
