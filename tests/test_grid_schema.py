"""The grid's schema (ursa_ray/grid/schema.py, issue 46): one entry per top-level key declares its parser, default
and help; a key added in one entry is parsed, defaulted, named in ``validate``'s messages and documented, and
README's grid reference is the one the schema generates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ursa_ray.grid import KEYS, Grid, GridError, Key, parse_grid
from ursa_ray.grid.docs import BEGIN, END, grid_reference, with_reference

README = Path(__file__).resolve().parents[1] / "README.md"
GOOD = {
    "name": "tiny",
    "methods": ["sgd"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": ["digits"],
    "seeds": 2,
}


def _loggers(checking, value):
    """A made-up key: a list of logger names among mlflow and tensorboard."""
    allowed = ("mlflow", "tensorboard")
    if not isinstance(value, list) or any(v not in allowed for v in value):
        raise checking.fail("made_up_loggers", f"expected a list of {', '.join(allowed)}, got {value!r}")
    return tuple(value)


def _few_seeds_for_tensorboard(grid):
    """A made-up check against another key: tensorboard takes at most 3 seeds."""
    if "tensorboard" in grid.made_up_loggers and len(grid.seeds) > 3:
        raise GridError(f"{grid.path}: made_up_loggers: tensorboard takes at most 3 seeds, not {len(grid.seeds)}")


MADE_UP = Key(
    "made_up_loggers",
    help="experiment trackers every trial also logs to: a list of mlflow, tensorboard (default none)",
    parse=_loggers,
    default_factory=list,
    checks=(_few_seeds_for_tensorboard,),
    example="made_up_loggers: [mlflow]       # also log every trial to these trackers",
)
WITH_MADE_UP = (*KEYS, MADE_UP)


def test_a_key_added_in_one_entry_is_parsed_defaulted_checked_and_in_the_messages():
    grid = parse_grid({**GOOD, "made_up_loggers": ["mlflow", "tensorboard"]}, "g.yaml", WITH_MADE_UP)
    assert grid.made_up_loggers == ("mlflow", "tensorboard") == grid.settings["made_up_loggers"]
    assert parse_grid(GOOD, "g.yaml", WITH_MADE_UP).made_up_loggers == ()  # its default, through its parser
    with pytest.raises(GridError, match="^g.yaml: made_up_loggers: tensorboard takes at most 3 seeds, not 4$"):
        parse_grid({**GOOD, "seeds": 4, "made_up_loggers": ["tensorboard"]}, "g.yaml", WITH_MADE_UP)
    with pytest.raises(GridError, match=r"^g.yaml: made_up_loggers: expected a list of mlflow, tensorboard, got 'x'$"):
        parse_grid({**GOOD, "made_up_loggers": "x"}, "g.yaml", WITH_MADE_UP)
    with pytest.raises(GridError, match=r"colour: unknown key; allowed: name, .*, statistics, made_up_loggers$"):
        parse_grid({**GOOD, "colour": 1}, "g.yaml", WITH_MADE_UP)
    with pytest.raises(GridError, match="made_up_loggers: unknown key"):  # the shipped schema has no such key
        parse_grid({**GOOD, "made_up_loggers": ["mlflow"]}, "g.yaml")
    assert not hasattr(parse_grid(GOOD, "g.yaml"), "made_up_loggers")


def test_a_key_added_in_one_entry_is_documented():
    assert MADE_UP.example in grid_reference(WITH_MADE_UP)
    without_example = dataclasses.replace(MADE_UP, example="")
    reference = grid_reference((*KEYS, without_example))
    also = " ".join(reference.split("```")[-1].split())
    assert f"`made_up_loggers`: {MADE_UP.help}" in also


def test_readme_grid_reference_is_the_schemas():
    """README's grid reference is generated from the schema (python -m ursa_ray.grid.docs rewrites it)."""
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    assert with_reference(text) == text, (
        "README's grid reference differs from the schema's: python -m ursa_ray.grid.docs"
    )


def test_every_key_is_in_the_reference_and_every_grid_field_is_a_key():
    reference = " ".join(grid_reference().split())
    for key in KEYS:
        assert f"{key.name}:" in reference or f"`{key.name}`" in reference, key.name
    fields = {f.name for f in dataclasses.fields(Grid)} - {"path", "source", "settings", "_final_specs"}
    assert fields == {key.attribute or key.name for key in KEYS}


def test_the_schema_checks_a_key_once_after_the_keys_it_reads():
    """A key's parser reads the keys it depends on (``checking[...]``), which are checked first and once."""
    seen = []

    def counting(key: Key) -> Key:
        def parse(checking, value):
            checked = key.parse(checking, value)
            seen.append(key.name)  # in the order the keys finish
            return checked

        return dataclasses.replace(key, parse=parse)

    parse_grid(GOOD, "g.yaml", tuple(counting(key) for key in KEYS))
    assert sorted(seen) == sorted(key.name for key in KEYS)  # each once
    assert seen.index("models") < seen.index("methods") and seen.index("datasets") < seen.index("methods")


def test_the_drivers_walk_of_a_grid():
    """ursa_ray/tune walks a checked grid through three calls: its specs, its searched cells, and the resources
    every trial asks for (a reference block's own request included)."""
    raw = {
        **GOOD,
        "methods": [
            {"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}},
            {"name": "mc_dropout", "resources": {"cpu": 2}},
        ],
        "search": {"n_trials": 2},
        "reference": {"chains": 2, "resources": {"cpu": 3}},
    }
    grid = parse_grid(raw, "g.yaml")
    assert list(grid.search_cells()) == ["sgd/mlp/digits"]
    assert grid.search_cells()["sgd/mlp/digits"]["lr"]["type"] == "loguniform"
    spec = grid.search_spec("sgd/mlp/digits")
    assert (spec.phase, spec.cell, spec.seed) == ("search", "sgd/mlp/digits", grid.seeds[0])
    assert [(label, model, r["cpu"]) for label, model, r in grid.trial_requests()] == [
        ("sgd", "mlp", 1),
        ("mc_dropout", "mlp", 2),
        ("reference", "mlp", 3),
    ]
