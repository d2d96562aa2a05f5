"""Mini-batch optimisation shared by the optimisation-based methods: SGD on the mean negative
log-likelihood (SGD, MC dropout, ensembles, SWAG's pre-training) and Adam on it plus a method's
regulariser (concrete and variational dropout); and the training precision every training loop uses.

Mixed precision (``Problem.training_precision`` = ``torch.bfloat16``, the grid's ``precision:
bf16-mixed``): the forward pass of the network body runs under bfloat16 autocast (:func:`autocast_body`),
so matrix products and convolutions compute in bfloat16 from float32 parameters cast on the fly.  The
parameters stay float32 (the master weights), so do their gradients (autocast's casts are differentiable,
the gradient of a float32 leaf is float32), the optimiser's and samplers' state (momentum, velocity,
SWAG moments) and the injected Langevin noise; the output layer
(:func:`~ursa_ray.evaluation.precision.keep_output_layer_float32`, applied where the trial builds the
model) and the loss compute in float32.  Injected noise must land on float32 weights: bfloat16 has 8
significant bits, so a weight near 1 moves in steps of 2⁻⁷ ≈ 0.008 and noise of scale √(2ηT) ~ 10⁻⁴
would round away (``tests/test_mixed_training.py``).  Micikevicius et al. (2018), "Mixed precision
training", with bfloat16 (no loss scaling needed: its exponent range is float32's).
"""

from __future__ import annotations

import contextlib
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


PRECISIONS = ("bf16-mixed", "float32")
"""The training precisions a grid may name (``precision``)."""


def default_precision(device: torch.device, task: str) -> str:
    """bf16-mixed for classification on a GPU (its bfloat16 tensor cores); float32 on the CPU and for
    regression, whose uncertainties are compared with the exact anchor at a few per cent (the rule of
    :func:`~ursa_ray.evaluation.precision.evaluation_precision`)."""
    return "bf16-mixed" if device.type == "cuda" and task == "classification" else "float32"


def autocast_dtype(precision: str) -> torch.dtype | None:
    """``Problem.training_precision`` for a precision name of :data:`PRECISIONS`: bfloat16 or None (float32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return torch.bfloat16 if precision == "bf16-mixed" else None


def autocast_body(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    """The region of a training step's forward pass: autocast to ``dtype`` on ``device``'s type, or nothing
    when ``dtype`` is None (float32).  Enter it around the network's forward pass and the loss, not the
    backward pass or the parameter update::

        with autocast_body(problem.device, problem.training_precision):
            loss = problem.likelihood.nll(model(xb).float(), yb)
        loss.backward()
    """
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def optimiser_options(device: torch.device) -> dict[str, Any]:
    """Keyword arguments for ``torch.optim.SGD`` / ``Adam`` on ``device``: the fused CUDA kernel (one launch
    for every parameter's update) on a GPU; torch's default (for-each) implementation elsewhere."""
    return {"fused": True} if device.type == "cuda" else {}


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
    precision: torch.dtype | None = None,
) -> tuple[int, Tensor]:
    """``epochs`` epochs of ``optimiser`` steps on ``loss_at(x_batch, y_batch, progress)`` over the mini-batches
    ``minibatches(batch_size)`` of one epoch of ``n_train`` examples, progress ∈ [0, 1) the share of steps
    done.  The cosine schedule anneals lr_t = lr · (1 + cos(π t / T)) / 2 over the T steps of the run.
    Returns (steps taken, the last loss); raises FloatingPointError at the end of an epoch whose last loss
    is not finite.  The caller puts its network(s) in training mode.  ``zero_grad`` clears the gradients
    before each backward pass (default: ``optimiser.zero_grad(set_to_none=True)``).  ``precision``: the
    autocast dtype of ``loss_at`` (:func:`autocast_body`; None: float32)."""
    total = epochs * math.ceil(n_train / config["batch_size"])
    step = 0
    for epoch in range(epochs):
        for xb, yb in minibatches(config["batch_size"]):
            if config["schedule"] == "cosine":
                for group in optimiser.param_groups:
                    group["lr"] = config["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            with autocast_body(xb.device, precision):
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
    adversarial term, counting ``grad_evals_per_step`` gradient evaluations per step).  Steps run in
    ``problem.training_precision`` (:func:`autocast_body`), the update with the fused kernel on a GPU.
    """
    optimiser = torch.optim.SGD(
        model.parameters(),
        lr=config["lr"],
        momentum=config["momentum"],
        weight_decay=config["weight_decay"],
        **optimiser_options(problem.device),
    )
    if loss_fn is None:

        def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return problem.likelihood.nll(model(xb).float(), yb)
    else:

        def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return loss_fn(model, xb, yb).float()

    model.train()
    epochs = config["epochs"] if epochs is None else epochs
    steps, _ = minimise(
        problem.minibatches, problem.n_train, config, optimiser, epochs, loss_at, precision=problem.training_precision
    )
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
    warm-up schedules.  ``stats`` gets ``grad_evals`` and ``final_loss``.  Steps run in
    ``problem.training_precision`` (:func:`autocast_body`; the regulariser added in float32), the update
    with the fused kernel on a GPU.
    """
    optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"], **optimiser_options(problem.device))

    def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
        return problem.likelihood.nll(model(xb).float(), yb) + regulariser(progress).float()

    model.train()
    steps, loss = minimise(
        problem.minibatches,
        problem.n_train,
        config,
        optimiser,
        config["epochs"],
        loss_at,
        precision=problem.training_precision,
    )
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + steps
    stats["final_loss"] = float(loss)
    return model


def replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    """Set the submodule at dotted path ``name`` of ``root`` to ``new``."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
