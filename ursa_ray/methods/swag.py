"""SWA and SWAG (Maddox, Izmailov, Garipov, Vetrov & Wilson 2019, "A simple baseline for Bayesian
uncertainty in deep learning").

Training: ``epochs`` epochs of SGD burn-in (:func:`train_sgd`, with its schedule), then ``swa_epochs``
epochs of SGD at the constant learning rate ``swa_lr``, collecting the flattened weights θ_i once per
epoch (``swa_collect_every = 0``) or every ``swa_collect_every`` optimiser steps.  From the n collected
iterates we keep

- the exact running first and second moments θ̄ = (1/n) Σ θ_i and θ²̄ = (1/n) Σ θ_i² (float64, updated as
  θ̄_n = θ̄_{n−1} + (θ_n − θ̄_{n−1})/n, so θ̄ is the plain average of the iterates: no sum/(n+1) bias);
- the deviation matrix D (K × P, K = ``rank``): the deviations θ_i − θ̄_i of the last K iterates from the
  running mean at the time they were collected (a ring buffer; nothing else is stored per iterate).

SWAG draws θ ~ N(θ̄, scale · Σ) (a fresh draw per sample; nothing is kept per draw), with Maddox et al.'s
covariance Σ = ½(Σ_diag + Σ_low-rank), Σ_diag = diag σ², Σ_low-rank = DᵀD/(K' − 1)::

    θ = θ̄ + √(scale/2) · ( σ ⊙ z₁ + Dᵀ z₂ / √(K' − 1) ),   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K')
    σ² = clamp(θ²̄ − θ̄², min = min_var),                  K' = number of stored deviations

With fewer than two stored deviations (``rank`` < 2, or a single iterate) there is no low-rank estimate
and SWAG is SWAG-diagonal, Σ = Σ_diag: θ = θ̄ + √scale · σ ⊙ z₁ (the ½ averages two estimates of the
covariance; with one it would halve the variance).  ``scale`` = 1 (the default) is the paper's
posterior; other values scale its covariance.  Maddox et al. divide by the buffer size K even before it
is full; we divide by the number actually stored.

Networks with batch normalisation get their running statistics recomputed for each draw (and for the SWA
mean), one forward pass over the training inputs in fixed order without augmentation
(:func:`refresh_batch_norm`); networks without batch norm skip it.

Methods: ``swag`` (``n_samples`` draws) and ``swa`` (the SWA mean θ̄ as the single sample).

Batched (:mod:`~ursa_ray.methods.batched`): the seeds of a grid cell run the burn-in and the collection
phase as one computation (:func:`fit_swa_copies`), each copy collecting into its own moments; the draws
then come from each seed's own generator, in the order one seed alone would draw them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, autocast_body, check_finite, optimiser_options, train_sgd
from ursa_ray.methods.base import (
    Constraint,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    StorageCount,
    check_constraints,
    flat_parameters,
    load_flat_parameters,
    n_parameters,
    one_network_storage,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, batched_nll, train_sgd_copies

BN_CHUNK = 1024
"""Inputs per forward pass when recomputing batch-norm statistics or full-batch log-likelihoods."""

SWA_HYPERPARAMETERS = (
    Hyperparameter("swa_epochs", int, 20, "epochs of constant-rate SGD during which iterates are collected", low=1),
    Hyperparameter("swa_lr", float, 0.01, "constant learning rate of the collection phase", low=0.0),
    Hyperparameter(
        "swa_collect_every", int, 0, "collect an iterate every k optimiser steps; 0 = once per epoch", low=0
    ),
)


def collection_steps(config: Mapping[str, Any], n_train: int) -> int:
    """Optimiser steps of the collection phase: swa_epochs · ⌈n_train / batch_size⌉."""
    return config["swa_epochs"] * math.ceil(n_train / config["batch_size"])


def collected_iterates(config: Mapping[str, Any], n_train: int | None) -> int | None:
    """Iterates the collection phase collects: ``swa_epochs`` (once per epoch), or one every
    ``swa_collect_every`` of its steps; None when that depends on an unknown ``n_train``."""
    every = config["swa_collect_every"]
    if not every:
        return config["swa_epochs"]
    return None if n_train is None else collection_steps(config, n_train) // every


def _collect_every_fits(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """An iterate every k steps collects something (checked when ``n_train`` is known)."""
    every = config["swa_collect_every"]
    if not every or n_train is None or every <= collection_steps(config, n_train):
        return None
    return (
        f"swa_collect_every must be 0 or at most the {collection_steps(config, n_train)} steps of the collection "
        f"phase (swa_epochs × {math.ceil(n_train / config['batch_size'])} steps per epoch of {n_train} examples at "
        f"batch_size {config['batch_size']}); got swa_collect_every={every}: nothing collected"
    )


COLLECTS_ITERATES = Constraint(
    ("swa_collect_every", "swa_epochs", "batch_size"),
    "swa_collect_every = 0 or swa_collect_every ≤ swa_epochs · ⌈N / batch_size⌉ (N training examples)",
    _collect_every_fits,
)
"""The collection phase collects at least one iterate (SWA, SWAG, and subspace inference)."""

RANK = Hyperparameter("rank", int, 20, "K: number of most recent deviations kept (rank of the low-rank part)", low=0)


# ----------------------------------------------------------------------------------------------------
# Batch normalisation
# ----------------------------------------------------------------------------------------------------


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def refresh_batch_norm(model: nn.Module, problem: Problem, chunk: int = BN_CHUNK) -> bool:
    """Recompute every batch-norm layer's running mean and variance for the current weights.

    One pass over ``problem.x`` in fixed order (no augmentation, no shuffling: deterministic) with
    cumulative averaging (:func:`torch.optim.swa_utils.update_bn`).  Returns False, and does nothing,
    when the model has no batch-norm layer.  The model's train/eval mode is left as it was.
    """
    if not has_batch_norm(model):
        return False
    batches = ((problem.x[i : i + chunk],) for i in range(0, problem.n_train, chunk))
    torch.optim.swa_utils.update_bn(batches, model)
    return True


# ----------------------------------------------------------------------------------------------------
# Moments
# ----------------------------------------------------------------------------------------------------


class SWAGMoments:
    """Running first/second moments of collected weight vectors and a ring buffer of the last K rows.

    ``centre="running"`` (SWAG) stores θ_i − θ̄_i, the deviation from the running mean just after θ_i
    was added (Maddox et al.).  ``centre="final"`` stores the raw iterates θ_i and
    :meth:`deviation_matrix` centres them on the final mean θ̄ (the PCA of the trajectory used by
    subspace inference).  Moments are float64; the buffer has the parameters' dtype.
    """

    def __init__(
        self,
        n_params: int,
        max_rank: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        centre: str = "running",
    ) -> None:
        if centre not in ("running", "final"):
            raise ValueError(f"centre must be 'running' or 'final', got {centre!r}")
        self.n_params = n_params
        self.max_rank = max_rank
        self.centre = centre
        self.n = 0
        self.mean = torch.zeros(n_params, dtype=torch.float64, device=device)
        self.sq_mean = torch.zeros(n_params, dtype=torch.float64, device=device)
        self._buffer = torch.empty(max_rank, n_params, dtype=dtype, device=device)
        self.n_stored = 0
        self._next_row = 0

    def collect(self, theta: Tensor) -> None:
        """Add one weight vector: exact running means, then the newest buffer row."""
        if theta.shape != (self.n_params,):
            raise ValueError(f"expected a vector of {self.n_params} parameters, got shape {tuple(theta.shape)}")
        t = theta.detach().to(device=self.mean.device, dtype=torch.float64)
        if not torch.isfinite(t).all():
            raise FloatingPointError("a collected SWA iterate is not finite")
        self.n += 1
        self.mean.add_(t - self.mean, alpha=1.0 / self.n)
        self.sq_mean.add_(t * t - self.sq_mean, alpha=1.0 / self.n)
        if self.max_rank > 0:
            row = t - self.mean if self.centre == "running" else t
            self._buffer[self._next_row].copy_(row)
            self._next_row = (self._next_row + 1) % self.max_rank
            self.n_stored = min(self.n_stored + 1, self.max_rank)

    def variance(self, min_var: float = 1e-30) -> Tensor:
        """σ² = clamp(θ²̄ − θ̄², min_var), float64."""
        return torch.clamp(self.sq_mean - self.mean**2, min=min_var)

    def deviation_matrix(self) -> Tensor:
        """The K' × P matrix D of stored deviations (row order is that of the ring buffer, irrelevant)."""
        rows = self._buffer[: self.n_stored]
        if self.centre == "final":
            return rows - self.mean.to(rows.dtype)
        return rows

    @property
    def has_low_rank(self) -> bool:
        """Whether Σ_low-rank = DᵀD/(K'−1) exists: running deviations (SWAG), at least two stored."""
        return self.centre == "running" and self.n_stored >= 2

    def _estimate_weight(self) -> float:
        """½ when Σ = ½(Σ_diag + Σ_low-rank), 1 for SWAG-diagonal (Σ = Σ_diag)."""
        return 0.5 if self.has_low_rank else 1.0

    def covariance_diagonal(self, scale: float = 1.0, min_var: float = 1e-30) -> Tensor:
        """diag of the SWAG covariance scale · Σ (Σ = ½(diag σ² + DᵀD/(K'−1)), or diag σ² without a
        low-rank part), float64."""
        diag = self.variance(min_var)
        if self.has_low_rank:
            d = self.deviation_matrix().to(torch.float64)
            diag = diag + (d**2).sum(0) / (self.n_stored - 1)
        return scale * self._estimate_weight() * diag

    def covariance(self, scale: float = 1.0, min_var: float = 1e-30) -> Tensor:
        """The full P × P SWAG covariance scale · Σ (for tests on small P only)."""
        cov = torch.diag(self.variance(min_var))
        if self.has_low_rank:
            d = self.deviation_matrix().to(torch.float64)
            cov = cov + d.T @ d / (self.n_stored - 1)
        return scale * self._estimate_weight() * cov

    def sample(self, generator: torch.Generator, scale: float = 1.0, min_var: float = 1e-30) -> Tensor:
        """One draw from N(θ̄, scale · Σ), in the buffer's dtype on the moments' device:
        θ̄ + √(scale/2) (σ ⊙ z₁ + Dᵀz₂/√(K'−1)), or θ̄ + √scale · σ ⊙ z₁ without a low-rank part.

        The normal variates come from ``generator`` (on its own device) and are moved over.
        """
        if self.n == 0:
            raise RuntimeError("no iterates collected")
        gdev = generator.device
        z1 = torch.randn(self.n_params, generator=generator, dtype=torch.float64, device=gdev)
        noise = self.variance(min_var).sqrt() * z1.to(self.mean.device)
        if self.has_low_rank:
            z2 = torch.randn(self.n_stored, generator=generator, dtype=torch.float64, device=gdev)
            d = self.deviation_matrix()
            low_rank = z2.to(device=d.device, dtype=d.dtype) @ d
            noise += low_rank.to(torch.float64) / math.sqrt(self.n_stored - 1)
        return (self.mean + math.sqrt(scale * self._estimate_weight()) * noise).to(self._buffer.dtype)


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------


