"""The checks that need a grid's data: every dataset's files are there (or a dataset read from files loads and
fits its models), and each cell's reference can be used (a file that fits the cell's evaluation sets, a computed
one small enough for full-batch HMC).  ``ursa-ray run`` and ``validate`` call :func:`check_data` after the
schema's checks; whether each trial's resources fit a node of the cluster is checked by
:func:`ursa_ray.tune.cluster.check_cluster_fits` (Ray code lives in ursa_ray.tune)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ursa_ray.grid.entries import DatasetEntry, ModelEntry, ReferenceBlock
from ursa_ray.grid.expand import Grid
from ursa_ray.grid.fields import GridError, fail


def check_data(grid: Grid) -> None:
    """Raise GridError when a dataset's files are missing (before any trial starts), a dataset read from files
    cannot be used (each is loaded once, see :func:`_check_file_dataset`), or a cell's reference cannot be: a
    computed one too large for full-batch HMC, a file that does not fit the cell's evaluation sets."""
    from ursa_ray import data

    root = data.base.data_root(grid.data_root)
    for i, d in enumerate(grid.datasets):
        if d.file is not None:
            _check_file_dataset(grid, i, d)
            continue
        spec = data.get_dataset(d.name)
        if spec.check is None or grid.download:
            continue
        try:
            spec.check(root, d.ood)
        except data.base.DatasetMissing as exc:
            raise GridError(f"{grid.path}: datasets[{i}]: {exc}") from None
    loaded: dict[str, Any] = {}  # each dataset (and options) loaded once for the reference checks
    for block, cell in grid.reference_cells():
        d, ood = cell["dataset"], cell["dataset"].ood if "file" in block.settings else ()  # a file may hold OOD sets
        key = json.dumps([d.name, cell["dataset_options"], ood], sort_keys=True, default=str)
        if key not in loaded:
            loaded[key] = data.dataset_spec(d.name, d.file).load(
                dict(cell["dataset_options"]), ood, root, grid.download, 0
            )
        if "file" in block.settings:
            _check_reference_file(grid, block, loaded[key])
        else:
            _check_reference_fits(grid, block, cell["model"], d.name, loaded[key])


def _check_reference_file(grid: Grid, block: ReferenceBlock, ds: Any) -> None:
    """Refuse a reference file that is missing, unreadable, or whose sets, examples, classes or test labels (a
    saved prediction table's) do not fit the evaluation sets of a cell it serves, or, without labels, whose test
    predictions agree with the set's labels no more than in a random order
    (:func:`ursa_ray.reference.check_reference_sets`, :func:`~ursa_ray.reference.check_reference_labels`,
    :func:`~ursa_ray.reference.check_reference_order`): one line naming the file and ``reference.file``."""
    from ursa_ray import reference

    sizes = {"test": int(ds.test_x.shape[0]), **{name: int(x.shape[0]) for name, x in ds.ood.items()}}
    try:
        sets = reference.read_reference_file(block.settings["file"])
        reference.check_reference_sets(sets, sizes, ds.n_outputs)
        labels = reference.file_test_labels(block.settings["file"])
        if labels is None:
            reference.check_reference_order(sets["test"], ds.test_y.numpy())
        else:
            reference.check_reference_labels(labels, ds.test_y.numpy())
    except reference.ReferenceFileError as exc:
        raise fail(grid.path, f"{block.field_name}.file", f"{block.settings['file']}: {exc}") from None


def _check_reference_fits(grid: Grid, block: ReferenceBlock, mo: ModelEntry, dataset: str, ds: Any) -> None:
    """Refuse a computed reference on a classification (model, dataset) whose full-batch memory estimate
    (:func:`ursa_ray.reference.full_batch_bytes`) exceeds :data:`ursa_ray.reference.MAX_FULL_BATCH_BYTES`; the
    model is built once on the CPU."""
    from ursa_ray import models, reference

    chains = int({**reference.SETTINGS_DEFAULTS, **block.settings}["chains"])
    model_spec = models.get_model(mo.name)
    kwargs = dict(mo.options)
    if model_spec.needs_feature_map:
        kwargs["feature_map"] = ds.feature_map
    n_params = sum(p.numel() for p in model_spec.build(ds.input_shape, ds.n_outputs, **kwargs).parameters())
    need = reference.full_batch_bytes(len(ds.train_y), math.prod(ds.input_shape), n_params, chains)
    if need > reference.MAX_FULL_BATCH_BYTES:
        raise fail(
            grid.path,
            block.field_name,
            f"full-batch HMC on {mo.name}/{dataset} needs at least {need / 2**20:,.0f} MiB "
            f"({len(ds.train_y):,} training inputs of {math.prod(ds.input_shape):,} values and {chains} chains of "
            f"{n_params:,} parameters); the limit is {reference.MAX_FULL_BATCH_BYTES / 2**20:,.0f} MiB",
        )


def _check_padding_readers(grid: Grid, dataset: str, ds: Any) -> None:
    """Refuse a model paired with ``dataset`` whose inputs hold NaN padding (variable-length sequences) unless
    it reads padded sequences (:attr:`~ursa_ray.models.base.ModelSpec.reads_padded_sequences`): any other
    network would put the padding's NaN into every output."""
    from ursa_ray import models

    inputs = [ds.train_x, ds.test_x, *ds.ood.values()]
    if not any(bool(x.isnan().any()) for x in inputs):
        return
    paired = dict.fromkeys(c["model"].name for c in grid.cells() if c["dataset"].name == dataset)
    refused = [name for name in paired if not models.get_model(name).reads_padded_sequences]
    if refused:
        readers = [name for name, spec in models.registry().items() if spec.reads_padded_sequences]
        raise fail(
            grid.path,
            "models",
            f"{', '.join(refused)} cannot read the padded sequences of {dataset!r} (NaN steps past each "
            f"sequence's length); models that can: {', '.join(readers)}",
        )


def _check_file_dataset(grid: Grid, index: int, entry: DatasetEntry) -> None:
    """Load a dataset read from files as a trial will (:func:`ursa_ray.data.files.load_file_dataset`): a file
    that cannot be used is a GridError at ``datasets[index].file.KEY``; an image classification set needs
    the grid's ``adversarial.epsilons`` (pixel units; there are no family defaults for it)."""
    from ursa_ray import data
    from ursa_ray.data.files import FileDatasetError
    from ursa_ray.evaluation.adversarial import AdversarialSettings

    where = f"datasets[{index}].file"
    try:
        ds = data.dataset_spec(entry.name, entry.file).load({}, entry.ood, Path(), False, 0)
    except FileDatasetError as exc:
        raise GridError(f"{grid.path}: {'.'.join(filter(None, (where, exc.field)))}: {exc}") from None
    _check_padding_readers(grid, entry.name, ds)
    if ds.task == "classification" and ds.pixel_mean is not None:
        try:
            AdversarialSettings(**grid.adversarial).epsilons_for(entry.name)
        except ValueError as error:
            raise fail(
                grid.path,
                "adversarial.epsilons",
                f"{error}; give epsilons (pixel units) for the images of {entry.name!r}",
            ) from None
