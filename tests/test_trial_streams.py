"""A trial's random streams: independent of each other and across seeds, and reproducible per seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ursa_ray.trial
from ursa_ray.grid import parse_grid
from ursa_ray.trial import RANDOM_STREAMS, run_trial, trial_seeds

GRID = {
    "name": "streams",
    "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}}],
    "models": [{"name": "mlp", "options": {"widths": [32]}}],
    "datasets": ["digits"],
    "seeds": [0, 1],
    "budget": {"epochs": 2, "batch_size": 128},
    "save_predictions": False,
}


@pytest.fixture(scope="module")
def specs():
    return {s["seed"]: s for s in parse_grid(GRID, "streams.yaml").trial_specs()}


class _StreamProbe:
    """A stand-in method that records the first draws of the global (init) stream and of the problem's
    generator (mini-batch) stream, then yields one network."""

    name = "sgd"
    hyperparameters = ()

    def __init__(self) -> None:
        self.draws: dict[str, np.ndarray] = {}

    def sample_posterior(self, problem, config, stats):
        self.draws["init"] = torch.randn(4000, dtype=torch.float64).numpy()
        self.draws["data"] = torch.randn(4000, dtype=torch.float64, generator=problem.generator).numpy()
        yield torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def _draws(spec, monkeypatch) -> dict[str, np.ndarray]:
    probe = _StreamProbe()
    monkeypatch.setattr(ursa_ray.trial.methods, "get_method", lambda name: probe)
    run_trial(spec)
    return probe.draws


def test_init_and_minibatch_streams_are_uncorrelated_within_and_across_seeds(specs, monkeypatch):
    a, b = _draws(specs[0], monkeypatch), _draws(specs[1], monkeypatch)
    pairs = {
        "init vs data, seed 0": (a["init"], a["data"]),
        "init vs data, seed 1": (b["init"], b["data"]),
        "init, seeds 0 and 1": (a["init"], b["init"]),
        "data, seeds 0 and 1": (a["data"], b["data"]),
        "init of seed 0 vs data of seed 1": (a["init"], b["data"]),
    }
    for name, (x, y) in pairs.items():  # |r| < 0.08 is five standard errors at n = 4000
        assert abs(np.corrcoef(x, y)[0, 1]) < 0.08, name


def test_stream_seeds_are_spawned_from_one_seed_sequence():
    seeds = trial_seeds(7)
    children = np.random.SeedSequence(7).spawn(len(RANDOM_STREAMS))
    assert list(seeds) == list(RANDOM_STREAMS) == ["init", "data", "split", "corruption"]
    assert list(seeds.values()) == [int(c.generate_state(1, np.uint64)[0]) for c in children]
    assert len({*seeds.values(), *trial_seeds(8).values()}) == 2 * len(RANDOM_STREAMS)


def test_seeds_give_different_networks_and_a_seed_reproduces_every_metric(specs):
    def outcome_metrics(spec):
        return {(m["eval_set"], m["metric"]): m["value"] for m in run_trial(spec).metrics if m["eval_set"] != "cost"}

    first, again, other = outcome_metrics(specs[0]), outcome_metrics(specs[0]), outcome_metrics(specs[1])
    assert first == again
    assert first[("test", "nll")] != other[("test", "nll")]