def collect_iterates(
    model: nn.Module,
    problem: Problem,
    config: Mapping[str, Any],
    stats: dict[str, float],
    collect: Callable[[Tensor], None],
) -> int:
    """``swa_epochs`` epochs of SGD at the constant rate ``swa_lr`` (momentum and weight decay as in
    ``config``), calling ``collect(flat weights)`` once per epoch or every ``swa_collect_every`` steps.

    Returns the number of iterates collected; adds the optimiser steps to ``stats['grad_evals']``.
    ValueError, before any step, when ``swa_collect_every`` exceeds the phase's steps
    (:data:`COLLECTS_ITERATES`).  Steps run in ``problem.training_precision`` (the collected weights are
    the float32 master weights), the update with the fused kernel on a GPU.
    """
    COLLECTS_ITERATES.check(config, problem.n_train)
    optimiser = torch.optim.SGD(
        model.parameters(),
        lr=config["swa_lr"],
        momentum=config["momentum"],
        weight_decay=config["weight_decay"],
        **optimiser_options(problem.device),
    )

    def loss_at(xb: Tensor, yb: Tensor) -> Tensor:
        with autocast_body(problem.device, problem.training_precision):
            return problem.likelihood.nll(model(xb).float(), yb)

    model.train()
    steps, collected = collection_phase(
        problem.minibatches,
        loss_at,
        optimiser,
        lambda: optimiser.zero_grad(set_to_none=True),
        config,
        lambda: collect(flat_parameters(model)),
    )
    stats["grad_evals"] = stats.get("grad_evals", 0.0) + steps
    return collected


