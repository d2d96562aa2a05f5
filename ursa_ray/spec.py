"""The trial spec: everything one trial needs to run, built in one place (:meth:`ursa_ray.grid.Grid.spec_for`)
and read by attribute everywhere else (the trial, its probes, the Tune layer, the results rows).

It is a frozen dataclass: a copy with other values is ``dataclasses.replace(spec, ...)`` (a search trial's
sampled hyperparameters, a reference's HMC settings, the locations the run orchestration adds).  It imports
nothing from ``ursa_ray`` (nor torch, nor Ray): the Tune driver and every worker unpickle it cheaply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PHASES = ("search", "final", "reference")
"""A trial's phase: a search trial (a sampled configuration scored on a validation split), a final trial
(the grid's or the search's configuration scored on the test and OOD sets), or a cell's reference posterior
(:mod:`ursa_ray.reference`)."""

REFERENCE_LOCATION_KEYS = ("dir", "resources")
"""Settings of a ``reference`` block that say where a computed reference is stored (``dir``) or runs
(``resources``: its trial's request, each key over the cell's), not what it is: left out of its fingerprint
and of every trial id."""


@dataclass(frozen=True)
class TrialSpec:
    """One trial of a grid.  The mutable values (dicts of options, hyperparameters, settings) are shared with
    the grid and between the seeds of a cell: read them, never change them."""

    phase: str
    """One of :data:`PHASES`."""
    method: str
    """The method's registry name (a built-in's name or a plug-in's import path), resolved by every worker."""
    label: str
    """The method's display name in the results (``method`` column) and reports; the grid entry's ``label``."""
    model: str
    """The model's registry name."""
    model_options: dict[str, Any]
    """The model's options as the grid gives them (its builder's keyword arguments)."""
    dataset: str
    """The dataset's registry name, or a file dataset's name in the grid."""
    task: str
    """``classification`` or ``regression``."""
    decision_task: bool
    """Whether the dataset carries the cost-sensitive decision task (no robustness evaluation then)."""
    dataset_options: dict[str, Any]
    """The dataset's options, with the swept ``complexity`` filled in."""
    dataset_file: dict[str, Any] | None
    """A dataset read from files: its checked ``file`` block (paths, format, sha256 of the content); else None."""
    complexity: int | float | None
    """The regression complexity swept (the dataset option's value as the grid gives it); None for a dataset
    without a sweep."""
    ood: tuple[str, ...]
    """The OOD sets the grid asks for, by name."""
    seed: int
    """The trial's seed (:func:`ursa_ray.trial.trial_seeds` derives its random streams from it)."""
    config: dict[str, Any]
    """The method's resolved configuration: every declared hyperparameter (defaults, then the grid's budget,
    hyperparameters and per-model hyperparameters, then the search's values)."""
    save_predictions: bool
    """Whether a final classification trial saves its per-example predictions."""
    bit_depths: tuple[str, ...]
    """The storage schemes (``float16``, ``int8``, ...) a final classification trial is also scored at."""
    precision: str | None
    """The grid's training precision (``bf16-mixed``, ``float32``); None: the device's default."""
    corruptions: dict[str, Any]
    """The grid's ``corruptions`` block (types, severities, examples)."""
    adversarial: dict[str, Any]
    """The grid's ``adversarial`` block (epsilons, examples, attack samples, transfer)."""
    data_root: str | None
    """Where datasets on disk live; None: the default (:func:`ursa_ray.data.base.data_root`)."""
    download: bool
    """Whether a missing dataset may be downloaded."""
    resources: dict[str, Any]
    """What one trial asks Ray for: ``{cpu, gpu, custom}`` (CPUs and GPUs, fractions allowed; custom resources
    by name)."""
    cell: str
    """The cell's name, ``LABEL/MODEL/DATASET[/cC]`` (:func:`ursa_ray.grid.cell_key`); ``reference/MODEL/DATASET``
    for a reference trial."""
    vectorize_seeds: int = 1
    """How many seeds of the cell one Tune trial trains as one batched computation (final phase; else 1)."""
    trial_id: str = ""
    """The trial's id (:func:`ursa_ray.grid.trial_id`, a hash of what its result depends on; a search trial's
    carries Tune's trial id)."""
    validation_fraction: float | None = None
    """A search trial's validation split, a fraction of the training set; None in the other phases."""
    reference: dict[str, Any] | None = None
    """The settings of the grid's ``reference`` block serving this cell (:class:`ursa_ray.grid.ReferenceBlock`:
    a computed reference's, with optional :data:`REFERENCE_LOCATION_KEYS`; or ``file`` and ``sha256``), on a
    final classification trial's spec (and its reference's); else None."""
    calibrate: str | None = None
    """The method entry's post-hoc calibration, ``temperature`` (:data:`ursa_ray.grid.CALIBRATIONS`), on a final
    classification trial's spec: the trial holds out a validation split of its training set and reports its
    sets tempered by the temperature fitted there (``SET@calibrated``) beside the raw ones; else None."""
    reference_from: str | None = None
    """The id of the cell's reference trial, which runs first; None without a reference."""
    transfer_source: bool = False
    """Whether the trial crafts the transfer attack's examples for the trials of its (model, dataset, seed)."""
    transfer_from: str | None = None
    """The id of the transfer source whose examples this trial is scored on; None: not scored on any."""
    references_dir: str | None = None
    """Where the cell's reference is stored (the block's ``dir``, else the results' ``references/`` folder), set by the run when the
    trial is handed out (:class:`ursa_ray.tune.queue.SpecQueue`)."""
    transfer_examples: str | None = None
    """Where the transfer source saved its examples, set by the run when the trial is handed out; None: none
    saved (yet)."""

    @property
    def complexity_or_nan(self) -> float:
        """:attr:`complexity` as a float, NaN without one (the ``complexity`` columns of the results)."""
        return math.nan if self.complexity is None else float(self.complexity)

    @property
    def cell_slug(self) -> str:
        """:attr:`cell` as one path component (``/`` made ``-``), as trial ids and Tune folders carry it."""
        return self.cell.replace("/", "-")
