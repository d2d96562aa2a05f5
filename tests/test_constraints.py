"""Constraints between a method's hyperparameters: declared by the method, checked by grid validation before
any trial (on the resolved configuration and at the corners of a search space), and by the method itself at
run time through the same declaration."""

from __future__ import annotations

import copy

import pytest
import yaml
from small_problems import regression_problem

from ursa_ray.cli import main
from ursa_ray.grid import GridError, parse_grid
from ursa_ray.methods import catalogue, get_method
from ursa_ray.methods.base import check_constraints, resolve_config

N_TRAIN = 64  # regression_problem()'s training examples

GRID = {
    "name": "constraints",
    "methods": ["sgd"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": ["digits"],
    "seeds": 1,
}


def grid_with(method: dict, **top) -> dict:
    """The small grid above with one method entry and top-level keys replaced."""
    return {**copy.deepcopy(GRID), "methods": [method], **top}


def rejection(raw: dict) -> str:
    with pytest.raises(GridError) as info:
        parse_grid(raw, "grids/bad.yaml")
    text = str(info.value)
    assert text.startswith("grids/bad.yaml: ") and "\n" not in text, text
    return text


def test_declared_constraints_name_declared_hyperparameters_and_hold_at_the_defaults():
    declaring = set()
    for name, method in catalogue().built_ins.items():  # not the plug-ins installed here
        declared = {h.name for h in method.hyperparameters}
        defaults = resolve_config(method, {})
        for constraint in method.constraints:
            assert set(constraint.names) <= declared, (name, constraint.rule)
            assert constraint.violation(defaults, None) is None, (name, constraint.rule)
            assert constraint.violation(defaults, 1437) is None, (name, constraint.rule)  # digits' training set
        if method.constraints:
            declaring.add(name)
    assert declaring == {"sgld", "sghmc", "csgld", "csghmc", "swag", "swa", "pca_ess", "laplace", "bdk", "gped"}


# (method, settings, start of the message for N_TRAIN examples, checked before any trial: independent of N)
VIOLATIONS = [
    ("sgld", {"epochs": 3, "burn_in_epochs": 3}, "burn_in_epochs must be below epochs (3); got burn_in_epochs=3", True),
    (
        "sghmc",
        {"epochs": 10, "burn_in_epochs": 12},
        "burn_in_epochs must be below epochs (10); got burn_in_epochs=12",
        True,
    ),
    (
        "sghmc",
        {"epochs": 3, "burn_in_epochs": 2, "n_samples": 5, "batch_size": 64},
        "n_samples must be at most the 1 post-burn-in steps",
        False,
    ),
    (
        "csgld",
        {"epochs_per_cycle": 2, "exploration": 0.9, "samples_per_cycle": 2, "batch_size": 64},
        "samples_per_cycle must be at most the 0 sampling steps of a cycle (2 steps",
        False,
    ),
    (
        "csghmc",
        {"epochs_per_cycle": 1, "exploration": 0.5, "samples_per_cycle": 3, "batch_size": 16},
        "samples_per_cycle must be at most the 2 sampling steps of a cycle (4 steps",
        False,
    ),
    (
        "swag",
        {"epochs": 1, "swa_epochs": 2, "swa_collect_every": 9, "batch_size": 16},
        "swa_collect_every must be 0 or at most the 8 steps of the collection phase",
        False,
    ),
    (
        "swa",
        {"epochs": 1, "swa_epochs": 1, "swa_collect_every": 5, "batch_size": 16},
        "swa_collect_every must be 0 or at most the 4 steps of the collection phase",
        False,
    ),
    ("gped", {"epochs": 4, "burn_in_epochs": 4}, "burn_in_epochs must be below epochs (4); got burn_in_epochs=4", True),
    (
        "bdk",
        {"epochs": 2, "burn_in_epochs": 1, "batch_size": 16, "distill_every": 5},
        "distill_every must be at most the 4 post-burn-in teacher steps",
        False,
    ),
    (
        "pca_ess",
        {"epochs": 1, "swa_epochs": 1, "rank": 1},
        "swa_epochs and swa_collect_every must collect at least two iterates",
        True,
    ),
    (
        "pca_ess",
        {"epochs": 1, "swa_epochs": 2, "swa_collect_every": 5, "batch_size": 16, "rank": 1},
        "swa_epochs and swa_collect_every must collect at least two iterates",
        False,
    ),
    (
        "pca_ess",
        {"epochs": 1, "swa_epochs": 3, "rank": 4},
        "rank must be at most the 3 collected iterates (swa_epochs=3, swa_collect_every=0); got rank=4",
        True,
    ),
]


@pytest.mark.parametrize("name, settings, message, before_any_trial", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_a_violated_constraint_is_reported_by_validation_and_at_run_time_alike(
    name, settings, message, before_any_trial
):
    method = get_method(name)
    config = resolve_config(method, settings)
    with pytest.raises(ValueError) as declared:
        check_constraints(method, config, N_TRAIN)
    assert str(declared.value).startswith(message), str(declared.value)
    # the method's own run-time check is the same declaration, and it fires before any training
    stats: dict[str, float] = {}
    with pytest.raises(ValueError) as at_run_time:
        next(iter(method.sample_posterior(regression_problem(), config, stats)))
    assert str(at_run_time.value) == str(declared.value)
    assert "grad_evals" not in stats
    if before_any_trial:
        text = rejection(grid_with({"name": name, "hyperparameters": settings}))
        assert f": {message}" in text and f"(method {name};" in text, text


# (method, settings at the edge of what each rule allows): validation accepts them, and the run starts
EDGES = [
    ("sgld", {"epochs": 3, "burn_in_epochs": 2, "n_samples": 2, "batch_size": 32}),  # 2 post-burn-in steps
    ("csgld", {"n_cycles": 1, "epochs_per_cycle": 1, "exploration": 0.5, "samples_per_cycle": 2, "batch_size": 16}),
    ("swag", {"epochs": 1, "swa_epochs": 1, "swa_collect_every": 4, "batch_size": 16, "n_samples": 1}),  # 4 steps
    ("pca_ess", {"epochs": 1, "swa_epochs": 2, "rank": 2, "n_samples": 1}),
    ("bdk", {"epochs": 2, "burn_in_epochs": 1, "batch_size": 16, "distill_every": 4}),  # 4 post-burn-in steps
]


@pytest.mark.parametrize("name, settings", EDGES, ids=[e[0] for e in EDGES])
def test_settings_at_the_edge_of_a_constraint_are_accepted(name, settings):
    method = get_method(name)
    config = resolve_config(method, settings)
    check_constraints(method, config, N_TRAIN)
    parse_grid(grid_with({"name": name, "hyperparameters": settings}), "grids/edge.yaml")
    stats: dict[str, float] = {}
    next(iter(method.sample_posterior(regression_problem(), config, stats)))
    assert stats["n_samples"] == 1


def test_a_budget_shorter_than_the_burn_in_is_rejected_naming_the_budget(tmp_path, capsys):
    """The issue's case: ``budget: {epochs: 20}`` with SGLD's default ``burn_in_epochs: 50``."""
    grid_file = tmp_path / "bad.yaml"
    grid_file.write_text(yaml.safe_dump(grid_with({"name": "sgld"}, budget={"epochs": 20})))
    assert main(["validate", str(grid_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {grid_file}: budget.epochs: burn_in_epochs must be below epochs (20); got burn_in_epochs=50 "
        "(method sgld; burn_in_epochs from the default, epochs from budget.epochs)"
    )
    # the same budget with a burn-in that fits validates
    parse_grid(grid_with({"name": "sgld", "hyperparameters": {"burn_in_epochs": 10}}, budget={"epochs": 20}), "ok.yaml")


def test_the_field_that_set_a_value_is_named_per_model():
    raw = grid_with(
        {
            "name": "sghmc",
            "hyperparameters": {"burn_in_epochs": 10},
            "model_hyperparameters": {"linear": {"epochs": 5}},
        },
        models=[{"name": "mlp", "options": {"widths": [16]}}, "linear"],
    )
    text = rejection(raw)
    assert text.startswith(
        "grids/bad.yaml: methods[0].hyperparameters.burn_in_epochs: burn_in_epochs must be below epochs (5); "
        "got burn_in_epochs=10 (method sghmc on model linear; burn_in_epochs from methods[0].hyperparameters."
        "burn_in_epochs, epochs from methods[0].model_hyperparameters.linear.epochs)"
    ), text


SEARCHED = [
    (
        {"name": "sgld", "search": {"burn_in_epochs": {"type": "int", "low": 5, "high": 60}}},
        {"epochs": 50},
        "methods[0].search.burn_in_epochs: burn_in_epochs must be below epochs (50); got burn_in_epochs=60 "
        "(method sgld; every configuration of the search space must satisfy burn_in_epochs < epochs; "
        "burn_in_epochs=60 at the high end of its search range, epochs from budget.epochs)",
    ),
    (
        {"name": "sghmc", "search": {"epochs": {"type": "int", "low": 40, "high": 200}}},
        {},
        "methods[0].search.epochs: burn_in_epochs must be below epochs (40); got burn_in_epochs=50 "
        "(method sghmc; every configuration of the search space must satisfy burn_in_epochs < epochs; "
        "burn_in_epochs from the default, epochs=40 at the low end of its search range)",
    ),
    (
        {
            "name": "pca_ess",
            "hyperparameters": {"swa_epochs": 20},
            "search": {"rank": {"type": "choice", "values": [2, 30]}},
        },
        {},
        "methods[0].search.rank: rank must be at most the 20 collected iterates (swa_epochs=20, swa_collect_every=0); "
        "got rank=30 (method pca_ess; every configuration of the search space must satisfy rank ≤ collected iterates",
    ),
]


@pytest.mark.parametrize("method, budget, message", SEARCHED, ids=["high end", "low end", "choice"])
def test_a_search_space_whose_bounds_violate_a_constraint_is_rejected(method, budget, message):
    text = rejection(grid_with(method, budget=budget, search={"n_trials": 2}))
    assert text.startswith(f"grids/bad.yaml: {message}"), text


def test_a_search_space_inside_a_constraint_is_accepted_even_where_the_fixed_value_is_not():
    """The searched value replaces the fixed one in every search trial and in the final phase, so SGLD's
    default burn-in of 50 does not matter when burn_in_epochs is searched below the budget's 20 epochs."""
    searched = {"name": "sgld", "search": {"burn_in_epochs": {"type": "int", "low": 1, "high": 19}}}
    grid = parse_grid(grid_with(searched, budget={"epochs": 20}, search={"n_trials": 2}), "ok.yaml")
    assert grid.methods[0].search_space["burn_in_epochs"] == {"type": "int", "low": 1, "high": 19}
