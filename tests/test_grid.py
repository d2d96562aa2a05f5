"""Every class of bad grid is rejected before anything runs, with a one-line error naming file and field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ursa_ray.cli import main
from ursa_ray.grid import GridError, load_grid, parse_grid

GOOD = {
    "name": "tiny",
    "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}}, "mc_dropout"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": [{"name": "digits", "ood": ["noise"]}],
    "seeds": [0, 1],
    "resources": {"cpu": 1, "gpu": 0},
    "budget": {"epochs": 2, "n_samples": 2, "batch_size": 64},
}


def variant(**changes):
    grid = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is None:
            grid.pop(key)
        else:
            grid[key] = value
    return grid


def test_good_grid_expands_to_trials():
    grid = parse_grid(GOOD, "g.yaml")
    specs = grid.trial_specs()
    assert len(specs) == 2 * 1 * 1 * 2
    assert len({s["trial_id"] for s in specs}) == len(specs)
    sgd = next(s for s in specs if s["method"] == "sgd")
    assert sgd["config"]["lr"] == 0.05 and sgd["config"]["epochs"] == 2 and sgd["config"]["batch_size"] == 64
    # ids are deterministic: the same grid gives the same ids (resume relies on it)
    assert [s["trial_id"] for s in parse_grid(GOOD, "g.yaml").trial_specs()] == [s["trial_id"] for s in specs]


BAD = [
    (variant(colour="red"), "colour: unknown key; allowed: name, description, methods"),
    (variant(methods=[{"name": "sgd", "temperature": 2}]), "methods[0].temperature: unknown key; allowed: name, label"),
    (variant(methods=["nuts"]), "methods[0].name: unknown method 'nuts'; allowed: "),
    (variant(models=["transformer"]), "models[0].name: unknown model 'transformer'; allowed: "),
    (variant(datasets=["imagenet"]), "datasets[0].name: unknown dataset 'imagenet'; allowed: "),
    (variant(datasets=[{"name": "digits", "ood": ["svhn"]}]), "datasets[0].ood: unknown OOD set 'svhn' for digits; allowed: digits_inverted"),
    (variant(methods=[{"name": "sgd", "hyperparameters": {"lr": "fast"}}]), "methods[0].hyperparameters.lr: expected float, got 'fast'"),
    (variant(methods=[{"name": "sgd", "hyperparameters": {"lr": -1.0}}]), "methods[0].hyperparameters.lr: expected a value >= 0.0"),
    (variant(methods=[{"name": "sgd", "hyperparameters": {"warmup": 3}}]), "methods[0].hyperparameters.warmup: unknown option; allowed: lr, momentum"),
    (variant(models=[{"name": "mlp", "options": {"widths": "wide"}}]), "models[0].options.widths: expected a list of positive integers"),
    (variant(methods=[]), "methods: expected a non-empty list of methods"),
    (variant(models=[]), "models: expected a non-empty list of models"),
    (variant(datasets=[]), "datasets: expected a non-empty list of datasets"),
    (variant(datasets=["digits", "digits"]), "datasets: each dataset may appear once"),
    (variant(seeds=[]), "seeds: expected an integer n (seeds 0..n-1) or a non-empty list"),
    (variant(seeds=[0, -1]), "seeds[1]: expected an integer >= 0, got -1"),
    (variant(seeds=[0, 1.5]), "seeds[1]: expected an integer >= 0, got 1.5"),
    (variant(seeds=0), "seeds: expected an integer >= 1, got 0"),
    (variant(seeds="three"), "seeds: expected an integer n"),
    (variant(budget={"epochs": 0}), "budget.epochs: expected an integer >= 1, got 0"),
    (variant(budget={"n_samples": -5}), "budget.n_samples: expected an integer >= 1, got -5"),
    (variant(budget={"epochs": 2.5}), "budget.epochs: expected an integer >= 1, got 2.5"),
    (variant(budget={"wall_clock": 5}), "budget.wall_clock: unknown key; allowed: epochs, n_samples, batch_size"),
    (variant(resources={"cpu": 0}), "resources.cpu: expected a number > 0, got 0"),
    (variant(resources={"gpu": -1}), "resources.gpu: expected a number >= 0, got -1"),
    (variant(resources={"tpu": 1}), "resources.tpu: unknown key; allowed: cpu, gpu, custom"),
    (variant(save_predictions="yes"), "save_predictions: expected true or false, got 'yes'"),
    (variant(name=None), "name: required"),
    (variant(datasets=[{"name": "digits", "complexity": [1, 2]}]), "datasets[0].complexity: digits has no complexity to sweep"),
    (variant(methods=["sgd", "sgd"]), "methods: labels must be unique"),
    (variant(methods=[{"name": "sgd", "models": ["resnet50"]}]), "methods[0].models: 'resnet50' is not among the grid's models: mlp"),
    (variant(methods=[{"name": "sgd", "model_hyperparameters": {"mlp": {"lr": "x"}}}]), "methods[0].model_hyperparameters.mlp.lr: expected float"),
    (variant(methods=[{"name": "sgd", "model_hyperparameters": {"vit": {"lr": 0.1}}}]), "methods[0].model_hyperparameters.vit: not among the grid's models: mlp"),
]


def test_method_restricted_to_datasets():
    raw = variant(
        datasets=["digits", {"name": "e1", "complexity": [1, 2]}],
        methods=[{"name": "sgd", "datasets": ["digits"]}, {"name": "mc_dropout", "datasets": ["e1"]}],
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert {(s["method"], s["dataset"], s["complexity"]) for s in specs} == {
        ("sgd", "digits", None), ("mc_dropout", "e1", 1.0), ("mc_dropout", "e1", 2.0)
    }
    with pytest.raises(GridError, match=r"methods\[0\].datasets: 'mnist' is not among the grid's datasets"):
        parse_grid(variant(methods=[{"name": "sgd", "datasets": ["mnist"]}]), "g.yaml")


def test_model_hyperparameters_override_per_model():
    raw = variant(
        models=[{"name": "mlp", "options": {"widths": [8]}}, "linear"],
        methods=[{"name": "sgd", "hyperparameters": {"lr": 0.1}, "model_hyperparameters": {"linear": {"lr": 0.5}}}],
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert {s["model"]: s["config"]["lr"] for s in specs} == {"mlp": 0.1, "linear": 0.5}


@pytest.mark.parametrize("raw, message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_grid_is_rejected_naming_file_and_field(raw, message):
    with pytest.raises(GridError) as info:
        parse_grid(raw, "grids/bad.yaml")
    text = str(info.value)
    assert text.startswith("grids/bad.yaml: "), text
    assert message in text, text
    assert "\n" not in text


PCA_ESS_TEMPERATURE = [
    ({"name": "pca_ess", "hyperparameters": {"temperature": 5000.0}}, "methods[0].hyperparameters.temperature"),
    (
        {"name": "pca_ess", "model_hyperparameters": {"mlp": {"temperature": 5000.0}}},
        "methods[0].model_hyperparameters.mlp.temperature",
    ),
    (
        {"name": "pca_ess", "search": {"temperature": {"type": "loguniform", "low": 1.0, "high": 1e4}}},
        "methods[0].search.temperature",
    ),
]


@pytest.mark.parametrize("method, field", PCA_ESS_TEMPERATURE, ids=["hyperparameters", "per_model", "search"])
def test_subspace_temperature_is_rejected_with_a_hint(tmp_path, method, field):
    """pca_ess's ``temperature`` divides only the log-likelihood, unlike SG-MCMC's and HMC's: it was renamed
    ``likelihood_temperature``, and the old name is rejected before any trial, naming file, method and field."""
    grid_file = tmp_path / "old.yaml"
    grid_file.write_text(yaml.safe_dump(variant(methods=[method], search={"n_trials": 2})))
    with pytest.raises(GridError) as info:
        load_grid(grid_file)
    text = str(info.value)
    hint = "method pca_ess renamed 'temperature' to 'likelihood_temperature'; use likelihood_temperature"
    assert text.startswith(f"{grid_file}: {field}: {hint}"), text
    assert "\n" not in text


def test_likelihood_temperature_reaches_the_subspace_trials():
    raw = variant(methods=[{"name": "pca_ess", "hyperparameters": {"likelihood_temperature": 5000.0}}])
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert {s["config"]["likelihood_temperature"] for s in specs} == {5000.0}
    assert all("temperature" not in s["config"] for s in specs)
    # the samplers that temper the whole posterior keep `temperature`
    raw = variant(methods=[{"name": name, "hyperparameters": {"temperature": 0.5}} for name in ("sgld", "hmc")])
    assert {s["config"]["temperature"] for s in parse_grid(raw, "g.yaml").trial_specs()} == {0.5}


def test_methods_listing_says_what_each_temperature_tempers(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    method = None
    temperature_line: dict[str, str] = {}
    for line in lines:
        if not line.startswith(" "):
            method = line.split(":")[0]
        elif "temperature (" in line:
            temperature_line[method] = line.strip()
    for name in ("sgld", "sghmc", "csgld", "csghmc", "hmc"):
        line = temperature_line[name]
        assert line.startswith("temperature (") and "exp(−U/T), the whole posterior" in line, line
    line = temperature_line["pca_ess"]
    assert line.startswith("likelihood_temperature (") and "only the log-likelihood" in line, line
    assert line.endswith("(formerly temperature)"), line


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nmethods: [sgd\n")
    with pytest.raises(GridError, match=r"broken.yaml: line \d+: not valid YAML"):
        load_grid(bad)
    with pytest.raises(GridError, match="cannot read the grid file"):
        load_grid(tmp_path / "absent.yaml")


def test_cli_rejects_bad_grid_with_status_2_and_creates_nothing(tmp_path, capsys):
    grid_file = tmp_path / "bad.yaml"
    grid_file.write_text(yaml.safe_dump(variant(methods=["nuts"])))
    out = tmp_path / "results"
    assert main(["run", str(grid_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {grid_file}: methods[0].name: unknown method 'nuts'" in err
    assert not out.exists()
    assert main(["validate", str(grid_file)]) == 2


def test_cli_validate_accepts_shipped_grids(capsys):
    """Grids on embedded or generated data; the paper-scale ones need files (see test_paper_grids.py)."""
    root = Path(__file__).resolve().parents[1] / "grids"
    for grid in sorted(root.glob("*.yaml")):
        if grid.stem in ("small_scale", "medium_scale"):
            continue
        assert main(["validate", str(grid)]) == 0, grid
    assert "valid:" in capsys.readouterr().out


def test_gpu_request_on_cluster_without_gpus_is_rejected_before_running(ray_session, tmp_path, capsys):
    grid_file = tmp_path / "gpu.yaml"
    grid_file.write_text(yaml.safe_dump(variant(resources={"cpu": 1, "gpu": 1})))
    out = tmp_path / "results"
    assert main(["run", str(grid_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "resources: each trial asks for GPU=1, which no node of the Ray cluster has" in err
    assert not out.exists()


def test_search_space_validation():
    good = variant(
        methods=[{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}}],
        search={"algorithm": "random", "n_trials": 2},
    )
    grid = parse_grid(good, "s.yaml")
    assert grid.methods[0].search_space["lr"] == {"type": "loguniform", "low": 1e-3, "high": 0.3}
    bad_cases = [
        ({"lr": {"type": "loguniform", "low": 0.0, "high": 0.3}}, "methods[0].search.lr: loguniform needs low > 0"),
        ({"lr": {"type": "normal", "low": 0.1, "high": 0.3}}, "methods[0].search.lr: expected {type: one of uniform"),
        ({"epochs": {"type": "uniform", "low": 1, "high": 3}}, "methods[0].search.epochs: epochs is a int; use int"),
        ({"lr": {"type": "uniform", "low": 0.3, "high": 0.1}}, "methods[0].search.lr: expected low < high"),
        ({"depth": {"type": "int", "low": 1, "high": 3}}, "methods[0].search.depth: unknown hyperparameter"),
        ({"schedule": {"type": "choice", "values": ["step"]}}, "methods[0].search.schedule: expected one of ['constant', 'cosine']"),
    ]
    for space, message in bad_cases:
        raw = variant(methods=[{"name": "sgd", "search": space}], search={"n_trials": 2})
        with pytest.raises(GridError, match=None) as info:
            parse_grid(raw, "s.yaml")
        assert message in str(info.value), str(info.value)
    with pytest.raises(GridError, match="search.algorithm: expected one of random, tpe"):
        parse_grid(variant(search={"algorithm": "grid", "n_trials": 2}), "s.yaml")
    with pytest.raises(GridError, match="methods declare search spaces but the grid has no search block"):
        parse_grid(variant(methods=[{"name": "sgd", "search": {"lr": {"type": "uniform", "low": 0.1, "high": 0.2}}}]), "s.yaml")
