"""Deep ensembles: independent members, bootstrap resamples, FGSM adversarial training, seeding."""

from __future__ import annotations

import itertools
import weakref

import pytest
import torch
from torch import nn

from ursa_ray.methods import ensemble, get_method
from ursa_ray.methods.base import Gaussian, Problem, flat_parameters, resolve_config
from ursa_ray.models.mlp import build_mlp

X_TEST = torch.linspace(-3, 3, 25).unsqueeze(1).repeat(1, 3)


def regression_problem(seed: int = 0, n: int = 64) -> Problem:
    """A trial-like problem: torch's global RNG seeded with ``seed`` (model initialisations) and the
    problem's generator seeded with it (shuffling, bootstrap)."""
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 3, generator=data) * torch.tensor([1.0, 2.0, 0.5])
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.3 * torch.randn(n, generator=data)
    torch.manual_seed(seed)
    return Problem(
        x=x,
        y=y,
        likelihood=Gaussian(0.3),
        make_model=lambda: build_mlp((3,), 1, [16]),
        generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )


SMALL = {"epochs": 4, "batch_size": 16, "lr": 0.01, "n_samples": 3}


def run(seed: int = 0, **overrides) -> tuple[list[torch.Tensor], list[torch.Tensor], dict]:
    config = resolve_config(get_method("deep_ensemble"), {**SMALL, **overrides})
    stats: dict[str, float] = {}
    params, preds = [], []
    for predictor in get_method("deep_ensemble").sample_posterior(regression_problem(seed), config, stats):
        assert not predictor.training
        params.append(flat_parameters(predictor))
        with torch.no_grad():
            preds.append(predictor(X_TEST).squeeze(1))
    return params, preds, stats


