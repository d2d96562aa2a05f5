"""The Python API (``ursa_ray.run``, ``ursa_ray.load``) and the CLI give the same results."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

import ursa_ray
from ursa_ray.cli import main
from ursa_ray.grid import GridError, load_grid

pytestmark = pytest.mark.slow  # starts Ray or runs whole grids: not in the fast tier (-m "not slow")

GRID = {
    "name": "api",
    "methods": [
        {"name": "sgd", "hyperparameters": {"lr": 0.05}},
        {"name": "mc_dropout", "hyperparameters": {"p": 0.3}},
    ],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": [{"name": "digits", "ood": ["noise"]}],
    "seeds": [0],
    "resources": {"cpu": 1},
    "budget": {"epochs": 2, "n_samples": 3, "batch_size": 128},
    "corruptions": {"types": ["rotate"], "severities": [3], "n_examples": 100},
    "adversarial": {"attacks": ["fgsm"], "n_examples": 50, "attack_samples": 2},
}
TIMINGS = {  # metrics that are clock readings: they differ between any two runs
    "train_s",
    "s_per_sample",
    "predict_s_per_example",
}


@pytest.fixture(scope="module")
def both_runs(ray_session, tmp_path_factory):
    """The grid run once through the CLI (from its YAML file) and once through the API (from the dict)."""
    folder = tmp_path_factory.mktemp("api")
    grid_file = folder / "api.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    assert main(["run", str(grid_file), "--out", str(folder / "cli")]) == 0
    summary = ursa_ray.run(GRID, out=folder / "api", echo=lambda line: None)
    assert len(summary.finished) == 2 and not summary.failed
    return folder, ursa_ray.load(folder / "cli"), ursa_ray.load(folder / "api")


def test_api_and_cli_give_identical_tables(both_runs):
    _, cli, api = both_runs
    key = ["trial_id", "eval_set", "metric"]
    assert sorted(cli.trials["trial_id"]) == sorted(api.trials["trial_id"])  # ids depend on the grid, not the caller
    values = [t.metrics[~t.metrics["metric"].isin(TIMINGS)].sort_values(key).reset_index(drop=True) for t in (cli, api)]
    pd.testing.assert_frame_equal(values[0], values[1])
    assert len(values[0]) > 100
    columns = ["trial_id", "method", "status", "n_samples", "n_params", "config", "transfer_from"]
    pd.testing.assert_frame_equal(
        *(t.trials[columns].sort_values("trial_id").reset_index(drop=True) for t in (cli, api))
    )
    timeless = [c for c in cli.composites.columns if not c.startswith(("s_per_sample", "train_s"))]  # and intervals
    pd.testing.assert_frame_equal(cli.composites[timeless], api.composites[timeless])
    assert set(cli.composites.index) == {"mc_dropout", "sgd"}


def test_api_keeps_the_grid_it_ran(both_runs):
    """A dict grid has no file: the results directory keeps its YAML, which validates back to the same trials."""
    folder, _, _ = both_runs
    kept = load_grid(folder / "api" / "grid.yaml")
    assert [s.trial_id for s in kept.trial_specs()] == [
        s.trial_id for s in load_grid(folder / "api.yaml").trial_specs()
    ]
    assert (folder / "cli" / "grid.yaml").read_text() == (folder / "api.yaml").read_text()  # a file is kept as written


def test_api_accepts_a_path_a_dict_or_a_grid_and_rejects_anything_else(tmp_path):
    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    from ursa_ray.api import as_grid

    loaded = load_grid(grid_file)
    assert as_grid(grid_file).trial_specs() == as_grid(GRID).trial_specs() == as_grid(loaded).trial_specs()
    assert as_grid(loaded) is loaded
    with pytest.raises(TypeError, match="grid: expected a path, a mapping or a Grid, got int"):
        as_grid(3)
    with pytest.raises(GridError, match=r"<grid dict>: seeds"):
        ursa_ray.run({**GRID, "seeds": "many"}, out=tmp_path / "never")
    assert not (tmp_path / "never").exists()  # rejected before anything was written


def test_run_with_an_address_where_no_cluster_answers_fails_fast_in_one_line(tmp_path):
    """``run --address 127.0.0.1:1``: one line naming the address, exit 2, nothing written, in seconds (the
    subprocess's timeout only guards against the old behaviour: ``ray.init`` retrying the head for minutes)."""
    import subprocess
    import sys

    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    out = tmp_path / "never"
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(
        [sys.executable, "-m", "ursa_ray.cli", "run", str(grid_file), "--out", str(out), "--address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --address 127.0.0.1:1: no Ray cluster answers there"), (
        run.stderr
    )
    assert not out.exists()
