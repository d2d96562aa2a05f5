"""The grid's schema: one :class:`Key` per top-level key of a grid file, in :data:`KEYS`, declaring its parser,
its default, its one-line help (the messages of ``ursa-ray validate`` name it, and README's grid reference is
generated from it, :mod:`ursa_ray.grid.docs`), its check against the other keys, and README's example of it.

:func:`parse_grid` checks a grid key by key (a key's parser reads the keys it depends on, checked first), builds
the :class:`~ursa_ray.grid.expand.Grid`, then runs the keys' checks in the schema's order; the first problem is a
one-line :class:`~ursa_ray.grid.fields.GridError` naming the file, the field and what is allowed.  Adding a key
is adding its entry here (and a test); the Grid gives it as ``grid.KEY``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from ursa_ray.grid import blocks, crosschecks, entries
from ursa_ray.grid.blocks import DEFAULT_MAX_TRIALS, DEFAULT_VECTORIZE_SEEDS, MAX_SEED
from ursa_ray.grid.expand import Grid
from ursa_ray.grid.fields import Checking, GridError, boolean, fail, integer
from ursa_ray.grid.references import parse_references
from ursa_ray.search_space import SEARCH_KEYS


@dataclass(frozen=True)
class Key:
    """One top-level key of a grid file."""

    name: str
    help: str
    """One line: what the key holds and what it allows, with its default (``required: HELP``, ``expected HELP``
    in messages; README's "Also:" line for a key without an example)."""
    parse: Callable[[Checking, Any], Any]
    """(the grid being checked, the key's value or its default) -> the checked value; a GridError otherwise."""
    default: Any = None
    """The value parsed when the grid leaves the key out (ignored for a required key)."""
    default_factory: Callable[[], Any] | None = None
    """Makes the default instead, where it comes from a module that imports torch (imported when needed)."""
    required: bool = False
    checks: tuple[Callable[[Grid], None], ...] = ()
    """Checks against the other keys, run in order on the built grid (:mod:`ursa_ray.grid.crosschecks`)."""
    example: str = ""
    """README's example of the key: YAML lines with comments in the generated grid block; empty: the key is
    listed with its help on the "Also:" line under the block."""
    attribute: str = ""
    """The :class:`Grid` field holding the checked value, where it is not the key's name."""

    def default_value(self) -> Any:
        return self.default_factory() if self.default_factory is not None else self.default


def _scalar(name: str, check: Callable[[str, str, Any], Any], optional: bool = False) -> Callable[[Checking, Any], Any]:
    """A parser of a scalar key ``name``: ``check(path, name, value)`` (None passes when ``optional``)."""

    def parse(checking: Checking, value: Any) -> Any:
        return value if optional and value is None else check(checking.path, name, value)

    return parse


def _at_least(minimum: int) -> Callable[[str, str, Any], int]:
    return lambda path, where, value: integer(path, where, value, minimum)


KEYS: tuple[Key, ...] = (
    Key(
        "name",
        help="a name for the grid (string)",
        parse=blocks.parse_name,
        required=True,
        example="name: quickstart                 # required",
    ),
    Key("description", help="free text", parse=blocks.parse_description, default=""),
    Key(
        "methods",
        help="a non-empty list of methods",
        parse=entries.parse_methods,
        required=True,
        checks=(crosschecks.check_pairings,),
        example=(
            "methods:                         # required: names, or mappings\n"
            "  - sgd\n"
            "  - name: mc_dropout\n"
            "    label: mcd_p02               # display name (one method may appear with several settings)\n"
            "    models: [mlp]                # optional: pair only with these models / datasets\n"
            "    hyperparameters: {p: 0.2}    # fixed settings (`ursa-ray methods`)\n"
            "    model_hyperparameters: {mlp: {lr: 0.1}}    # optional per-model settings\n"
            "    search: {lr: {type: loguniform, low: 1.0e-3, high: 0.3}}   # optional search space"
        ),
    ),
    Key(
        "models",
        help="a non-empty list of models",
        parse=entries.parse_models,
        required=True,
        example="models: [{name: mlp, options: {widths: [200, 200]}}]           # required",
    ),
    Key(
        "datasets",
        help="a non-empty list of datasets",
        parse=entries.parse_datasets,
        required=True,
        example=(
            "datasets:                                                       # required\n"
            "  - {name: digits, ood: [digits_inverted, digits_rotated, noise]}\n"
            "  - {name: e1, complexity: [1, 2, 3]}                           # regression sets sweep a complexity\n"
            "  - name: my_data                                               # a dataset from files\n"
            "    file: {format: npz, path: data/my.npz, task: classification}"
        ),
    ),
    Key(
        "seeds",
        help=f"an integer n (seeds 0..n-1) or a non-empty list of distinct integers in [0, {MAX_SEED}]",
        parse=blocks.parse_seeds,
        required=True,
        example="seeds: 3                         # n (seeds 0..n-1) or a list of distinct seeds in [0, 2^31 - 1]",
    ),
    Key(
        "max_trials",
        help=f"the most final trials the grid may have (a positive integer, default {DEFAULT_MAX_TRIALS:,})",
        parse=_scalar("max_trials", _at_least(1)),
        default=DEFAULT_MAX_TRIALS,
        checks=(crosschecks.check_trial_count,),
    ),
    Key(
        "resources",
        help="per-trial resources {cpu, gpu, custom} (a method or model entry may give its own)",
        parse=blocks.parse_resources,
        example=(
            "resources: {cpu: 1, gpu: 0.25}   # per trial; fractions allowed; a method or model entry may set its own"
        ),
    ),
    Key(
        "budget",
        help=f"defaults for {list(blocks.BUDGET_KEYS)}",
        parse=blocks.parse_budget,
        example="budget: {epochs: 20, n_samples: 20, batch_size: 64}    # defaults for every method that has them",
    ),
    Key(
        "save_predictions",
        help="true or false",
        parse=_scalar("save_predictions", boolean),
        default=False,
        example="save_predictions: true           # keep the posterior predictive of every trial and evaluation set",
    ),
    Key(
        "adversarial",
        help="adversarial evaluation {attacks, epsilons, n_examples, attack_samples, pgd_steps, transfer}",
        parse=blocks.parse_adversarial,
        example=(
            "adversarial: {attacks: [fgsm, pgd], n_examples: 1000, attack_samples: 20, pgd_steps: 10, transfer: true}"
        ),
    ),
    Key(
        "corruptions",
        help="common-corruption evaluation sets {types, severities, n_examples}; types: a list or all",
        parse=blocks.parse_corruptions,
        default_factory=dict,
        example="corruptions: {types: all, severities: [1, 2, 3, 4, 5], n_examples: 1000}",
    ),
    Key(
        "bit_depths",
        help=(
            "weight storage schemes the posterior predictive is also evaluated at: a list of float16, "
            "bfloat16, int8 (default all three; [] for none)"
        ),
        parse=blocks.parse_bit_depths,
        default_factory=blocks.default_bit_depths,
        example=(
            "bit_depths: [float16, bfloat16, int8]                  # also evaluate each sample stored at these depths"
        ),
    ),
    Key("data_root", help="a directory (URSA_DATA overrides it)", parse=blocks.parse_data_root),
    Key(
        "download",
        help="true or false: let torchvision download missing data (needs internet)",
        parse=_scalar("download", boolean),
        default=False,
    ),
    Key(
        "max_concurrent_trials",
        help="a positive integer",
        parse=_scalar("max_concurrent_trials", _at_least(1), optional=True),
    ),
    Key(
        "precision",
        help=(
            "training precision: bf16-mixed or float32 (default: bf16-mixed for classification on a GPU, "
            "float32 otherwise)"
        ),
        parse=blocks.parse_precision,
        example=(
            "precision: bf16-mixed            # training: bfloat16 body, float32 weights (default for classification on a GPU)"
        ),
    ),
    Key(
        "max_failures",
        help="retries of a trial whose worker died (non-negative integer)",
        parse=_scalar("max_failures", _at_least(0)),
        default=0,
    ),
    Key(
        "vectorize_seeds",
        help=(
            "the most seeds of one cell trained as one batched computation in one trial "
            f"(a positive integer, default {DEFAULT_VECTORIZE_SEEDS}; 1 runs every seed alone)"
        ),
        parse=_scalar("vectorize_seeds", _at_least(1)),
        default=DEFAULT_VECTORIZE_SEEDS,
        example=(
            "vectorize_seeds: 8               # seeds of a small network trained as one batched computation (default 8)"
        ),
    ),
    Key(
        "search",
        help=f"the hyperparameter search phase {sorted(SEARCH_KEYS)}",
        parse=blocks.parse_search,
        checks=(crosschecks.check_selection_metric,),
        example="search: {algorithm: random, n_trials: 8, metric: val_nll}   # the search phase, see docs/search.md",
    ),
    Key(
        "reference",
        help=(
            "a reference posterior for the classification cells: a block {method: hmc, chains, n_samples, "
            "burn_in, prior_std, temperature, ..., dir} or {file: PATH}, or a list of blocks each selecting cells with "
            "models: and datasets: (docs/fidelity.md)"
        ),
        parse=parse_references,
        checks=(crosschecks.check_references_serve,),
        attribute="references",
        example=(
            "reference: {chains: 4, n_samples: 400, burn_in: 200, prior_std: 0.5}   # score against multi-chain HMC, "
            "or {file: PATH}; per cell: a list (docs/fidelity.md)"
        ),
    ),
    Key(
        "statistics",
        help=(
            "how the report's per-cell intervals over seeds are computed {interval: t or bootstrap} "
            "(default t; docs/statistics.md)"
        ),
        parse=blocks.parse_statistics,
        example=(
            "statistics: {interval: t}       # the report's per-cell intervals: t (default) or bootstrap (docs/statistics.md)"
        ),
    ),
)
"""Every top-level key of a grid file, in the order ``validate``'s messages list them and checks run."""

_GRID_FIELDS = {f.name for f in dataclasses.fields(Grid)}


def parse_grid(raw: Any, path: str = "<grid>", keys: tuple[Key, ...] = KEYS) -> Grid:
    """Validate a grid (the result of yaml.safe_load) against the schema ``keys`` and return it; GridError on the
    first problem: the top level's shape, then each key (in the schema's order, a key's dependencies first),
    then each key's check against the others."""
    by_name = {key.name: key for key in keys}
    if not isinstance(raw, dict):
        raise fail(path, "top level", f"expected a mapping with keys {sorted(by_name)}")
    for name in raw:
        if name not in by_name:
            raise fail(path, str(name), f"unknown key; allowed: {', '.join(by_name)}")
    for key in keys:
        if key.required and key.name not in raw:
            raise fail(path, key.name, f"required: {key.help}")
    checking = Checking(path, raw, by_name)
    values = {key.name: checking[key.name] for key in keys}
    fields = {key.attribute or key.name: values[key.name] for key in keys}
    grid = Grid(
        path=path,
        source=yaml.safe_dump(raw, sort_keys=False),
        settings=values,
        **{name: value for name, value in fields.items() if name in _GRID_FIELDS},
    )
    for key in keys:
        for check in key.checks:
            check(grid)
    return grid


def parse_statistics(path: str, raw: Any) -> dict[str, str]:
    """The grid-wide ``statistics`` block, ``{interval: t | bootstrap}`` (default ``t``), checked alone: ``ursa-ray
    report`` reads it from the results' ``grid.yaml``.  A bad value is one line naming ``statistics.KEY``."""
    by_name = {key.name: key for key in KEYS}
    return by_name["statistics"].parse(Checking(path, {}, by_name), raw)


__all__ = ["KEYS", "GridError", "Key", "parse_grid", "parse_statistics"]
