"""Plug-ins: the example package through its entry points (listed, validated and run on Ray beside a
built-in), broken plug-ins (fake entry points and import paths into tests/plugin_fixtures.py) rejected in one
line without breaking anything else, and the protocol checks the built-ins pass too."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml

from ursa_ray import data, methods, models, plugins
from ursa_ray.cli import main
from ursa_ray.grid import parse_grid
from ursa_ray.methods import sgd
from ursa_ray.methods.base import Constraint, Hyperparameter, Method
from ursa_ray.methods.sgd import SGD
from ursa_ray.models.base import ModelSpec
from ursa_ray.registry import RegistryError
from ursa_ray.trial import run_trial

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "plugin"
EXAMPLE_ORIGIN = "from distribution ursa-ray-example-plugin 0.1.0"
CATALOGUES = {"method": methods.catalogue, "model": models.catalogue, "dataset": data.catalogue}


def refresh_registries() -> None:
    """Forget the registries built so far: the next lookup discovers the entry points again."""
    for catalogue in CATALOGUES.values():
        catalogue.cache_clear()


@pytest.fixture(scope="session")
def example_plugin() -> Path:
    """examples/plugin installed (editable, left installed), visible to this process and to new ones."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-e",
        str(EXAMPLE),
    ]
    installed = subprocess.run(command, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    importlib.invalidate_caches()
    if importlib.util.find_spec("ursa_ray_example_plugin") is None:  # this interpreter read the .pth files before
        site.addsitedir(sysconfig.get_path("purelib"))
    refresh_registries()
    return EXAMPLE


def write_grid(tmp_path: Path, **changes: Any) -> Path:
    raw = {
        "name": "plugins",
        "methods": ["sgd"],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": ["digits"],
        "seeds": 1,
        **changes,
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def validate(grid: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """``ursa-ray validate GRID``: (exit status, stderr)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no resource check, no Ray
    capsys.readouterr()
    code = main(["validate", str(grid)])
    return code, capsys.readouterr().err


def listing(command: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main([command]) == 0
    return capsys.readouterr().out.splitlines()


# ----------------------------------------------------------------------------------------------------
# The protocol


def test_every_built_in_follows_its_protocol():
    for kind, catalogue in CATALOGUES.items():
        built_ins = catalogue().built_ins
        assert built_ins and set(built_ins) <= set(catalogue().usable), kind
        for item in built_ins.values():
            plugins.CHECKS[kind](item)


class _Method(SGD):
    name = "m"


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"name": ""}, "name must be a non-empty string without ':' or '/', got ''"),
        ({"name": "a:b"}, "name must be a non-empty string without ':' or '/', got 'a:b'"),
        ({"description": None}, "description must be a string, got None"),
        (
            {"hyperparameters": [Hyperparameter("lr", float, 0.1, "")]},
            "hyperparameters must be a tuple of Hyperparameter",
        ),
        (
            {"hyperparameters": (Hyperparameter("lr", float, None, ""),)},
            "hyperparameter 'lr' has no valid default: None",
        ),
        (
            {"hyperparameters": (Hyperparameter("w", list, [0], ""),)},
            "hyperparameter 'w' has no valid default: expected a list of positive integers, got [0]",
        ),
        (
            {"hyperparameters": (Hyperparameter("d", dict, {}, ""),)},
            "hyperparameter 'd' has kind <class 'dict'>; allowed: bool, int, float, str, list",
        ),
        ({"hyperparameters": (Hyperparameter("lr", float, 0.1, ""),) * 2}, "hyperparameters must have distinct names"),
        ({"constraints": None}, "constraints must be a tuple of Constraint (() for none), got None"),
        (
            {"constraints": (Constraint(("beta",), "beta < 1", lambda config, n: None),)},
            "constraint 'beta < 1' names undeclared hyperparameters ['beta']",
        ),
        ({"sample_posterior": 3}, "sample_posterior must be callable, got 3"),
        ({"warm_up": "soon"}, "warm_up must be callable, got 'soon'"),
    ],
)
def test_a_method_breaking_the_protocol_is_named_with_the_breach(attributes, message):
    broken = type("Broken", (_Method,), attributes)()
    with pytest.raises(ValueError) as info:
        plugins.check_method(broken)
    assert str(info.value).startswith(message), str(info.value)


def test_a_method_of_the_earlier_protocol_without_constraints_is_accepted_and_runs(tmp_path, monkeypatch):
    """A plug-in written before the base class, declaring no ``constraints``, validates, gets the base class's
    defaults and runs a trial.  Catches the old refusal ("missing constraints")."""
    monkeypatch.chdir(REPO)
    name = "tests.plugin_fixtures:EarlierProtocolSGD"
    method = methods.get_method(name)
    assert isinstance(method, Method) and method.constraints == () and not method.batchable
    grid = {
        "name": "earlier",
        "methods": [name],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": ["digits"],
        "seeds": [0],
        "budget": {"epochs": 1},
        "save_predictions": False,
    }
    (spec,) = parse_grid(grid, str(tmp_path / "g.yaml")).trial_specs()
    outcome = run_trial(spec)
    accuracy = [m["value"] for m in outcome.metrics if m["eval_set"] == "test" and m["metric"] == "accuracy"]
    assert outcome.record["n_samples"] == 1 and len(accuracy) == 1 and 0.0 <= accuracy[0] <= 1.0


@pytest.mark.parametrize(
    "check, item, message",
    [
        (plugins.check_model, object(), "expected a ursa_ray.models.base.ModelSpec, got object"),
        (
            plugins.check_model,
            ModelSpec("m", "", build=len, tasks=("vision",)),
            "tasks must be a non-empty tuple of classification, regression, got ('vision',)",
        ),
        (plugins.check_model, ModelSpec("m", "", build=None), "build must be callable, got None"),
        (
            plugins.check_dataset,
            ModelSpec("m", "", build=len),
            "expected a ursa_ray.data.base.DatasetSpec, got ModelSpec",
        ),
        (
            plugins.check_dataset,
            replace(data.get_dataset("digits"), task="ranking"),
            "task must be one of classification, regression, got 'ranking'",
        ),
        (
            plugins.check_dataset,
            replace(data.get_dataset("digits"), sweep="size"),
            "sweep must be None or the name of one of the options, got 'size'",
        ),
        (
            plugins.check_dataset,
            replace(data.get_dataset("digits"), ood_sets=["noise"]),
            "ood_sets must be a tuple of names, got ['noise']",
        ),
    ],
)
def test_a_model_or_dataset_breaking_the_protocol_is_named_with_the_breach(check, item, message):
    with pytest.raises(ValueError) as info:
        check(item)
    assert str(info.value) == message


# ----------------------------------------------------------------------------------------------------
# The example plug-in, through its entry points


def test_the_example_is_listed_with_its_origin(example_plugin, capsys):
    lines = listing("methods", capsys)
    at = lines.index("temperature_sgd: " + methods.get_method("temperature_sgd").description)
    assert lines[at + 1] == (
        "    origin: entry point ursa_ray.methods = ursa_ray_example_plugin.method:TemperatureSGD " + EXAMPLE_ORIGIN
    )
    assert lines[lines.index("sgd: " + methods.get_method("sgd").description) + 1] == "    origin: built-in"
    lines = listing("datasets", capsys)
    at = next(i for i, line in enumerate(lines) if line.startswith("two_moons (classification): "))
    assert lines[at].endswith("; OOD sets: far_ring")
    assert (
        lines[at + 1]
        == "    origin: entry point ursa_ray.datasets = ursa_ray_example_plugin.data:TWO_MOONS " + EXAMPLE_ORIGIN
    )
    assert not any("BROKEN" in line for line in lines + listing("models", capsys))


@pytest.mark.slow
def test_the_console_script_lists_the_example(example_plugin):
    script = Path(sys.executable).parent / "ursa-ray"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's ursa_ray, whatever the installed one points at
    listed = subprocess.run([str(script), "methods"], capture_output=True, text=True, env=env, cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    assert f"ursa_ray_example_plugin.method:TemperatureSGD {EXAMPLE_ORIGIN}\n" in listed.stdout


def test_the_examples_grid_validates(example_plugin, capsys, monkeypatch):
    code, err = validate(EXAMPLE / "grid.yaml", capsys, monkeypatch)
    assert (code, err) == (0, "")


PLUGIN_RUN = {
    "name": "plugins_end_to_end",
    "methods": [
        "sgd",
        "temperature_sgd",
        {
            "name": "ursa_ray_example_plugin.method:TemperatureSGD",
            "label": "temperature_by_path",
            "hyperparameters": {"holdout_fraction": 0.2},
        },
    ],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": [{"name": "two_moons", "ood": ["far_ring"]}],
    "seeds": [0],
    "resources": {"cpu": 1},
    "budget": {"epochs": 3, "batch_size": 128},
    "bit_depths": [],
    "corruptions": {"types": []},
    "adversarial": {"epsilons": [0.05], "n_examples": 50, "attack_samples": 1, "pgd_steps": 2},
}


@pytest.mark.slow
def test_a_grid_runs_the_plugins_beside_a_built_in(example_plugin, ray_session, tmp_path, capsys):
    grid = write_grid(tmp_path, **PLUGIN_RUN)
    out = tmp_path / "results"
    assert main(["run", str(grid), "--out", str(out)]) == 0, capsys.readouterr().err
    trials = pd.read_parquet(out / "trials.parquet").set_index("method")
    assert sorted(trials.index) == ["sgd", "temperature_by_path", "temperature_sgd"]
    assert (trials["status"] == "ok").all() and (trials["dataset"] == "two_moons").all()
    assert (trials["n_samples"] == 1).all()
    assert trials.loc["temperature_by_path", "method_name"] == "ursa_ray_example_plugin.method:TemperatureSGD"
    assert trials.loc["temperature_sgd", "method_name"] == "temperature_sgd"
    for label, held_out in (("temperature_sgd", 0.1), ("temperature_by_path", 0.2)):
        assert json.loads(trials.loc[label, "config"])["holdout_fraction"] == held_out
        assert json.loads(trials.loc[label, "method_stats"])["temperature"] > 0
    metrics = pd.read_parquet(out / "metrics.parquet")
    far_ring = metrics[metrics["eval_set"] == "far_ring"]
    assert set(far_ring["method"]) == set(trials.index)
    assert {"ood_auroc_entropy", "ood_auroc_mi"} <= set(far_ring["metric"])  # the plug-in's OOD set is scored
    storage = metrics.query("eval_set == 'cost' and metric == 'storage_other_values'").set_index("method")["value"]
    assert storage.to_dict() == {"sgd": 0.0, "temperature_sgd": 1.0, "temperature_by_path": 1.0}


# ----------------------------------------------------------------------------------------------------
# Broken plug-ins: fake entry points


@dataclass
class FakeEntryPoint:
    """What :func:`ursa_ray.plugins.discover` hands on: a name, a value, a group, a distribution and
    ``load()``, which returns ``item`` or raises ``error``."""

    name: str
    item: Any = None
    error: Exception | None = None
    group: str = "ursa_ray.methods"
    value: str = "pkg.mod:Obj"
    dist: Any = field(default_factory=lambda: SimpleNamespace(name="pkg", version="1.0"))

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.item


@pytest.fixture
def entry_points(monkeypatch):
    """``install(*fakes)``: the registries see exactly these entry points (by group) until the test ends."""

    def install(*fakes: FakeEntryPoint) -> None:
        monkeypatch.setattr(plugins, "discover", lambda group: tuple(f for f in fakes if f.group == group))
        refresh_registries()

    yield install
    monkeypatch.undo()
    refresh_registries()


ORIGIN = "entry point ursa_ray.methods = pkg.mod:Obj from distribution pkg 1.0"


class _NoSampler:
    name, description, hyperparameters, constraints = "x", "no sample_posterior", (), ()


class _NoDefault(SGD):
    name = "x"
    hyperparameters = (Hyperparameter("lr", float, None, "learning rate", low=0.0),)


class _RaisingAttribute(SGD):
    name = "x"

    @property
    def hyperparameters(self):
        raise RuntimeError("not configured")


@pytest.mark.parametrize(
    "fake, why",
    [
        (FakeEntryPoint("x", item=_RaisingAttribute), "breaks the protocol: RuntimeError: not configured"),
        (
            FakeEntryPoint("x", error=ModuleNotFoundError("No module named 'pkg'")),
            "cannot load: ModuleNotFoundError: No module named 'pkg'",
        ),
        (FakeEntryPoint("x", error=RuntimeError("no GPU\nfound")), "cannot load: RuntimeError: no GPU found"),
        (FakeEntryPoint("x", item=_NoSampler), "missing sample_posterior"),
        (FakeEntryPoint("x", item=_NoDefault), "hyperparameter 'lr' has no valid default: None"),
        (FakeEntryPoint("x", item=_Method), "the entry point is named 'x' but the method's name is 'm'"),
    ],
)
def test_a_broken_entry_point_is_listed_and_rejected_in_one_line(
    fake, why, entry_points, tmp_path, capsys, monkeypatch
):
    entry_points(fake)
    assert f"x: BROKEN ({ORIGIN}): {why}" in listing("methods", capsys)
    code, err = validate(write_grid(tmp_path, methods=["sgd", "x"]), capsys, monkeypatch)
    assert code == 2
    assert err == f"error: {tmp_path / 'grid.yaml'}: methods[1].name: plug-in method 'x' ({ORIGIN}) is broken: {why}\n"
    assert validate(write_grid(tmp_path), capsys, monkeypatch) == (0, "")  # a grid without it is unaffected


def test_a_plugin_cannot_take_a_built_ins_name(entry_points, tmp_path, capsys, monkeypatch):
    entry_points(FakeEntryPoint("sgd", item=SGD))
    lines = listing("methods", capsys)
    assert f"sgd: BROKEN ({ORIGIN}): the name 'sgd' is taken by the built-in method" in lines
    assert lines[lines.index("sgd: " + SGD.description) + 1] == "    origin: built-in"
    assert methods.get_method("sgd") is sgd.METHODS[0]
    assert validate(write_grid(tmp_path), capsys, monkeypatch) == (0, "")


def test_two_plugins_of_one_name_are_both_broken(entry_points, tmp_path, capsys, monkeypatch):
    other = SimpleNamespace(name="other", version="2.0")
    entry_points(FakeEntryPoint("m", item=_Method), FakeEntryPoint("m", item=_Method, value="other.mod:M", dist=other))
    other_origin = "entry point ursa_ray.methods = other.mod:M from distribution other 2.0"
    code, err = validate(write_grid(tmp_path, methods=["m"]), capsys, monkeypatch)
    assert code == 2
    assert err.endswith(
        f"methods[0].name: plug-in method 'm' ({other_origin}) is broken: {ORIGIN} also registers a method 'm'\n"
    )
    assert f"m: BROKEN ({ORIGIN}): {other_origin} also registers a method 'm'" in listing("methods", capsys)


def test_broken_model_and_dataset_entry_points(entry_points, tmp_path, capsys, monkeypatch):
    entry_points(
        FakeEntryPoint("tiny", item=ModelSpec("tiny", "", build=len, tasks=()), group="ursa_ray.models"),
        FakeEntryPoint("moons", error=ImportError("sklearn too old"), group="ursa_ray.datasets"),
    )
    code, err = validate(write_grid(tmp_path, models=["tiny"]), capsys, monkeypatch)
    assert (code, err.count("\n")) == (2, 1)
    assert "models[0].name: plug-in model 'tiny' (entry point ursa_ray.models = pkg.mod:Obj" in err
    assert err.endswith("is broken: tasks must be a non-empty tuple of classification, regression, got ()\n")
    code, err = validate(write_grid(tmp_path, datasets=["moons"]), capsys, monkeypatch)
    assert (code, err.count("\n")) == (2, 1)
    assert err.endswith(
        "datasets[0].name: plug-in dataset 'moons' (entry point ursa_ray.datasets = pkg.mod:Obj "
        "from distribution pkg 1.0) is broken: cannot load: ImportError: sklearn too old\n"
    )
    assert "moons: BROKEN (entry point ursa_ray.datasets" in "\n".join(listing("datasets", capsys))


# ----------------------------------------------------------------------------------------------------
# Import paths


@pytest.mark.parametrize(
    "field, name, why",
    [
        ("methods", "tests.plugin_fixtures:MissingSamplePosterior", "missing sample_posterior"),
        ("methods", "tests.plugin_fixtures:NoValidDefault", "hyperparameter 'lr' has no valid default: None"),
        (
            "methods",
            "tests.plugin_fixtures:DefaultOutOfRange",
            "hyperparameter 'lr' has no valid default: expected a value >= 0.0, got -1.0",
        ),
        (
            "methods",
            "tests.no_such_module:Method",
            "cannot load: ModuleNotFoundError: No module named 'tests.no_such_module'",
        ),
        (
            "methods",
            "tests.plugin_fixtures:Absent",
            "cannot load: AttributeError: module 'tests.plugin_fixtures' has no attribute 'Absent'",
        ),
        ("methods", "tests.plugin_fixtures:", "not an import path; expected package.module:Attribute"),
        ("models", "tests.plugin_fixtures:NOT_A_MODEL", "expected a ursa_ray.models.base.ModelSpec, got object"),
        ("datasets", "tests.plugin_fixtures:TINY_MODEL", "expected a ursa_ray.data.base.DatasetSpec, got ModelSpec"),
    ],
)
def test_a_broken_import_path_is_rejected_in_one_line(field, name, why, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, err = validate(write_grid(tmp_path, **{field: [name]}), capsys, monkeypatch)
    assert code == 2
    kind = field[:-1]
    assert (
        err
        == f"error: {tmp_path / 'grid.yaml'}: {field}[0].name: plug-in {kind} '{name}' (import path) is broken: {why}\n"
    )


def test_import_paths_name_methods_and_models_in_a_grid(example_plugin, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    renamed, by_path, tiny = (
        "tests.plugin_fixtures:RenamedSGD",
        "ursa_ray_example_plugin.method:TemperatureSGD",
        "tests.plugin_fixtures:TINY_MODEL",
    )
    raw = yaml.safe_load(
        write_grid(
            tmp_path,
            methods=[renamed, {"name": by_path, "hyperparameters": {"holdout_fraction": 0.3}}],
            models=[{"name": tiny, "options": {"width": 4}}],
        ).read_text()
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert [(s.method, s.label, s.model, s.model_options) for s in specs] == [
        (renamed, renamed, tiny, {"width": 4}),
        (by_path, by_path, tiny, {"width": 4}),
    ]
    assert specs[1].config["holdout_fraction"] == 0.3
    assert methods.get_method(renamed) is methods.get_method(renamed)  # imported and instantiated once
    assert validate(tmp_path / "grid.yaml", capsys, monkeypatch) == (0, "")
    code, err = validate(
        write_grid(tmp_path, methods=[{"name": by_path, "hyperparameters": {"temperature": 2.0}}]), capsys, monkeypatch
    )
    assert code == 2 and "methods[0].hyperparameters.temperature: unknown option; allowed: lr, momentum" in err


def test_an_unknown_name_lists_what_is_allowed():
    with pytest.raises(RegistryError) as info:
        methods.get_method("nuts")
    message = str(info.value)
    allowed = ", ".join(methods.catalogue().built_ins)  # built-ins first, by name
    assert message.startswith(f"unknown method 'nuts'; allowed: {allowed}")
    assert message.endswith(", or an import path package.module:Attribute")
