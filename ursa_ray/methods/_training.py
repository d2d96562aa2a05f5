"""Mini-batch optimisation shared by the optimisation-based methods: SGD on the mean negative
log-likelihood (SGD, MC dropout, ensembles, SWAG's pre-training) and Adam on it plus a method's
regulariser (concrete and variational dropout)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter, Problem

SGD_HYPERPARAMETERS = (
    Hyperparameter("lr", float, 0.05, "learning rate", low=0.0),
    Hyperparameter("momentum", float, 0.9, "SGD momentum", low=0.0, high=1.0),
    Hyperparameter("weight_decay", float, 3e-4, "L2 penalty (a Gaussian prior of variance 1/(wd N))", low=0.0),
    Hyperparameter("epochs", int, 20, "training epochs", low=1),
    Hyperparameter("batch_size", int, 128, "mini-batch size", low=1),
    Hyperparameter("schedule", str, "constant", "learning-rate schedule", choices=("constant", "cosine")),
)

ADAM_HYPERPARAMETERS = (
    Hyperparameter("lr", float, 3e-3, "Adam learning rate", low=0.0),
    Hyperparameter("epochs", int, 200, "training epochs", low=1),
    Hyperparameter("batch_size", int, 64, "mini-batch size", low=1),
    Hyperparameter("schedule", str, "cosine", "learning-rate schedule", choices=("constant", "cosine")),
)


def check_finite(loss: torch.Tensor, epoch: int) -> None:
    """Raise FloatingPointError when the training loss is NaN or infinite."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss became {loss.item()} in epoch {epoch}")


Loss = Callable[[nn.Module, Tensor, Tensor], Tensor]


def minimise(
    minibatches: Callable[[int], Iterator[tuple[Tensor, Tensor]]],
    n_train: int,
    config: Mapping[str, Any],
    optimiser: torch.optim.Optimizer,
    epochs: int,
    loss_at: Callable[[Tensor, Tensor, float], Tensor],
    zero_grad: Callable[[], None] | None = None,
) -> tuple[int, Tensor]:
    """``epochs`` epochs of ``optimiser`` steps on ``loss_at(x_batch, y_batch, progress)`` over the mini-batches
    ``minibatches(batch_size)`` of one epoch of ``n_train`` examples, progress ∈ [0, 1) the share of steps
    done.  The cosine schedule anneals lr_t = lr · (1 + cos(π t / T)) / 2 over the T steps of the run.
    Returns (steps taken, the last loss); raises FloatingPointError at the end of an epoch whose last loss
    is not finite.  The caller puts its network(s) in training mode.  ``zero_grad`` clears the gradients
    before each backward pass (default: ``optimiser.zero_grad(set_to_none=True)``)."""
    total = epochs * math.ceil(n_train / config["batch_size"])
    step = 0
    for epoch in range(epochs):
        for xb, yb in minibatches(config["batch_size"]):
            if config["schedule"] == "cosine":
                for group in optimiser.param_groups:
                    group["lr"] = config["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            loss = loss_at(xb, yb, step / total)
            if zero_grad is None:
                optimiser.zero_grad(set_to_none=True)
            else:
                zero_grad()
            loss.backward()
            optimiser.step()
            step += 1
        check_finite(loss.detach(), epoch)
    return step, loss.detach()


def train_sgd(
    model: nn.Module,
    problem: Problem,
    config: Mapping[str, Any],
    stats: dict[str, float],
    epochs: int | None = None,
    loss_fn: Loss | None = None,
    grad_evals_per_step: int = 1,
) -> nn.Module:
    """Minimise −mean log p(y|x,θ) + (wd/2)‖θ‖² by SGD with momentum for ``epochs`` epochs.

    ``loss_fn(model, x_batch, y_batch)`` replaces the mean negative log-likelihood when given (e.g. with an
    adversarial term, counting ``grad_evals_per_step`` gradient evaluations per step).
    """
    optimiser = torch.optim.SGD(
        model.parameters(), lr=config["lr"], momentum=config["momentum"], weight_decay=config["weight_decay"]
    )
    if loss_fn is None:
        def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return problem.likelihood.nll(model(xb), yb)
    else:
        def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return loss_fn(model, xb, yb)
    model.train()
    epochs = config["epochs"] if epochs is None else epochs
    steps, _ = minimise(problem.minibatches, problem.n_train, config, optimiser, epochs, loss_at)
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + grad_evals_per_step * steps
    return model


def train_adam(
    model: nn.Module,
    problem: Problem,
    config: Mapping[str, Any],
    stats: dict[str, float],
    regulariser: Callable[[float], Tensor],
) -> nn.Module:
    """Minimise −(1/B) Σ_batch log p(y|x,θ) + regulariser(progress) with Adam.

    ``regulariser(progress)`` is the method's KL term already divided by N (so the objective is the
    negative ELBO per training example); ``progress`` ∈ [0, 1) is the share of training done, for
    warm-up schedules.  ``stats`` gets ``grad_evals`` and ``final_loss``.
    """
    optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"])

    def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
        return problem.likelihood.nll(model(xb), yb) + regulariser(progress)

    model.train()
    steps, loss = minimise(problem.minibatches, problem.n_train, config, optimiser, config["epochs"], loss_at)
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + steps
    stats["final_loss"] = float(loss)
    return model


def replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    """Set the submodule at dotted path ``name`` of ``root`` to ``new``."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