def collection_phase(
    minibatches: Callable[[int], Iterator[tuple[Tensor, Tensor]]],
    loss_at: Callable[[Tensor, Tensor], Tensor],
    optimiser: torch.optim.Optimizer,
    zero_grad: Callable[[], None],
    config: Mapping[str, Any],
    collect: Callable[[], None],
) -> tuple[int, int]:
    """The loop of the collection phase, for one network or batched copies: ``swa_epochs`` epochs of
    ``optimiser`` steps on ``loss_at(x_batch, y_batch)``, calling ``collect()`` once per epoch or every
    ``swa_collect_every`` steps.  Returns (steps, iterates collected); FloatingPointError on a non-finite
    loss at a collection or an epoch's end."""
    every = config["swa_collect_every"]
    step = collected = 0
    for epoch in range(config["swa_epochs"]):
        for xb, yb in minibatches(config["batch_size"]):
            loss = loss_at(xb, yb)
            zero_grad()
            loss.backward()
            optimiser.step()
            step += 1
            if every and step % every == 0:
                check_finite(loss.detach(), epoch)
                collect()
                collected += 1
        check_finite(loss.detach(), epoch)
        if not every:
            collect()
            collected += 1
    return step, collected


def fit_swa(
    problem: Problem,
    config: Mapping[str, Any],
    stats: dict[str, float],
    max_rank: int,
    centre: str = "running",
    on_collect: Callable[[Tensor], None] | None = None,
) -> tuple[nn.Module, SWAGMoments]:
    """A fresh model, SGD burn-in for ``config['epochs']``, then the collection phase.

    Returns the model (holding the last iterate) and the moments.  ``on_collect`` (tests) sees every
    collected vector too.
    """
    model = problem.make_model()
    train_sgd(model, problem, config, stats)
    reference = flat_parameters(model)
    moments = SWAGMoments(reference.numel(), max_rank, reference.device, reference.dtype, centre)
    del reference

    def collect(theta: Tensor) -> None:
        moments.collect(theta)
        if on_collect is not None:
            on_collect(theta)

    collect_iterates(model, problem, config, stats, collect)
    stats["swa_iterates"] = moments.n
    return model, moments


