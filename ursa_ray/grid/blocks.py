"""The parsers of the grid's top-level keys other than its three lists (:mod:`ursa_ray.grid.entries`) and its
reference (:mod:`ursa_ray.grid.references`): each takes the grid being checked and the key's value (its default
when the grid leaves it out) and returns the checked value, or raises a one-line GridError."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ursa_ray.grid.fields import DEFAULT_RESOURCES, Checking, GridError, fail, integer, resources
from ursa_ray.search_space import SearchSettings, parse_search_settings

GRID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A grid's name, used as the default results folder ``results/<name>``: one path component."""
MAX_SEED = 2**31 - 1
"""The largest seed a grid may give: every generator a seed reaches accepts it (``numpy.random.SeedSequence``,
``torch.Generator``, and the 32-bit legacy seeding of Optuna's TPE sampler, which the search phase seeds with
the first seed plus the number of search trials), and so do the int64 columns of the results."""
DEFAULT_MAX_TRIALS = 100_000
"""The most final trials a grid may have unless its ``max_trials`` key allows more (validation counts them
without expanding them)."""
DEFAULT_VECTORIZE_SEEDS = 8
"""Seeds per batched trial when a grid does not say (see :meth:`Grid.vectorized_seeds`)."""
BUDGET_KEYS = ("epochs", "n_samples", "batch_size")
"""The keys of the grid's ``budget`` block: hyperparameters it sets for every method that declares them."""
CORRUPTION_KEYS = ("types", "severities", "n_examples")
STATISTICS_INTERVALS = ("t", "bootstrap")
"""The values of the grid's ``statistics.interval`` (the same as :data:`analysis.intervals.INTERVALS`)."""


def parse_name(checking: Checking, value: Any) -> str:
    if not isinstance(value, str) or not GRID_NAME.fullmatch(value):
        raise checking.fail(
            "name",
            "expected letters, digits, '_', '-' and '.', starting with a letter or digit, at most 100 "
            f"characters (the name is the folder results/<name>), got {value!r}",
        )
    return value


def parse_description(checking: Checking, value: Any) -> str:
    if not isinstance(value, str):
        raise checking.fail("description", "expected a string (free text)")
    return value


