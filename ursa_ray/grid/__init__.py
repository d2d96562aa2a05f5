"""Grid files: read (:mod:`~ursa_ray.grid.loader`), checked key by key against the schema
(:mod:`~ursa_ray.grid.schema`, one entry per top-level key; the lists of methods, models and datasets in
:mod:`~ursa_ray.grid.entries`, the other keys' parsers in :mod:`~ursa_ray.grid.blocks` and
:mod:`~ursa_ray.grid.references`, the checks across keys in :mod:`~ursa_ray.grid.crosschecks`), expanded into
trial specs (:mod:`~ursa_ray.grid.expand`), and checked against their data (:mod:`~ursa_ray.grid.data_checks`;
whether each trial's request fits a node of the cluster: :func:`ursa_ray.tune.cluster.check_cluster_fits`).
README's grid reference is generated from the schema (:mod:`~ursa_ray.grid.docs`).

A grid names methods, models, datasets and seeds; every (method, model, dataset[, complexity], seed) is one
final-phase trial.  Validation rejects a bad grid before any trial starts with a one-line :class:`GridError`
naming the file, the field and what is allowed.  Nothing here imports torch on import: the registries are
imported where a grid is checked or its specs built, so a run's Tune driver reads a checked grid without them.
"""

from ursa_ray.grid.blocks import DEFAULT_MAX_TRIALS, DEFAULT_VECTORIZE_SEEDS, MAX_SEED
from ursa_ray.grid.data_checks import check_data
from ursa_ray.grid.entries import CALIBRATIONS, DatasetEntry, MethodEntry, ModelEntry, ReferenceBlock
from ursa_ray.grid.expand import Grid, cell_key, trial_id
from ursa_ray.grid.fields import GridError
from ursa_ray.grid.loader import MAX_YAML_NODES, GridLoader, load_grid
from ursa_ray.grid.schema import KEYS, Key, parse_grid, parse_statistics

__all__ = [
    "CALIBRATIONS",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_VECTORIZE_SEEDS",
    "KEYS",
    "MAX_SEED",
    "MAX_YAML_NODES",
    "DatasetEntry",
    "Grid",
    "GridError",
    "GridLoader",
    "Key",
    "MethodEntry",
    "ModelEntry",
    "ReferenceBlock",
    "cell_key",
    "check_data",
    "load_grid",
    "parse_grid",
    "parse_statistics",
    "trial_id",
]