def fit_swa_copies(
    problems: Sequence[Problem],
    config: Mapping[str, Any],
    stats: Sequence[dict[str, float]],
    max_rank: int,
    centre: str = "running",
) -> tuple[list[nn.Module], list[SWAGMoments]]:
    """:func:`fit_swa` for every problem at once: the SGD burn-in (:func:`train_sgd_copies`) and the
    collection phase (SGD at ``swa_lr`` on the sum of the copies' losses, exact per copy since SGD is
    elementwise) run as one batched computation; each copy's iterates go to its own moments.  Each copy
    draws its mini-batches from its problem's generator, as :func:`fit_swa` does.  Returns the copies'
    networks (each holding its last iterate) and moments."""
    for problem in problems:
        COLLECTS_ITERATES.check(config, problem.n_train)
    stacked = StackedNetworks([problem.make_model() for problem in problems])
    data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
    steps = train_sgd_copies(stacked, data, problems[0].likelihood, config)
    theta = stacked.theta
    moments = [SWAGMoments(theta.shape[1], max_rank, theta.device, theta.dtype, centre) for _ in problems]

    def collect() -> None:
        for c, one in enumerate(moments):
            one.collect(theta[c].detach())

    optimiser = torch.optim.SGD(
        [theta], lr=config["swa_lr"], momentum=config["momentum"], weight_decay=config["weight_decay"], fused=True
    )
    nll = batched_nll(problems[0].likelihood)
    device, precision = problems[0].device, problems[0].training_precision

    def loss_at(xb: Tensor, yb: Tensor) -> Tensor:
        with autocast_body(device, precision):
            return nll(stacked(xb).float(), yb).sum()

    stacked.train()
    step, _ = collection_phase(data.minibatches, loss_at, optimiser, stacked.zero_grad, config, collect)
    stacked.train(False)
    for one, copy_moments in zip(stats, moments, strict=True):
        one["grad_evals"] = one.get("grad_evals", 0.0) + steps + step
        one["swa_iterates"] = copy_moments.n
    return stacked.models, moments


