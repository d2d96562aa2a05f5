"""The paper-scale grids validate when their data is present, report missing data before any trial, and
their trials start on files in the real on-disk formats (tiny generated stand-ins for the real sets)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from ursa_ray.cli import main
from ursa_ray.data import _vision_files as files
from ursa_ray.grid import load_grid
from ursa_ray.trial import run_trial

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

GRIDS = Path(__file__).resolve().parents[1] / "grids"
SHRINK = {
    "epochs": 2,
    "burn_in_epochs": 1,
    "n_samples": 2,
    "n_cycles": 1,
    "epochs_per_cycle": 10,
    "samples_per_cycle": 1,
    "swa_epochs": 2,
    "burn_in": 2,
    "n_leapfrog": 3,
    "rank": 2,
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)

    def images(n, shape):
        return rng.integers(0, 256, (n, *shape), dtype=np.uint8)

    for name in ("mnist", "fashion_mnist", "kmnist"):
        labels = np.tile(np.arange(10, dtype=np.uint8), 20)
        files.write_mnist_family(root, name, images(200, (28, 28)), labels, images(40, (28, 28)), labels[:40])
    # CIFAR-sized sets of a few images each: every image costs a ResNet50 pass per evaluation set and attack step
    labels = np.tile(np.arange(10), 2)
    files.write_cifar10(root, images(20, (3, 32, 32)), labels, images(10, (3, 32, 32)), labels[:10])
    labels100 = np.arange(100)
    files.write_cifar100(root, images(100, (3, 32, 32)), labels100, images(20, (3, 32, 32)), labels100[:20])
    files.write_svhn_test(root, images(10, (3, 32, 32)), np.arange(1, 11) % 10 + 1)
    files.write_stl10_test(root, images(10, (3, 96, 96)), np.arange(10) + 1)
    return root


@pytest.fixture
def with_data(data_root, monkeypatch):
    monkeypatch.setenv("URSA_DATA", str(data_root))
    monkeypatch.setenv("URSA_SKIP_CHECKSUMS", "1")
    return data_root


def test_missing_data_is_reported_before_any_trial(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("URSA_DATA", str(tmp_path / "empty"))
    out = tmp_path / "results"
    assert main(["run", str(GRIDS / "small_scale.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {GRIDS / 'small_scale.yaml'}: datasets[0]: dataset 'mnist' not found: no file ")
    assert str(tmp_path / "empty") in err and "download: true" in err and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("grid", ["small_scale.yaml", "medium_scale.yaml"])
def test_paper_grids_validate_with_data_present(with_data, grid, capsys):
    assert main(["validate", str(GRIDS / grid)]) == 0
    assert "valid:" in capsys.readouterr().out


def _shrunk(spec):
    """The trial with the grid's methods, models, data files and every evaluation part it asks for (each
    corruption type, both attacks and the transfer attack, each bit depth), at the smallest size each part
    runs at: the lowest severity, the smallest epsilon, one PGD step, one attacked sample."""
    config = {k: (min(v, SHRINK[k]) if k in SHRINK else v) for k, v in spec.config.items()}
    corruptions = {**spec.corruptions, "severities": spec.corruptions["severities"][:1]}
    adversarial = spec.adversarial
    adversarial = {**adversarial, "epsilons": adversarial["epsilons"][:1], "pgd_steps": 1, "attack_samples": 1}
    resources = {**spec.resources, "gpu": 0}
    return dataclasses.replace(
        spec, config=config, resources=resources, corruptions=corruptions, adversarial=adversarial
    )


def test_small_scale_every_method_starts_on_mnist_format_files(with_data):
    grid = load_grid(GRIDS / "small_scale.yaml")
    seen = set()
    for spec in grid.trial_specs():
        if spec.label in seen or spec.dataset != "mnist":
            continue
        seen.add(spec.label)
        outcome = run_trial(_shrunk(spec))
        evals = {m["eval_set"] for m in outcome.metrics}
        assert {"test", "fashion_mnist", "kmnist"} <= evals, spec.label
        if spec.method not in ("mfvi", "sngp"):  # their networks carry σ per weight, or a GP layer
            assert outcome.record["n_params"] == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert seen == {m.label for m in grid.methods}


def test_medium_scale_starts_on_cifar_format_files(with_data):
    grid = load_grid(GRIDS / "medium_scale.yaml")
    spec = next(s for s in grid.trial_specs() if s.label == "sgd" and s.model == "resnet50" and s.dataset == "cifar10")
    spec = _shrunk(spec)
    spec = dataclasses.replace(spec, config={**spec.config, "epochs": 1})
    outcome = run_trial(spec)
    evals = {m["eval_set"] for m in outcome.metrics}
    assert {"test", "svhn", "stl10"} <= evals
    assert outcome.record["n_params"] == 23_520_842


@pytest.mark.parametrize("method", ["sngp", "mfvi"])
def test_the_surrogate_densities_run_on_a_wide_resnet_from_cifar_format_files(with_data, method):
    """medium_scale's sngp and mfvi entries train and evaluate on the WideResNet (at depth 10, width 1 here:
    the same blocks as WRN-28-10, fewer of them) from CIFAR-format files: SNGP with spectral-normalised
    convolutions and its GP layer on the pooled features, MFVI with Flipout convolutions.  Attacks,
    corruptions and bit depths are left out: test_medium_scale runs them."""
    grid = load_grid(GRIDS / "medium_scale.yaml")
    spec = next(
        s for s in grid.trial_specs() if s.label == method and s.model == "wide_resnet" and s.dataset == "cifar10"
    )
    spec = _shrunk(dataclasses.replace(spec, model_options={"depth": 10, "widen_factor": 1}))
    light = {
        "corruptions": {**spec.corruptions, "types": []},
        "bit_depths": (),
        "adversarial": {**spec.adversarial, "attacks": [], "transfer": False},
        "transfer_source": False,
    }
    outcome = run_trial(dataclasses.replace(spec, **light))  # what it scores is test_medium_scale's claim
    evals = {m["eval_set"] for m in outcome.metrics}
    assert {"test", "svhn", "stl10"} <= evals
    values = {m["metric"]: m["value"] for m in outcome.metrics if m["eval_set"] == "test"}
    assert 0.0 <= values["accuracy"] <= 1.0 and np.isfinite(values["nll"])
