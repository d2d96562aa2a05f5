"""Every class of bad grid is rejected before anything runs, with a one-line error naming file and field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from ursa_ray import data
from ursa_ray.cli import main
from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.evaluation import ClassificationPredictive, RegressionPredictive
from ursa_ray.evaluation.probes.in_domain import in_domain_metrics
from ursa_ray.grid import GridError, load_grid, parse_grid
from ursa_ray.search_space import SELECTION_METRICS

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
    assert len({s.trial_id for s in specs}) == len(specs)
    sgd = next(s for s in specs if s.method == "sgd")
    assert sgd.config["lr"] == 0.05 and sgd.config["epochs"] == 2 and sgd.config["batch_size"] == 64
    # ids are deterministic: the same grid gives the same ids (resume relies on it)
    assert [s.trial_id for s in parse_grid(GOOD, "g.yaml").trial_specs()] == [s.trial_id for s in specs]


BAD = [
    (variant(colour="red"), "colour: unknown key; allowed: name, description, methods"),
    (variant(methods=[{"name": "sgd", "temperature": 2}]), "methods[0].temperature: unknown key; allowed: name, label"),
    (variant(methods=["nuts"]), "methods[0].name: unknown method 'nuts'; allowed: "),
    (variant(models=["transformer"]), "models[0].name: unknown model 'transformer'; allowed: "),
    (variant(datasets=["imagenet"]), "datasets[0].name: unknown dataset 'imagenet'; allowed: "),
    (
        variant(datasets=[{"name": "digits", "ood": ["svhn"]}]),
        "datasets[0].ood: unknown OOD set 'svhn' for digits; allowed: digits_inverted",
    ),
    (
        variant(methods=[{"name": "sgd", "hyperparameters": {"lr": "fast"}}]),
        "methods[0].hyperparameters.lr: expected float, got 'fast'",
    ),
    (
        variant(methods=[{"name": "sgd", "hyperparameters": {"lr": -1.0}}]),
        "methods[0].hyperparameters.lr: expected a value >= 0.0",
    ),
    (
        variant(methods=[{"name": "sgd", "hyperparameters": {"warmup": 3}}]),
        "methods[0].hyperparameters.warmup: unknown option; allowed: lr, momentum",
    ),
    (
        variant(models=[{"name": "mlp", "options": {"widths": "wide"}}]),
        "models[0].options.widths: expected a list of positive integers",
    ),
    (variant(methods=[]), "methods: expected a non-empty list of methods"),
    (variant(models=[]), "models: expected a non-empty list of models"),
    (variant(datasets=[]), "datasets: expected a non-empty list of datasets"),
    (variant(datasets=["digits", "digits"]), "datasets: each dataset may appear once"),
    (variant(seeds=[]), "seeds: expected an integer n (seeds 0..n-1) or a non-empty list"),
    (variant(seeds=[0, -1]), "seeds[1]: expected an integer in [0, 2147483647] (2^31 - 1), got -1"),
    (variant(seeds=[0, 1.5]), "seeds[1]: expected an integer in [0, 2147483647] (2^31 - 1), got 1.5"),
    (variant(seeds=[2**31]), "seeds[0]: expected an integer in [0, 2147483647] (2^31 - 1), got 2147483648"),
    (variant(seeds=0), "seeds: expected a number of seeds from 1 to 2147483648 (seeds 0..n-1), got 0"),
    (variant(seeds="three"), "seeds: expected an integer n"),
    (variant(bit_depths=["int4"]), "bit_depths: expected a list of float16, bfloat16, int8, got ['int4']"),
    (variant(bit_depths="int8"), "bit_depths: expected a list of float16, bfloat16, int8, got 'int8'"),
    (variant(budget={"epochs": 0}), "budget.epochs: expected an integer >= 1, got 0"),
    (variant(budget={"n_samples": -5}), "budget.n_samples: expected an integer >= 1, got -5"),
    (variant(budget={"epochs": 2.5}), "budget.epochs: expected an integer >= 1, got 2.5"),
    (variant(budget={"wall_clock": 5}), "budget.wall_clock: unknown key; allowed: epochs, n_samples, batch_size"),
    (variant(resources={"cpu": 0}), "resources.cpu: expected a number > 0, got 0"),
    (variant(resources={"gpu": -1}), "resources.gpu: expected a number >= 0, got -1"),
    (variant(resources={"tpu": 1}), "resources.tpu: unknown key; allowed: cpu, gpu, custom"),
    (variant(resources={"custom": {"big_mem": 0}}), "resources.custom.big_mem: expected a number > 0, got 0"),
    (
        variant(models=[{"name": "mlp", "resources": {"gpu": "one"}}]),
        "models[0].resources.gpu: expected a number, got 'one'",
    ),
    (
        variant(models=["linear", {"name": "mlp", "resources": {"gpu": -0.5}}]),
        "models[1].resources.gpu: expected a number >= 0, got -0.5",
    ),
    (
        variant(models=[{"name": "mlp", "resources": {"cpu": 0}}]),
        "models[0].resources.cpu: expected a number > 0, got 0",
    ),
    (
        variant(models=[{"name": "mlp", "resources": {"tpu": 1}}]),
        "models[0].resources.tpu: unknown key; allowed: cpu, gpu, custom",
    ),
    (
        variant(models=[{"name": "mlp", "resources": [1, 0]}]),
        "models[0].resources: expected a mapping with keys ['cpu', 'gpu', 'custom']",
    ),
    (
        variant(methods=["sgd", {"name": "mc_dropout", "resources": {"cpu": True}}]),
        "methods[1].resources.cpu: expected a number, got True",
    ),
    (
        variant(methods=[{"name": "sgd", "resources": {"custom": ["big_mem"]}}]),
        "methods[0].resources.custom: expected a mapping of resource name to amount, got ['big_mem']",
    ),
    (
        variant(methods=[{"name": "sgd", "resources": {"custom": {"big_mem": -1}}}]),
        "methods[0].resources.custom.big_mem: expected a number > 0, got -1",
    ),
    (variant(save_predictions="yes"), "save_predictions: expected true or false, got 'yes'"),
    (variant(name=None), "name: required"),
    (
        variant(datasets=[{"name": "digits", "complexity": [1, 2]}]),
        "datasets[0].complexity: digits has no complexity to sweep",
    ),
    (variant(methods=["sgd", "sgd"]), "methods: labels must be unique"),
    (
        variant(methods=[{"name": "sgd", "models": ["resnet50"]}]),
        "methods[0].models: 'resnet50' is not among the grid's models: mlp",
    ),
    (
        variant(methods=[{"name": "sgd", "model_hyperparameters": {"mlp": {"lr": "x"}}}]),
        "methods[0].model_hyperparameters.mlp.lr: expected float",
    ),
    (
        variant(methods=[{"name": "sgd", "model_hyperparameters": {"vit": {"lr": 0.1}}}]),
        "methods[0].model_hyperparameters.vit: not among the grid's models: mlp",
    ),
    (
        variant(methods=["sgd", {"name": "sgd", "label": "sgd_ts", "calibrate": "platt"}]),
        "methods[1].calibrate: expected one of temperature, got 'platt'",
    ),
    (
        variant(methods=[{"name": "sgd", "calibrate": "temperature"}], datasets=["digits", {"name": "e1"}]),
        "methods[0].calibrate: temperature scaling applies to classification datasets only, not the regression "
        "dataset 'e1'",
    ),
]


def test_final_specs_are_built_once_and_handed_out_as_new_lists():
    """The driver reads the final specs a checked grid kept (it has no registries); a caller changing its list
    changes no other caller's, and the search phase's overrides are never served from the kept specs."""
    grid = parse_grid(variant(), "g.yaml")
    first = grid.trial_specs()
    first.pop()
    assert len(grid.trial_specs("final", {})) == len(first) + 1 == 2 * 2
    overrides = {s.cell: {"lr": 0.2} for s in first if s.method == "sgd"}
    assert {s.config["lr"] for s in grid.trial_specs("final", overrides) if s.method == "sgd"} == {0.2}
    assert {s.config["lr"] for s in grid.trial_specs() if s.method == "sgd"} == {0.05}


def test_method_restricted_to_datasets():
    raw = variant(
        datasets=["digits", {"name": "e1", "complexity": [1, 2]}],
        methods=[{"name": "sgd", "datasets": ["digits"]}, {"name": "mc_dropout", "datasets": ["e1"]}],
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert {(s.method, s.dataset, s.complexity) for s in specs} == {
        ("sgd", "digits", None),
        ("mc_dropout", "e1", 1.0),
        ("mc_dropout", "e1", 2.0),
    }
    with pytest.raises(GridError, match=r"methods\[0\].datasets: 'mnist' is not among the grid's datasets"):
        parse_grid(variant(methods=[{"name": "sgd", "datasets": ["mnist"]}]), "g.yaml")


def test_model_hyperparameters_override_per_model():
    raw = variant(
        models=[{"name": "mlp", "options": {"widths": [8]}}, "linear"],
        methods=[{"name": "sgd", "hyperparameters": {"lr": 0.1}, "model_hyperparameters": {"linear": {"lr": 0.5}}}],
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert {s.model: s.config["lr"] for s in specs} == {"mlp": 0.1, "linear": 0.5}


def test_resources_per_method_and_model_merge_key_by_key():
    """Method entry over model entry over the grid, key by key; ``custom`` is one key (replaced whole)."""
    raw = variant(
        resources={"cpu": 2, "custom": {"pool": 1}},
        models=[{"name": "mlp", "options": {"widths": [8]}, "resources": {"cpu": 1, "gpu": 0.1, "custom": {"big_mem": 2}}},
                "linear"],
        methods=[{"name": "sgd", "resources": {"gpu": 0.5}}, {"name": "mc_dropout", "resources": {"custom": {}}},
                 {"name": "sgd", "label": "plain"}],
    )  # fmt: skip
    grid = parse_grid(raw, "g.yaml")
    got = {(s.label, s.model): s.resources for s in grid.trial_specs() if s.seed == 0}
    assert got == {
        ("sgd", "mlp"): {
            "cpu": 1,
            "gpu": 0.5,
            "custom": {"big_mem": 2},
        },  # gpu from the method, the rest from the model
        ("sgd", "linear"): {"cpu": 2, "gpu": 0.5, "custom": {"pool": 1}},  # cpu and custom from the grid
        ("mc_dropout", "mlp"): {"cpu": 1, "gpu": 0.1, "custom": {}},  # the method drops every custom resource
        ("mc_dropout", "linear"): {"cpu": 2, "gpu": 0, "custom": {}},
        ("plain", "mlp"): {"cpu": 1, "gpu": 0.1, "custom": {"big_mem": 2}},
        ("plain", "linear"): {"cpu": 2, "gpu": 0, "custom": {"pool": 1}},
    }
    assert grid.resources == {"cpu": 2, "gpu": 0, "custom": {"pool": 1}}
    search = grid.spec_for(grid.cells()[1], 0, "search", {})  # a search trial asks for what its cell's final ones do
    assert (search.label, search.model, search.resources) == ("sgd", "linear", got[("sgd", "linear")])
    assert search.resources["custom"] is not grid.resources["custom"]  # a copy: a spec changed alone
    defaults = parse_grid(variant(resources=None), "g.yaml").trial_specs()[0].resources
    assert defaults == {"cpu": 1, "gpu": 0, "custom": {}}


def test_resources_do_not_change_trial_ids():
    """A trial's id (resume, the grid fingerprint) does not depend on what it asks Ray for."""
    plain = parse_grid(GOOD, "g.yaml").trial_specs()
    raw = variant(
        models=[{"name": "mlp", "options": {"widths": [16]}, "resources": {"cpu": 4, "gpu": 1}}],
        methods=[{"name": "sgd", "hyperparameters": {"lr": 0.05}, "resources": {"gpu": 0.5}}, "mc_dropout"],
    )
    specs = parse_grid(raw, "g.yaml").trial_specs()
    assert [s.trial_id for s in specs] == [s.trial_id for s in plain]
    assert {s.resources["gpu"] for s in specs} == {0.5, 1}


