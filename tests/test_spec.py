"""The trial spec (issue 28, item 2): a frozen dataclass, built by the grid and nowhere else in ursa_ray, copied
with ``dataclasses.replace``, and carried through pickles (Tune's configs) unchanged."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import pickle
from pathlib import Path

import pytest

import ursa_ray
from ursa_ray.grid import parse_grid, trial_id
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.trainable import config_specs, pack

GRID = {
    "name": "spec",
    "methods": [{"name": "sgd", "label": "sgd_fast", "hyperparameters": {"lr": 0.05}}],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": [{"name": "digits", "ood": ["noise"]}, {"name": "e1", "complexity": [2]}],
    "seeds": [3],
    "resources": {"cpu": 2, "gpu": 0},
    "budget": {"epochs": 2, "n_samples": 1, "batch_size": 32},
    "bit_depths": ["float16"],
    "save_predictions": True,
    "precision": "float32",
    "vectorize_seeds": 4,
}


def _specs() -> dict[str, TrialSpec]:
    return {s.dataset: s for s in parse_grid(GRID, "spec.yaml").trial_specs()}


def test_the_grid_builds_specs_with_the_fields_its_file_sets():
    specs = _specs()
    digits, e1 = specs["digits"], specs["e1"]
    assert all(isinstance(s, TrialSpec) for s in specs.values())
    assert (digits.phase, digits.method, digits.label, digits.model) == ("final", "sgd", "sgd_fast", "mlp")
    assert digits.model_options == {"widths": [16]} and digits.seed == 3 and digits.cell == "sgd_fast/mlp/digits"
    assert digits.task == "classification" and not digits.decision_task
    assert digits.ood == ("noise",) and digits.complexity is None
    assert digits.config["lr"] == 0.05 and digits.config["epochs"] == 2 and digits.config["batch_size"] == 32
    assert digits.resources == {"cpu": 2, "gpu": 0, "custom": {}}
    assert digits.bit_depths == ("float16",) and digits.save_predictions and digits.precision == "float32"
    assert digits.vectorize_seeds == 4  # sgd and the MLP batch their seeds
    assert digits.trial_id == trial_id(digits) and digits.trial_id.startswith("final-sgd_fast-mlp-digits-s3-")
    assert e1.task == "regression" and e1.complexity == 2 == e1.dataset_options["complexity"]
    assert e1.cell == "sgd_fast/mlp/e1/c2"
    assert math.isnan(digits.complexity_or_nan) and e1.complexity_or_nan == 2.0
    assert digits.cell_slug == "sgd_fast-mlp-digits"
    # no search, no reference; sgd's digits trial crafts the transfer attack's examples (scored by no one here)
    assert (digits.validation_fraction, digits.reference, digits.reference_from) == (None, None, None)
    assert digits.transfer_source and not e1.transfer_source
    assert (digits.transfer_from, digits.transfer_examples, digits.references_dir) == (None, None, None)


def test_a_spec_is_frozen():
    spec = _specs()["digits"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        del spec.config


def test_replace_makes_a_changed_copy_and_leaves_the_spec_as_it_was():
    spec = _specs()["digits"]
    copy = dataclasses.replace(spec, config={**spec.config, "lr": 0.5}, transfer_examples="/tmp/x.pt")
    assert copy.config["lr"] == 0.5 and copy.transfer_examples == "/tmp/x.pt" and copy != spec
    assert spec.config["lr"] == 0.05 and spec.transfer_examples is None
    assert dataclasses.replace(copy, config=spec.config, transfer_examples=None) == spec


def test_a_spec_pickles_round_trip_equal_as_the_spec_table_carries_it():
    for spec in _specs().values():
        assert pickle.loads(pickle.dumps(spec)) == spec
    specs = list(_specs().values())
    assert config_specs({"group": 0}, "", [pack(specs)]) == specs
    added = config_specs(
        {"group": 0, "additions": [{"references_dir": "/r"}] + [{}] * (len(specs) - 1)}, "", [pack(specs)]
    )
    assert added[0].references_dir == "/r" and added[1:] == specs[1:]


def test_only_the_grid_makes_a_spec():
    """``TrialSpec(...)`` is called in ursa_ray/grid/expand.py alone (Grid.spec_for); everything else reads a spec or replaces fields."""
    package = Path(ursa_ray.__file__).parent
    makers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "TrialSpec"
    )
    assert makers == ["grid/expand.py"]


def test_every_field_is_documented():
    tree = ast.parse(inspect.getsource(TrialSpec))
    body = tree.body[0].body
    documented = {
        node.target.id
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    }
    assert documented == {f.name for f in dataclasses.fields(TrialSpec)}
