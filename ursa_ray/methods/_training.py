"""Plain mini-batch SGD on the mean negative log-likelihood, shared by the optimisation-based methods."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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


def check_finite(loss: torch.Tensor, epoch: int) -> None:
    """Raise FloatingPointError when the training loss is NaN or infinite."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss became {loss.item()} in epoch {epoch}")


Loss = Callable[[nn.Module, Tensor, Tensor], Tensor]


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
    adversarial term, counting ``grad_evals_per_step`` gradient evaluations per step).  The cosine
    schedule anneals lr_t = lr · (1 + cos(π t / T)) / 2 over the T steps of the run.
    """
    epochs = config["epochs"] if epochs is None else epochs
    optimiser = torch.optim.SGD(
        model.parameters(), lr=config["lr"], momentum=config["momentum"], weight_decay=config["weight_decay"]
    )
    steps_per_epoch = math.ceil(problem.n_train / config["batch_size"])
    total = epochs * steps_per_epoch
    step = 0
    model.train()
    for epoch in range(epochs):
        for xb, yb in problem.minibatches(config["batch_size"]):
            if config["schedule"] == "cosine":
                for group in optimiser.param_groups:
                    group["lr"] = config["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            if loss_fn is None:
                loss = -problem.likelihood.log_prob(model(xb), yb).mean()
            else:
                loss = loss_fn(model, xb, yb)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            step += 1
        check_finite(loss.detach(), epoch)
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + grad_evals_per_step * step
    return model