def test_a_calibrated_entry_is_another_variant_whose_final_trials_alone_calibrate():
    """``calibrate: temperature`` beside the same method without it: two labels, two sets of trial ids (the key
    enters the id, so adding it to an entry reruns its trials), the key on the calibrated entry's final specs
    only (its search trials and the cell's reference do not hold out a split), and the other entry's ids as
    they were without the calibrated one."""
    from ursa_ray.reference import reference_spec

    raw = variant(methods=["sgd", {"name": "sgd", "label": "sgd_ts", "calibrate": "temperature"}])
    specs = parse_grid(raw, "g.yaml").trial_specs()
    by_label = {label: [s for s in specs if s.label == label] for label in ("sgd", "sgd_ts")}
    assert {s.calibrate for s in by_label["sgd"]} == {None} and {s.calibrate for s in by_label["sgd_ts"]} == {
        "temperature"
    }
    assert len({s.trial_id for s in specs}) == len(specs) == 4
    plain = parse_grid(variant(methods=["sgd"]), "g.yaml").trial_specs()
    assert [s.trial_id for s in by_label["sgd"]] == [s.trial_id for s in plain]
    relabelled = variant(methods=[{"name": "sgd", "label": "sgd_ts"}])
    uncalibrated = parse_grid(relabelled, "g.yaml").trial_specs()  # same label, no key: other ids
    assert not {s.trial_id for s in uncalibrated} & {s.trial_id for s in by_label["sgd_ts"]}
    searched = parse_grid(dict(raw, search={"n_trials": 2}), "g.yaml").trial_specs("search")
    assert {s.calibrate for s in searched} == {None}
    assert reference_spec(by_label["sgd_ts"][0], {}).calibrate is None


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
    assert {s.config["likelihood_temperature"] for s in specs} == {5000.0}
    assert all("temperature" not in s.config for s in specs)
    # the samplers that temper the whole posterior keep `temperature`
    raw = variant(
        methods=[
            {
                "name": "sgld",
                "hyperparameters": {"temperature": 0.5, "burn_in_epochs": 1},
            },  # below the budget's 2 epochs
            {"name": "hmc", "hyperparameters": {"temperature": 0.5}},
        ]
    )
    assert {s.config["temperature"] for s in parse_grid(raw, "g.yaml").trial_specs()} == {0.5}


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
        (
            {"schedule": {"type": "choice", "values": ["step"]}},
            "methods[0].search.schedule: expected one of ['constant', 'cosine']",
        ),
    ]
    for space, message in bad_cases:
        raw = variant(methods=[{"name": "sgd", "search": space}], search={"n_trials": 2})
        with pytest.raises(GridError, match=None) as info:
            parse_grid(raw, "s.yaml")
        assert message in str(info.value), str(info.value)
    with pytest.raises(GridError, match="search.algorithm: expected one of random, tpe"):
        parse_grid(variant(search={"algorithm": "grid", "n_trials": 2}), "s.yaml")
    with pytest.raises(GridError, match="methods declare search spaces but the grid has no search block"):
        parse_grid(
            variant(methods=[{"name": "sgd", "search": {"lr": {"type": "uniform", "low": 0.1, "high": 0.2}}}]), "s.yaml"
        )