def moments_memory(max_rank: int) -> int:
    """What the moments of one copy take, in units of :func:`~ursa_ray.methods.batched.max_copies`'s
    network (4 float32 values per parameter): two float64 vectors and ``max_rank`` rows, ⌈(4 + K)/4⌉."""
    return math.ceil((4 + max_rank) / 4)


# ----------------------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------------------


def swag_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """The Gaussian, whatever S: θ̄, σ² and K' deviations, (2 + K')·P weights.

    K' = min(``rank``, iterates collected), or ``rank`` where the count of iterates depends on the unknown
    training-set size (``swa_collect_every`` > 0: an upper bound); K' = 0 below two (SWAG-diagonal draws
    use θ̄ and σ² alone).
    """
    collected = collected_iterates(config, None)
    deviations = config["rank"] if collected is None else min(config["rank"], collected)
    return StorageCount(weights=(2 + (deviations if deviations >= 2 else 0)) * n_parameters(sample))


class SWAG(Method):
    name = "swag"
    description = (
        "SWAG: SGD burn-in, constant-rate SGD iterates → Gaussian N(θ̄, scale·½(diag σ² + DᵀD/(K−1))), "
        "SWAG-diagonal N(θ̄, scale·diag σ²) when rank < 2; one fresh draw per sample, batch norm refreshed "
        "per draw"
    )
    hyperparameters = (
        SGD_HYPERPARAMETERS
        + SWA_HYPERPARAMETERS
        + (
            RANK,
            Hyperparameter(
                "scale",
                float,
                1.0,
                "multiplier of the SWAG covariance Σ = ½(Σ_diag + Σ_low-rank), or Σ = Σ_diag (SWAG-diagonal) "
                "when rank < 2; 1 is Maddox et al.'s posterior",
                low=0.0,
            ),
            Hyperparameter("min_var", float, 1e-30, "floor of the diagonal variance θ²̄ − θ̄²", low=0.0),
            Hyperparameter("n_samples", int, 30, "SWAG draws", low=1),
        )
    )
    constraints = (COLLECTS_ITERATES,)
    posterior_storage = staticmethod(swag_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        check_constraints(self, config, problem.n_train)
        model, moments = fit_swa(problem, config, stats, config["rank"], "running")
        model.eval()
        for s in range(config["n_samples"]):
            theta = moments.sample(problem.generator, config["scale"], config["min_var"])
            load_flat_parameters(model, theta)
            del theta
            refresh_batch_norm(model, problem)
            stats["n_samples"] = s + 1
            yield model

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """A copy's network and its moments (θ̄, θ²̄ and ``rank`` deviations)."""
        return 1 + moments_memory(config["rank"])

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's SWAG fit as one batched computation (:func:`fit_swa_copies`); the s-th item holds
        each problem's s-th draw, from its own generator."""
        check_constraints(self, config, problems[0].n_train)
        models, moments = fit_swa_copies(problems, config, stats, config["rank"], "running")
        for s in range(config["n_samples"]):
            for model, copy_moments, problem, one in zip(models, moments, problems, stats, strict=True):
                load_flat_parameters(model, copy_moments.sample(problem.generator, config["scale"], config["min_var"]))
                one["n_samples"] = s + 1
            yield models


class SWA(Method):
    name = "swa"
    description = "SWA: the average θ̄ of constant-rate SGD iterates as a single sample (batch norm refreshed)"
    hyperparameters = SGD_HYPERPARAMETERS + SWA_HYPERPARAMETERS
    constraints = (COLLECTS_ITERATES,)
    posterior_storage = staticmethod(one_network_storage)  # the mean θ̄

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        check_constraints(self, config, problem.n_train)
        model, moments = fit_swa(problem, config, stats, 0, "running")
        load_flat_parameters(model, moments.mean.to(next(model.parameters()).dtype))
        refresh_batch_norm(model, problem)
        model.eval()
        stats["n_samples"] = 1
        yield model

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """A copy's network and its running means."""
        return 1 + moments_memory(0)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's SWA run as one batched computation (:func:`fit_swa_copies`); one item, each
        problem's mean θ̄."""
        check_constraints(self, config, problems[0].n_train)
        models, moments = fit_swa_copies(problems, config, stats, 0, "running")
        for model, copy_moments, one in zip(models, moments, stats, strict=True):
            load_flat_parameters(model, copy_moments.mean.to(next(model.parameters()).dtype))
            one["n_samples"] = 1
        yield models


METHODS = (SWAG(), SWA())
