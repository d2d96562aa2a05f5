"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell 2017).

M = ``n_samples`` members, each a fresh ``problem.make_model()`` (its own random initialisation), each
trained by SGD on the mean negative log-likelihood and yielded as soon as it is trained, so only one
member is alive at a time.  The predictive is the average of the members' predictives.

Options (the variants of the deep-regression benchmark):

- ``bootstrap``: each member trains on its own bootstrap resample of the training set (N indices drawn
  with replacement from ``problem.generator``) — "EnsBS".
- ``adversarial_epsilon`` = ε > 0: fast-gradient-sign adversarial training — "EnsAdvA".  Each step
  computes x' = x + δ ⊙ sign(∇ₓ ℓ(x)) with δ = ε · (per-feature standard deviation of the training
  inputs) and minimises ½ ℓ(x) + ½ ℓ(x') (Goodfellow et al.'s α = ½; Lakshminarayanan et al. sum the two,
  which is the same up to a factor 2 in the learning rate).  Such a step counts 3 gradient evaluations
  (the input gradient on x, then the parameter gradient through x and x').
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods import _training
from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import Hyperparameter, Likelihood, Predictor, Problem, sample_networks_storage


def bootstrap_problem(problem: Problem) -> Problem:
    """``problem`` with its training set replaced by N examples drawn with replacement."""
    index = torch.randint(problem.n_train, (problem.n_train,), generator=problem.generator, device="cpu")
    index = index.to(problem.x.device)
    return dataclasses.replace(problem, x=problem.x[index], y=problem.y[index])


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


class DeepEnsemble:
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
    constraints = ()  # no rule between its hyperparameters beyond their own ranges
    posterior_storage = staticmethod(sample_networks_storage)  # the M = S members

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        epsilon = config["adversarial_epsilon"]
        step = input_step_size(problem.x, epsilon) if epsilon > 0 else None
        for m in range(config["n_samples"]):
            model = problem.make_model()
            member_problem = bootstrap_problem(problem) if config["bootstrap"] else problem
            if step is None:
                train_sgd(model, member_problem, config, stats)
            else:
                train_adversarial(model, member_problem, config, stats, step)
            del member_problem
            model.eval()
            stats["n_samples"] = m + 1
            yield model
            del model  # before the next member is built: one member alive at a time


METHODS = (DeepEnsemble(),)
