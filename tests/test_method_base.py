"""The method base class (ursa_ray.methods.base.Method): its defaults, and each built-in's declared sample plan
against the stream it yields."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ursa_ray import methods
from ursa_ray.grid import parse_grid
from ursa_ray.methods.base import (
    Categorical,
    EarlierProtocolMethod,
    Gaussian,
    Hyperparameter,
    Method,
    Problem,
    SamplePlan,
    StorageCount,
    as_method,
    n_parameters,
    resolve_config,
)
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import run_trial


class _Smallest(Method):
    name = "smallest"
    description = "one network, declared with nothing but the required attributes"
    hyperparameters = (Hyperparameter("n_samples", int, 3, "copies of the network", low=1),)

    def sample_posterior(self, problem, config, stats):
        model = problem.make_model()
        for _ in range(config["n_samples"]):
            yield model


def _problem(task: str = "classification", n: int = 40) -> Problem:
    """A tiny problem: ``n`` random inputs in R⁴, 3 classes (or a Gaussian target), a 4-8-K MLP."""
    data = torch.Generator().manual_seed(7)
    x = torch.randn(n, 4, generator=data)
    classification = task == "classification"
    y = torch.randint(0, 3, (n,), generator=data) if classification else torch.randn(n, generator=data)
    n_outputs = 3 if classification else 1
    torch.manual_seed(0)
    return Problem(
        x=x,
        y=y,
        likelihood=Categorical() if classification else Gaussian(0.5),
        make_model=lambda: build_mlp((4,), n_outputs, [8]),
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )


def test_a_subclass_inherits_every_default():
    method = _Smallest()
    problem = _problem()
    model = problem.make_model()
    assert method.constraints == () and method.tasks is None
    assert not method.batchable and not method.chains_in_turn_when_unbatchable
    assert method.sample_plan({"n_samples": 3}, problem) == SamplePlan(3, 1)
    assert method.sample_plan({}, problem) == SamplePlan(1, 1)
    assert method.batched_copies({"n_samples": 3}, model) == 1
    assert method.posterior_storage(model, {}, 3) == StorageCount(weights=3 * n_parameters(model))
    assert method.warm_up(torch.device("cpu")) is None
    assert method.sample_posterior_batched is None  # no batched stream: declared, not a stub that raises
    assert as_method(method) is method


def test_a_subclass_without_a_sample_stream_is_refused_when_made():
    """sample_posterior is the one abstract method: a subclass that forgets it fails at construction, naming it
    (fails if the base class gives it a default)."""

    class NoStream(Method):
        name, description, hyperparameters = "no_stream", "forgets its stream", ()

    with pytest.raises(TypeError, match="sample_posterior"):
        NoStream()


def test_batchable_is_declared_by_overriding_the_batched_stream():
    """Catches ``hasattr(method, "sample_posterior_batched")`` as the test: every subclass has the attribute."""
    assert methods.get_method("sgd").batchable and methods.get_method("swag").batchable
    assert not methods.get_method("sngp").batchable and hasattr(methods.get_method("sngp"), "sample_posterior_batched")


def test_a_method_without_a_batched_stream_gets_one_seed_per_trial():
    """Grid.vectorized_seeds asks ``batchable``; catches the hasattr probe it used (8 seeds a trial for sngp, whose
    base-class sample_posterior_batched raises)."""
    grid = parse_grid(
        {
            "name": "g",
            "methods": ["sngp", "sgd"],
            "models": [{"name": "mlp", "options": {"widths": [8]}}],
            "datasets": ["digits"],
            "seeds": [0, 1],
        },
        "g.yaml",
    )
    sngp, sgd = grid.methods
    assert grid.vectorized_seeds(sngp, "mlp") == 1 and grid.vectorized_seeds(sgd, "mlp") > 1


def test_an_object_of_the_earlier_protocol_is_adapted_with_the_defaults():
    class Earlier:
        name, description, hyperparameters = "earlier", "no base class, no constraints", ()

        def sample_posterior(self, problem, config, stats):
            yield problem.make_model()

    adapted = as_method(Earlier())
    assert isinstance(adapted, EarlierProtocolMethod) and adapted.name == "earlier"
    assert adapted.constraints == () and adapted.tasks is None and not adapted.batchable
    assert adapted.sample_plan({"n_samples": 4, "n_chains": 2}, _problem()) == SamplePlan(4, 2)
    assert len(list(adapted.sample_posterior(_problem(), {}, {}))) == 1


CYCLES = {"n_cycles": 3, "epochs_per_cycle": 2, "exploration": 0.5, "batch_size": 16}  # 3 steps an epoch

# Each built-in on a tiny problem: the settings that keep it fast, and the plan (S, C) its configuration says.
PLANS: list[tuple[str, str, dict[str, Any], tuple[int, int]]] = [
    ("sgd", "classification", {"epochs": 1}, (1, 1)),
    ("swa", "classification", {"epochs": 1, "swa_epochs": 2}, (1, 1)),
    ("swag", "classification", {"epochs": 1, "swa_epochs": 3, "rank": 2, "n_samples": 4}, (4, 1)),
    ("pca_ess", "classification", {"epochs": 1, "swa_epochs": 3, "rank": 2, "n_samples": 4}, (4, 1)),
    ("deep_ensemble", "classification", {"epochs": 1, "n_samples": 3}, (3, 1)),
    ("mc_dropout", "classification", {"epochs": 1, "n_samples": 4}, (4, 1)),
    ("concrete_dropout", "classification", {"epochs": 1, "n_samples": 4}, (4, 1)),
    ("variational_dropout", "classification", {"epochs": 1, "n_samples": 4}, (4, 1)),
    ("mfvi", "classification", {"epochs": 1, "n_samples": 4}, (4, 1)),
    ("laplace", "classification", {"epochs": 1, "marglik_steps": 2, "n_samples": 4}, (4, 1)),
    (
        "sgld",
        "classification",
        {"epochs": 3, "burn_in_epochs": 1, "batch_size": 16, "n_samples": 2, "n_chains": 2},
        (2, 2),
    ),
    ("sghmc", "classification", {"epochs": 3, "burn_in_epochs": 1, "batch_size": 16, "n_samples": 3}, (3, 1)),
    ("csgld", "classification", {**CYCLES, "samples_per_cycle": 2}, (6, 1)),
    ("csghmc", "classification", {**CYCLES, "samples_per_cycle": 3}, (9, 1)),
    ("hmc", "classification", {"n_leapfrog": 2, "burn_in": 2, "n_samples": 3, "n_chains": 2}, (3, 2)),
    ("bdk", "classification", {"epochs": 3, "burn_in_epochs": 1}, (1, 1)),
    ("gped", "classification", {"epochs": 3, "burn_in_epochs": 1}, (1, 1)),
    ("sngp", "classification", {"epochs": 1, "n_features": 16, "n_samples": 4}, (1, 1)),  # mean field: one
    ("sngp", "classification", {"epochs": 1, "n_features": 16, "predictive": "sampled", "n_samples": 4}, (4, 1)),
    ("sngp", "regression", {"epochs": 1, "n_features": 16, "n_samples": 4}, (4, 1)),
]


@pytest.mark.parametrize(
    ("name", "task", "settings", "plan"), PLANS, ids=[f"{p[0]}-{p[1]}-{p[3][0]}x{p[3][1]}" for p in PLANS]
)
def test_each_built_in_declares_the_sample_plan_of_its_stream(name, task, settings, plan):
    """The declared plan is what the configuration says, and the stream yields exactly its C·S samples (which
    samples the adversarial model average keeps is computed from it)."""
    method = methods.get_method(name)
    config = resolve_config(method, settings)
    problem = _problem(task)
    declared = method.sample_plan(config, problem)
    assert (declared.per_chain, declared.n_chains) == plan
    assert sum(1 for _ in method.sample_posterior(problem, config, {})) == declared.total


def test_sngp_mean_field_is_attacked_through_its_one_sample():
    """SNGP's mean-field stream yields one sample whatever ``n_samples`` says; the attacker keeps it.  Catches
    the plan guessed from ``n_samples`` (20 planned, M = 4 kept at positions 4, 9, 14, 19 of a one-sample
    stream: nothing kept, and no ``adv:`` rows at all)."""
    grid = {
        "name": "sngp_attack",
        "methods": [{"name": "sngp", "hyperparameters": {"epochs": 1, "n_features": 16, "n_samples": 20}}],
        "models": [{"name": "mlp", "options": {"widths": [16]}}],
        "datasets": ["digits"],
        "seeds": [0],
        "save_predictions": False,
        "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "attack_samples": 4, "transfer": False},
    }
    (spec,) = parse_grid(grid, "g.yaml").trial_specs()
    outcome = run_trial(spec)
    attacked = {m["eval_set"] for m in outcome.metrics if m["eval_set"].startswith("adv:")}
    assert outcome.record["n_samples"] == 1 and attacked, attacked
