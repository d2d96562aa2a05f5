"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell 2017).

M = ``n_samples`` members, each a fresh ``problem.make_model()`` (its own random initialisation), each
trained by SGD on the mean negative log-likelihood.  The predictive is the average of the members'
predictives.  Each member draws its bootstrap resample and mini-batch order from its own generator
(:func:`~ursa_ray.methods.batched.copy_generators`).  Small networks
(:func:`~ursa_ray.methods.batched.can_batch`) train all M members as one batched computation; larger ones
train one member after another (the same streams, so each member is what it is batched), each yielded as
soon as it is trained, so only one is alive at a time.

Options (the variants of the deep-regression benchmark):

- ``bootstrap``: each member trains on its own bootstrap resample of the training set (N indices drawn
  with replacement from the member's generator) — "EnsBS".
- ``adversarial_epsilon`` = ε > 0: fast-gradient-sign adversarial training — "EnsAdvA".  Each step
  computes x' = x + δ ⊙ sign(∇ₓ ℓ(x)) with δ = ε · (per-feature standard deviation of the training
  inputs) and minimises ½ ℓ(x) + ½ ℓ(x') (Goodfellow et al.'s α = ½; Lakshminarayanan et al. sum the two,
  which is the same up to a factor 2 in the learning rate).  Such a step counts 3 gradient evaluations
  (the input gradient on x, then the parameter gradient through x and x').
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods import _training
from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import Hyperparameter, Likelihood, Method, Predictor, Problem, sample_networks_storage
from ursa_ray.methods.batched import (
    CopyData,
    StackedNetworks,
    batched_nll,
    can_batch,
    copy_generators,
    train_sgd_copies,
)


def input_step_size(x: Tensor, epsilon: float) -> Tensor:
    """δ = ε · per-feature standard deviation of the inputs (shape ``x.shape[1:]``)."""
    return epsilon * x.std(dim=0)


def fgsm(model: nn.Module, likelihood: Likelihood, xb: Tensor, yb: Tensor, step: Tensor) -> tuple[Tensor, Tensor]:
    """Clean loss ℓ(x) (with its graph kept, for the parameter gradient) and x' = x + δ ⊙ sign(∇ₓ ℓ(x))."""
    x = xb.detach().requires_grad_(True)
    loss = likelihood.nll(model(x), yb)
    (grad_x,) = torch.autograd.grad(loss, x, retain_graph=True)
    return loss, (xb + step * grad_x.sign()).detach()


def train_adversarial(
    model: nn.Module, problem: Problem, config: Mapping[str, Any], stats: dict[str, float], step: Tensor
) -> nn.Module:
    """:func:`train_sgd` (same optimiser and schedule) minimising ½ ℓ(x) + ½ ℓ(x + δ ⊙ sign ∇ₓℓ); a step
    costs three gradient evaluations (the input gradient and the two loss terms)."""

    def adversarial_loss(net: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        clean_loss, x_adv = fgsm(net, problem.likelihood, xb, yb, step)
        return 0.5 * (clean_loss + problem.likelihood.nll(net(x_adv), yb))

    return _training.train_sgd(model, problem, config, stats, loss_fn=adversarial_loss, grad_evals_per_step=3)


class DeepEnsemble(Method):
    name = "deep_ensemble"
    description = (
        "deep ensemble: independently initialised networks trained by SGD, one sample per member "
        "(optional bootstrap resampling and fast-gradient-sign adversarial training)"
    )
    hyperparameters = SGD_HYPERPARAMETERS + (
        Hyperparameter("n_samples", int, 5, "ensemble members M (one sample each)", low=1),
        Hyperparameter("bootstrap", bool, False, "train each member on its own bootstrap resample (EnsBS)"),
        Hyperparameter(
            "adversarial_epsilon",
            float,
            0.0,
            "FGSM step as a fraction of each input feature's std; 0 = no adversarial training (EnsAdvA: > 0)",
            low=0.0,
        ),
    )
    posterior_storage = staticmethod(sample_networks_storage)  # the M = S members
    member_curve = True

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        first = problem.make_model()
        if can_batch(first, problem):
            for members in self._batched([problem], config, [stats], first):
                yield members[0]
            return
        epsilon = config["adversarial_epsilon"]
        step = input_step_size(problem.x, epsilon) if epsilon > 0 else None
        unused = [first]  # built to see whether the network batches: member 0, not kept alive beyond it
        del first
        n = problem.n_train
        for m, generator in enumerate(copy_generators(problem, config["n_samples"])):  # the batched members' streams
            model = unused.pop() if unused else problem.make_model()
            member_problem = dataclasses.replace(problem, generator=generator)
            if config["bootstrap"]:
                index = torch.randint(n, (n,), generator=generator, device="cpu").to(problem.x.device)
                member_problem = dataclasses.replace(member_problem, x=problem.x[index], y=problem.y[index])
            if step is None:
                train_sgd(model, member_problem, config, stats)
            else:
                train_adversarial(model, member_problem, config, stats, step)
            del member_problem
            model.eval()
            stats["n_samples"] = m + 1
            yield model
            del model  # before the next member is built: one member alive at a time

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """Networks trained side by side per seed: the M members."""
        return config["n_samples"]

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's M members as one batched computation; the m-th item holds each problem's m-th member."""
        yield from self._batched(problems, config, stats, None)

    def _batched(
        self,
        problems: Sequence[Problem],
        config: Mapping[str, Any],
        stats: Sequence[dict[str, float]],
        first: nn.Module | None,
    ) -> Iterator[list[Predictor]]:
        n_members = config["n_samples"]
        owners = [k for k in range(len(problems)) for _ in range(n_members)]  # copy -> its problem
        generators = [g for problem in problems for g in copy_generators(problem, n_members)]
        models = [first if (first is not None and c == 0) else problems[k].make_model() for c, k in enumerate(owners)]
        n = problems[0].n_train
        rows = [torch.randint(n, (n,), generator=g, device="cpu") if config["bootstrap"] else None for g in generators]
        data = CopyData.from_problems([problems[k] for k in owners], generators, rows)
        stacked = StackedNetworks(models)
        likelihood = problems[0].likelihood
        epsilon = config["adversarial_epsilon"]
        loss_fn, per_step = None, 1
        if epsilon > 0:
            step = torch.stack([input_step_size(problems[k].x, epsilon) for k in owners]).unsqueeze(1)
            loss_fn, per_step = _adversarial_copies_loss(likelihood, step), 3
        steps = train_sgd_copies(stacked, data, likelihood, config, loss_fn)
        stacked.train(False)
        for one in stats:
            one["grad_evals"] = one.get("grad_evals", 0.0) + per_step * steps * n_members
        for m in range(n_members):
            for one in stats:
                one["n_samples"] = m + 1
            yield [models[k * n_members + m] for k in range(len(problems))]


def _adversarial_copies_loss(
    likelihood: Likelihood, step: Tensor
) -> Callable[[StackedNetworks, Tensor, Tensor], Tensor]:
    """:func:`train_adversarial`'s loss for batched copies: per copy ½ ℓ(x) + ½ ℓ(x + δ ⊙ sign ∇ₓℓ(x)), with
    ``step`` the (C, 1, ...) input step δ of each copy's problem."""
    nll = batched_nll(likelihood)

    def loss(stacked: StackedNetworks, xb: Tensor, yb: Tensor) -> Tensor:
        x = xb.detach().requires_grad_(True)
        clean = nll(stacked(x), yb)
        (grad_x,) = torch.autograd.grad(clean.sum(), x, retain_graph=True)
        x_adv = (xb + step * grad_x.sign()).detach()
        return 0.5 * (clean + nll(stacked(x_adv), yb))

    return loss


METHODS = (DeepEnsemble(),)
