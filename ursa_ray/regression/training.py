"""Adam training on −mean log-likelihood + a method's regulariser (per training example), shared by the
variational dropout methods (concrete dropout, variational dropout)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter, Problem

ADAM_HYPERPARAMETERS = (
    Hyperparameter("lr", float, 3e-3, "Adam learning rate", low=0.0),
    Hyperparameter("epochs", int, 200, "training epochs", low=1),
    Hyperparameter("batch_size", int, 64, "mini-batch size", low=1),
    Hyperparameter("schedule", str, "cosine", "learning-rate schedule", choices=("constant", "cosine")),
)


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
    warm-up schedules.  The cosine schedule anneals lr_t = lr (1 + cos(π t/T)) / 2.
    """
    optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"])
    steps_per_epoch = math.ceil(problem.n_train / config["batch_size"])
    total = config["epochs"] * steps_per_epoch
    step = 0
    model.train()
    for epoch in range(config["epochs"]):
        for xb, yb in problem.minibatches(config["batch_size"]):
            if config["schedule"] == "cosine":
                for group in optimiser.param_groups:
                    group["lr"] = config["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            nll = -problem.likelihood.log_prob(model(xb), yb).mean()
            loss = nll + regulariser(step / total)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            step += 1
        if not torch.isfinite(loss.detach()):
            raise FloatingPointError(f"training loss became {loss.item()} in epoch {epoch}")
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + step
    stats["final_loss"] = float(loss.detach())
    return model


def replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    """Set the submodule at dotted path ``name`` of ``root`` to ``new``."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