@pytest.fixture
def spy_training(monkeypatch):
    """Record each member's initial weights and training inputs (training itself still runs), whether the
    members train batched (small networks) or one after another."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    real_sgd, real_adv = ensemble.train_sgd, ensemble.train_adversarial
    real_stack, real_from_problems = ensemble.StackedNetworks, ensemble.CopyData.from_problems
    data: list[tuple[torch.Tensor, torch.Tensor]] = []

    def from_problems(problems, generators, rows):
        for problem, index in zip(problems, rows):
            index = torch.arange(problem.n_train) if index is None else index
            data.append((problem.x[index], problem.y[index]))
        return real_from_problems(problems, generators, rows)

    def stack(models):
        seen.extend((flat_parameters(m), x, y) for m, (x, y) in zip(models, data))
        data.clear()
        return real_stack(models)

    monkeypatch.setattr(ensemble, "StackedNetworks", stack)
    monkeypatch.setattr(ensemble.CopyData, "from_problems", staticmethod(from_problems))

    def sgd(model, problem, config, stats, *args, **kwargs):
        seen.append((flat_parameters(model), problem.x, problem.y))
        return real_sgd(model, problem, config, stats, *args, **kwargs)

    def adv(model, problem, config, stats, step):
        seen.append((flat_parameters(model), problem.x, problem.y))
        return real_adv(model, problem, config, stats, step)

    monkeypatch.setattr(ensemble, "train_sgd", sgd)
    monkeypatch.setattr(ensemble, "train_adversarial", adv)
    return seen


def test_registered_and_n_samples_is_member_count():
    method = get_method("deep_ensemble")
    names = {h.name for h in method.hyperparameters}
    assert {"n_samples", "epochs", "batch_size", "bootstrap", "adversarial_epsilon"} <= names
    config = resolve_config(method, {"n_samples": 2})
    assert config["n_samples"] == 2 and config["bootstrap"] is False and config["adversarial_epsilon"] == 0.0
    with pytest.raises(ValueError):
        resolve_config(method, {"adversarial_epsilon": -0.1})


def test_members_start_from_different_weights_and_differ(spy_training):
    params, preds, stats = run()
    assert len(params) == 3 and stats["n_samples"] == 3
    assert stats["grad_evals"] == 3 * SMALL["epochs"] * 4
    initial = [p for p, _, _ in spy_training]
    for a, b in itertools.combinations(range(3), 2):
        assert not torch.equal(initial[a], initial[b])
        assert not torch.allclose(preds[a], preds[b], atol=1e-3)
    # without bootstrap every member sees the full training set
    problem = regression_problem()
    assert all(torch.equal(x, problem.x) and torch.equal(y, problem.y) for _, x, y in spy_training)
    spread = torch.stack(preds).std(0)
    assert (spread > 1e-3).all() and spread.mean() > 0.01


def test_one_member_alive_at_a_time_when_members_do_not_batch():
    """A network that cannot be batched (here: batch norm) trains one member after another."""
    problem = regression_problem()
    problem.make_model = lambda: nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    built: list[weakref.ref] = []
    alive_when_building: list[int] = []
    make_model = problem.make_model

    def tracked_make_model():
        alive_when_building.append(sum(ref() is not None for ref in built))
        model = make_model()
        built.append(weakref.ref(model))
        return model

    problem.make_model = tracked_make_model
    config = resolve_config(get_method("deep_ensemble"), SMALL)
    for predictor in get_method("deep_ensemble").sample_posterior(problem, config, {}):
        del predictor
    # the previous member is released before the next one is built
    assert alive_when_building == [0, 0, 0]


def test_bootstrap_resamples_differ_per_member(spy_training):
    _, preds, _ = run(bootstrap=True)
    problem = regression_problem()
    rows = {tuple(r.tolist()) for r in problem.x}
    resamples = [x for _, x, _ in spy_training]
    assert len(resamples) == 3
    for x, (_, _, y) in zip(resamples, spy_training):
        assert x.shape == problem.x.shape
        assert all(tuple(r.tolist()) in rows for r in x)  # drawn from the training set ...
        assert len({tuple(r.tolist()) for r in x}) < problem.n_train  # ... with replacement
        index = [next(i for i in range(problem.n_train) if torch.equal(problem.x[i], r)) for r in x]
        assert torch.equal(y, problem.y[index])  # targets follow their inputs
    for a, b in itertools.combinations(resamples, 2):
        assert not torch.equal(a, b)
    _, plain, _ = run(bootstrap=False)
    assert not torch.allclose(torch.stack(preds), torch.stack(plain))


def test_fgsm_step_is_epsilon_std_times_gradient_sign():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    xb = torch.randn(8, 3)
    yb = torch.randn(8)
    step = ensemble.input_step_size(regression_problem().x, 0.1)
    torch.testing.assert_close(step, 0.1 * regression_problem().x.std(0))
    likelihood = Gaussian(0.3)
    loss, x_adv = ensemble.fgsm(model, likelihood, xb, yb, step)
    # for a linear model with Gaussian noise: ∂ℓ/∂x_i ∝ (f(x_i) − y_i) w
    with torch.no_grad():
        residual = model(xb).squeeze(1) - yb
    expected = xb + step * torch.sign(residual[:, None] * model.weight)
    torch.testing.assert_close(x_adv, expected)
    assert loss.item() == pytest.approx(-likelihood.log_prob(model(xb), yb).mean().item())
    with torch.no_grad():  # the perturbation increases the loss
        assert -likelihood.log_prob(model(x_adv), yb).mean() > loss


def test_adversarial_training_runs_and_changes_the_result(spy_training):
    params_adv, preds_adv, stats = run(adversarial_epsilon=0.2)
    params_plain, _, _ = run(adversarial_epsilon=0.0)
    assert len(params_adv) == 3
    assert stats["grad_evals"] == 3 * (3 * SMALL["epochs"] * 4)  # three backward passes per step
    # same seeds ⇒ same initial weights and shuffles; only the loss differs
    torch.testing.assert_close(spy_training[0][0], spy_training[3][0])
    for a, b in zip(params_adv, params_plain):
        assert not torch.allclose(a, b)
    assert torch.stack(preds_adv).std(0).mean() > 0.01


def test_trial_seeds_give_different_initialisations():
    problem = regression_problem()

    def init(seed):
        torch.manual_seed(seed)
        return flat_parameters(problem.make_model())

    assert torch.equal(init(0), init(0))
    assert not torch.equal(init(0), init(1))
    # whole runs: same seed reproduces the ensemble exactly, a new seed gives new members
    same_a, _, _ = run(seed=3)
    same_b, _, _ = run(seed=3)
    other, _, _ = run(seed=4)
    assert all(torch.equal(a, b) for a, b in zip(same_a, same_b))
    assert not any(torch.allclose(a, b) for a, b in zip(same_a, other))


@pytest.mark.parametrize("epsilon", [0.0, 0.2])
def test_nan_loss_raises(epsilon):
    with pytest.raises(FloatingPointError):
        run(lr=1e6, adversarial_epsilon=epsilon, n_samples=1)