METRIC_MISMATCH = [
    (
        variant(methods=[{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}}]),
        "val_rmse",
        "search.metric: val_rmse is not reported on the validation split of the classification dataset 'digits' "
        "(searched by method sgd); allowed for classification: val_nll, val_accuracy, val_brier, val_ece",
    ),
    (
        variant(
            datasets=[{"name": "e1", "complexity": [1]}],
            methods=[{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}}],
        ),
        "val_accuracy",
        "search.metric: val_accuracy is not reported on the validation split of the regression dataset 'e1' "
        "(searched by method sgd); allowed for regression: val_nll, val_rmse",
    ),
    (
        variant(
            datasets=["digits", {"name": "e1", "complexity": [1]}],
            methods=[{"name": "sgd", "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}}],
        ),
        "val_brier",
        "search.metric: val_brier is not reported on the validation split of the regression dataset 'e1' "
        "(searched by method sgd); allowed for classification and regression: val_nll",
    ),
]


@pytest.mark.parametrize(
    "raw, metric, message", METRIC_MISMATCH, ids=["rmse-classification", "accuracy-regression", "mixed"]
)
def test_a_selection_metric_the_task_does_not_report_is_rejected(raw, metric, message):
    with pytest.raises(GridError) as info:
        parse_grid({**raw, "search": {"n_trials": 2, "metric": metric}}, "grids/bad.yaml")
    assert str(info.value) == f"grids/bad.yaml: {message}"
    parse_grid({**raw, "search": {"n_trials": 2, "metric": "val_nll"}}, "grids/ok.yaml")  # reported by both tasks


def test_the_selection_metric_need_suit_only_the_searched_datasets():
    raw = variant(
        datasets=["digits", {"name": "e1", "complexity": [1]}],
        methods=[
            {"name": "sgd", "datasets": ["e1"], "search": {"lr": {"type": "loguniform", "low": 1e-3, "high": 0.3}}},
            {"name": "mc_dropout", "datasets": ["digits"]},
        ],
        search={"n_trials": 2, "metric": "val_rmse"},
    )
    assert parse_grid(raw, "grids/ok.yaml").search.metric == "val_rmse"


def test_selection_metrics_are_the_ones_each_task_reports_on_its_validation_split():
    """SELECTION_METRICS' tasks agree with what a search trial's validation evaluation reports (val_ + key)."""
    digits = data.get_dataset("digits").load({}, (), Path("."), False, 0)
    e1 = make_dataset("e1", 2.0, 0)
    reported = {}
    for ds in (digits, e1):
        n = 20
        if ds.task == "classification":
            pred = ClassificationPredictive(n, ds.n_outputs)
            samples = [torch.randn(n, ds.n_outputs) for _ in range(2)]
        else:
            pred = RegressionPredictive(n)
            samples = [torch.randn(n) for _ in range(2)]
        for s in samples:
            pred.update(s)
        reported[ds.task] = {f"val_{k}" for k in in_domain_metrics(ds, pred, ds.train_y[:n], "validation")}
    assert set(reported) == {"classification", "regression"}
    for name, metric in SELECTION_METRICS.items():
        for task, keys in reported.items():
            assert (name in keys) == (task in metric.tasks), (name, task, sorted(keys))


def test_validate_says_it_did_not_check_resources_without_a_reachable_cluster(tmp_path, monkeypatch, capsys):
    """Without RAY_ADDRESS or --address, or with an address where nothing answers, validate says in one line
    that it did not check resources, and starts no Ray."""
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("validate started or joined a Ray")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    grid_file = tmp_path / "gpu.yaml"
    grid_file.write_text(yaml.safe_dump(variant(resources={"cpu": 1, "gpu": 1})))
    assert main(["validate", str(grid_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{grid_file}: valid: ")
    assert lines[1:] == [
        "resources: not checked: no Ray cluster given (set RAY_ADDRESS or pass --address to check them)"
    ]
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens on port 1
    assert main(["validate", str(grid_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(
        "resources: not checked: no Ray cluster reachable at 127.0.0.1:1 ("
    ), lines


def test_validate_runs_the_resource_check_on_a_reachable_cluster(ray_session, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    address = ray_session.get_runtime_context().gcs_address
    grid_file = tmp_path / "cpu.yaml"
    grid_file.write_text(yaml.safe_dump(variant(resources={"cpu": 1})))
    assert main(["validate", str(grid_file), "--address", address]) == 0
    assert (
        capsys.readouterr().out.splitlines()[1]
        == f"resources: each trial's CPU=1 fits a node of the Ray cluster at {address}"
    )
    grid_file.write_text(yaml.safe_dump(variant(resources={"cpu": 1, "gpu": 1})))
    assert main(["validate", str(grid_file), "--address", address]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        f"error: {grid_file}: resources: each trial asks for GPU=1, which no node of the Ray cluster has"
        in captured.err
    )
