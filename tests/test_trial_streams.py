"""A trial's random streams: independent of each other and across seeds, and reproducible per seed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import ursa_ray.evaluation.adversarial
import ursa_ray.methods.sgmcmc
import ursa_ray.prepare
import ursa_ray.trial
from ursa_ray.grid import parse_grid
from ursa_ray.methods.base import Method
from ursa_ray.prepare import RANDOM_STREAMS, trial_seeds
from ursa_ray.trial import run_trial

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
    return {s.seed: s for s in parse_grid(GRID, "streams.yaml").trial_specs()}


class _StreamProbe(Method):
    """A stand-in method that records the first draws of the global (init) stream and of the problem's
    generator (mini-batch) stream, then yields one network."""

    name = "sgd"
    description = "records its streams' first draws"
    hyperparameters = ()

    def __init__(self) -> None:
        self.draws: dict[str, np.ndarray] = {}

    def sample_posterior(self, problem, config, stats):
        self.draws["init"] = torch.randn(4000, dtype=torch.float64).numpy()
        self.draws["data"] = torch.randn(4000, dtype=torch.float64, generator=problem.generator).numpy()
        yield torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def _draws(spec, monkeypatch) -> dict[str, np.ndarray]:
    probe = _StreamProbe()
    monkeypatch.setattr(ursa_ray.prepare.methods, "get_method", lambda name: probe)
    run_trial(spec)
    return probe.draws


@pytest.mark.slow
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
    assert list(seeds) == list(RANDOM_STREAMS)
    assert list(RANDOM_STREAMS) == ["init", "data", "split", "corruption", "transfer_init", "transfer_data", "attack"]
    assert list(seeds.values()) == [int(c.generate_state(1, np.uint64)[0]) for c in children]
    assert len({*seeds.values(), *trial_seeds(8).values()}) == 2 * len(RANDOM_STREAMS)
    # streams appended later leave the first four as they were (every earlier result keeps its draws)
    first_four = np.random.SeedSequence(7).spawn(4)
    assert list(seeds.values())[:4] == [int(c.generate_state(1, np.uint64)[0]) for c in first_four]


@pytest.mark.slow
def test_seeds_give_different_networks_and_a_seed_reproduces_every_metric(specs):
    def outcome_metrics(spec):
        return {(m["eval_set"], m["metric"]): m["value"] for m in run_trial(spec).metrics if m["eval_set"] != "cost"}

    first, again, other = outcome_metrics(specs[0]), outcome_metrics(specs[0]), outcome_metrics(specs[1])
    assert first == again
    assert first[("test", "nll")] != other[("test", "nll")]


# ------------------------------------------------------------------------------------------------------
# The robustness evaluation's streams: the transfer source's own network, the attack's own draws


ROBUST = {
    **GRID,
    "corruptions": {"types": ["gaussian_noise"], "severities": [3], "n_examples": 60},
    "adversarial": {"attacks": ["fgsm", "pgd"], "n_examples": 60, "attack_samples": 4, "pgd_steps": 3},
}


def _specs(grid: dict) -> list[dict]:
    return parse_grid(grid, "streams.yaml").trial_specs()


class _RecordingProbe(_StreamProbe):
    """A :class:`_StreamProbe` that keeps the draws of every stream it is asked for, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, np.ndarray]] = []

    def sample_posterior(self, problem, config, stats):
        self.draws = {}
        self.calls.append(self.draws)
        yield from super().sample_posterior(problem, config, stats)


def test_transfer_source_trains_its_own_network_from_streams_no_method_uses(monkeypatch):
    """The transfer source (the cell's sgd trial) trains a second network whose initial weights and
    mini-batch order come from the seed's ``transfer_init`` / ``transfer_data`` streams: unlike the
    ``init`` and ``data`` streams every method's own network draws from (the same for every method of a
    seed: Laplace's θ_MAP, deep-ensemble member 0 and MC dropout start where sgd does).  The trial's own
    draws are unchanged by it.  Catches a source crafted on the sgd trial's own network (the old
    behaviour: one call, no second stream) and a source sharing the trial's init or data stream."""
    source = next(s for s in _specs(ROBUST) if s.seed == 0)
    assert source.transfer_source
    probe = _RecordingProbe()
    monkeypatch.setattr(ursa_ray.prepare.methods, "get_method", lambda name: probe)
    outcome = run_trial(source)
    assert len(probe.calls) == 2 and outcome.transfer_examples is not None
    source_draws, own_draws = probe.calls
    for stream in ("init", "data"):
        for other in ("init", "data"):  # none shared, not even shifted into the other stream
            assert abs(np.corrcoef(source_draws[stream], own_draws[other])[0, 1]) < 0.08, (stream, other)

    alone = _RecordingProbe()  # the same trial without the transfer attack draws what it drew with it
    monkeypatch.setattr(ursa_ray.prepare.methods, "get_method", lambda name: alone)
    run_trial(dataclasses.replace(source, transfer_source=False))
    assert len(alone.calls) == 1
    for stream in ("init", "data"):
        np.testing.assert_array_equal(alone.calls[0][stream], own_draws[stream])