def parse_seeds(checking: Checking, value: Any) -> Sequence[int]:
    """The grid's ``seeds``: ``n`` is ``range(n)`` (counted, never listed), a list its distinct values; every
    seed in [0, :data:`MAX_SEED`]."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEED + 1:
            raise checking.fail(
                "seeds", f"expected a number of seeds from 1 to {MAX_SEED + 1} (seeds 0..n-1), got {value!r}"
            )
        return range(value)
    if not isinstance(value, list) or not value:
        raise checking.fail("seeds", f"expected {checking.help('seeds')}, got {value!r}")
    for i, seed in enumerate(value):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise checking.fail(f"seeds[{i}]", f"expected an integer in [0, {MAX_SEED}] (2^31 - 1), got {seed!r}")
    if len(set(value)) != len(value):
        raise checking.fail("seeds", "seeds must be distinct")
    return tuple(value)


def parse_resources(checking: Checking, value: Any) -> dict[str, Any]:
    """The grid's ``resources``, every key filled in (:data:`~ursa_ray.grid.fields.DEFAULT_RESOURCES`): what a
    trial gets unless its method or model entry says otherwise (:meth:`Grid.resources_for`)."""
    return {**DEFAULT_RESOURCES, "custom": {}, **resources(checking.path, "resources", value or {})}


def parse_budget(checking: Checking, value: Any) -> dict[str, int]:
    value = value or {}
    if not isinstance(value, dict):
        raise checking.fail("budget", f"expected a mapping with keys {list(BUDGET_KEYS)}")
    budget = {}
    for key, amount in value.items():
        if key not in BUDGET_KEYS:
            raise checking.fail(f"budget.{key}", f"unknown key; allowed: {', '.join(BUDGET_KEYS)}")
        budget[key] = integer(checking.path, f"budget.{key}", amount, 1)
    return budget


def parse_corruptions(checking: Checking, value: Any) -> dict[str, Any]:
    """The ``corruptions`` block with its defaults: every type, severities 1–5, the first 1,000 test examples;
    ``types: []`` turns the corruption sets off."""
    from ursa_ray.evaluation.corruptions import CORRUPTIONS, SEVERITIES, validate_corruptions

    if not isinstance(value, dict):
        raise checking.fail("corruptions", f"expected a mapping with keys {', '.join(CORRUPTION_KEYS)}")
    for key in value:
        if key not in CORRUPTION_KEYS:
            raise checking.fail(f"corruptions.{key}", f"unknown key; allowed: {', '.join(CORRUPTION_KEYS)}")
    types = value.get("types", "all")
    types = list(CORRUPTIONS) if types == "all" else types
    severities = value.get("severities", list(SEVERITIES))
    for key, given in (("types", types), ("severities", severities)):
        if not isinstance(given, list):
            raise checking.fail(f"corruptions.{key}", f"expected a list, got {given!r}")
    try:
        validate_corruptions(types, severities)
    except ValueError as error:
        raise checking.fail("corruptions", str(error)) from None
    n_examples = integer(checking.path, "corruptions.n_examples", value.get("n_examples", 1000), 1)
    return {"types": list(dict.fromkeys(types)), "severities": sorted(set(severities)), "n_examples": n_examples}


def parse_adversarial(checking: Checking, value: Any) -> dict[str, Any]:
    """The ``adversarial`` block (:func:`ursa_ray.evaluation.adversarial.validate_adversarial`), with an ε for
    every registered image classification dataset of the grid."""
    from ursa_ray import data
    from ursa_ray.evaluation.adversarial import validate_adversarial

    try:
        settings = validate_adversarial(value)
    except ValueError as error:
        raise GridError(f"{checking.path}: {error}") from None  # the message names its field, adversarial.…
    for d in checking["datasets"]:
        spec = None if d.file is not None else data.get_dataset(d.name)
        if spec is not None and d.task == "classification" and not spec.decision_task and spec.images:
            try:
                settings.epsilons_for(d.name)
            except ValueError as error:
                raise checking.fail("adversarial.epsilons", f"{error}; give epsilons for {d.name!r}") from None
    return dataclasses.asdict(settings)


def default_bit_depths() -> list[str]:
    from ursa_ray.evaluation.test_time_cost import QUANTISATION_SCHEMES

    return list(QUANTISATION_SCHEMES)


def parse_bit_depths(checking: Checking, value: Any) -> tuple[str, ...]:
    from ursa_ray.evaluation.test_time_cost import QUANTISATION_SCHEMES

    if not isinstance(value, list) or any(b not in QUANTISATION_SCHEMES for b in value):
        raise checking.fail("bit_depths", f"expected a list of {', '.join(QUANTISATION_SCHEMES)}, got {value!r}")
    return tuple(dict.fromkeys(value))


def parse_data_root(checking: Checking, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise checking.fail("data_root", "expected a directory path (string)")
    return value


def parse_precision(checking: Checking, value: Any) -> str | None:
    from ursa_ray.methods._training import PRECISIONS

    if value is not None and value not in PRECISIONS:
        raise checking.fail("precision", f"expected one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


def parse_search(checking: Checking, value: Any) -> SearchSettings | None:
    """The ``search`` block (:func:`ursa_ray.search_space.parse_search_settings`); required when a method
    entry declares a search space."""
    search = parse_search_settings(checking.path, value, fail)
    if search is None and any(m.search_space for m in checking["methods"]):
        raise checking.fail("search", "methods declare search spaces but the grid has no search block")
    return search


def parse_statistics(checking: Checking, value: Any) -> dict[str, str]:
    """The grid-wide ``statistics`` block, ``{interval: t | bootstrap}`` (default ``t``); ``ursa-ray report``
    reads it from the results' ``grid.yaml``.  A bad value is one line naming ``statistics.KEY``."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise checking.fail("statistics", f"expected {checking.help('statistics')}, got {value!r}")
    for key in value:
        if key != "interval":
            raise checking.fail(f"statistics.{key}", "unknown key; allowed: interval")
    interval = value.get("interval", "t")
    if interval not in STATISTICS_INTERVALS:
        raise checking.fail(
            "statistics.interval", f"expected one of {', '.join(STATISTICS_INTERVALS)}, got {interval!r}"
        )
    return {"interval": interval}