def _values(outcome, prefix: str) -> dict[tuple[str, str], float]:
    return {
        (m["eval_set"][len(prefix) :], m["metric"]): m["value"]
        for m in outcome.metrics
        if m["eval_set"].startswith(prefix) and m["metric"] != "reference"
    }


def test_sgd_transfer_numbers_differ_from_its_white_box_numbers():
    """SGD's transfer sets are crafted on another network than its own, so its transfer accuracy is not its
    white-box accuracy (they were equal by construction when the source was the trial's own network),
    while the clean examples are the same (the same images under the same network)."""
    source = next(s for s in _specs(ROBUST) if s.seed == 0)
    outcome = run_trial(source)
    white_box, transfer = _values(outcome, "adv:"), _values(outcome, "transfer:")
    assert transfer.keys() == white_box.keys()
    assert transfer[("clean", "accuracy")] == white_box[("clean", "accuracy")]
    attacked = [k for k in white_box if k[0] != "clean" and k[1] == "accuracy"]
    assert [transfer[k] for k in attacked] != [white_box[k] for k in attacked]
    assert outcome.record["transfer_from"] == source.trial_id


def test_attack_draws_are_independent_of_the_corruption_draws(monkeypatch):
    """PGD's random start and the kept samples' dropout masks come from the ``attack`` stream, the common
    corruptions from ``corruption``: changing one stream's seed changes only its own sets.  Catches the
    old behaviour (the attack seeded from the corruption stream)."""
    grid = {**ROBUST, "methods": [{"name": "mc_dropout", "hyperparameters": {"lr": 0.05, "p": 0.3, "n_samples": 4}}]}
    spec = next(s for s in _specs(grid) if s.seed == 0)
    real_seeds = ursa_ray.prepare.trial_seeds

    def run_with(shifted: str | None) -> dict[tuple[str, str], float]:
        def seeds(seed: int) -> dict[str, int]:
            out = real_seeds(seed)
            if shifted is not None:
                out[shifted] = real_seeds(seed + 1000)[shifted]
            return out

        monkeypatch.setattr(ursa_ray.prepare, "trial_seeds", seeds)
        outcome = run_trial(spec)
        return {(m["eval_set"], m["metric"]): m["value"] for m in outcome.metrics if m["eval_set"] != "cost"}

    base, new_attack, new_corruption = run_with(None), run_with("attack"), run_with("corruption")

    def part(values, prefix):
        return {k: v for k, v in values.items() if k[0].startswith(prefix)}

    assert part(new_attack, "corrupt:") == part(base, "corrupt:")
    assert part(new_attack, "adv:pgd") != part(base, "adv:pgd")
    assert part(new_corruption, "adv:") == part(base, "adv:")
    assert part(new_corruption, "corrupt:") != part(base, "corrupt:")
    assert part(new_attack, "test") == part(base, "test")  # the method's own streams are untouched


@pytest.mark.parametrize(
    ("method", "in_turn"),
    [("sgld", False), ("sgld", True), ("hmc", False)],
    ids=["sgld-interleaved", "sgld-chains-in-turn", "hmc"],
)
def test_kept_samples_come_from_every_chain_and_from_the_end_of_sampling(method, in_turn, monkeypatch):
    """With ``n_chains: 4`` the stream holds 4 × S samples; the attacker's M = 8 kept ones are 2 per chain,
    the last of each chain among them, whether the chains are interleaved (batched SG-MCMC, HMC) or run one
    after another (SG-MCMC on a network that cannot be batched).  Chains are told apart by their network
    objects (each chain has its own; the test keeps every one alive).  Catches ``planned_samples`` counting
    S only (kept samples from the first quarter of the stream; chain 0 alone when chains run in turn)."""
    settings = {
        "sgld": {"lr": 0.05, "prior_std": 0.2, "epochs": 3, "burn_in_epochs": 1, "n_samples": 5, "n_chains": 4},
        "hmc": {"step_size": 1.0e-3, "n_leapfrog": 3, "burn_in": 2, "n_samples": 5, "n_chains": 4},
    }[method]
    grid = {
        **ROBUST,
        "methods": [{"name": method, "hyperparameters": settings}],
        "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "attack_samples": 8},
    }
    spec = next(s for s in _specs(grid) if s.seed == 0)
    if in_turn:
        monkeypatch.setattr(ursa_ray.methods.sgmcmc, "can_batch", lambda model, problem: False)
        monkeypatch.setattr(ursa_ray.trial.batched, "can_batch", lambda model, problem: False)
    seen: list[tuple[torch.nn.Module, bool]] = []
    observe = ursa_ray.evaluation.adversarial.ModelAverage.observe

    def recording_observe(self, sample):
        kept = observe(self, sample)
        seen.append((sample, kept))
        return kept

    monkeypatch.setattr(ursa_ray.evaluation.adversarial.ModelAverage, "observe", recording_observe)
    outcome = run_trial(spec)
    assert len(seen) == 20 and outcome.record["n_samples"] == 20
    chains: dict[int, list[bool]] = {}
    for network, kept in seen:
        chains.setdefault(id(network), []).append(kept)
    assert len(chains) == 4  # four chains, each its own network
    for kept in chains.values():
        assert len(kept) == 5 and sum(kept) == 2 and kept[-1], kept  # two of its samples, its last among them
