"""Subspace inference: PCA of the SGD trajectory + elliptical slice sampling (Izmailov, Maddox, Kirichenko,
Garipov, Vetrov & Wilson 2019, "Subspace inference for Bayesian deep learning"; ESS: Murray, Adams &
MacKay 2010).

1. ``epochs`` of SGD burn-in, then ``swa_epochs`` of constant-rate SGD (``swa_lr``) collecting iterates, as
   for SWAG (:func:`ursa_ray.methods.swag.fit_swa`).  θ̄ is the exact mean of all collected iterates.
2. The last K = ``rank`` iterates, centred on θ̄ and divided by √(K − 1), form the K × P matrix D;
   ``torch.linalg.svd`` gives D = U S Vᵀ and the subspace basis is the top-``rank`` rows of S Vᵀ, i.e.
   principal directions scaled by the trajectory's standard deviation along them (as in Izmailov et
   al.'s PCA subspace), so ``subspace_prior_std`` is in units of that spread.  The method's constraints
   ask for at least two collected iterates and at least ``rank`` of them (a smaller subspace would be a
   silent change of the setting).
3. θ(z) = θ̄ + Bᵀ z with prior z ~ N(0, subspace_prior_std² I) and the tempered full-batch likelihood
   exp((1/T) Σ_i log p(y_i | x_i, θ(z))), T = ``likelihood_temperature``: the target is
   N(z; 0, s² I) · p(D | θ(z))^{1/T}, only the log-likelihood divided by T and the prior untempered (as in
   Izmailov et al. and URSABench, which uses T = 5000 for MNIST; the default 1 is the untempered
   posterior restricted to the subspace).  This is not the ``temperature`` of SG-MCMC and HMC, which
   tempers the whole posterior, prior included; the setting was formerly named ``temperature``, and a
   grid still using that name is rejected with a hint.  No weight-decay prior is added in the subspace:
   the Gaussian prior on z is the prior.
4. Elliptical slice sampling in z from z = 0 (the SWA mean): ``ess_burn_in`` steps discarded, then
   ``n_samples`` steps, each yielded as a sample.  Every likelihood evaluation is one forward pass over
   the training set (plus a batch-norm refresh when the network has batch norm); their number is recorded
   as ``stats['likelihood_evals']``.  ``stats['grad_evals']`` counts the SGD steps.

Batched (:mod:`~ursa_ray.methods.batched`): the seeds of a grid cell run step 1 as one computation
(:func:`~ursa_ray.methods.swag.fit_swa_copies`); steps 2–4 run per seed, interleaved, each on its own
generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods._training import SGD_HYPERPARAMETERS
from ursa_ray.methods.base import (
    Constraint,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    StorageCount,
    check_constraints,
    load_flat_parameters,
    n_parameters,
)
from ursa_ray.methods.swag import (
    BN_CHUNK,
    COLLECTS_ITERATES,
    SWA_HYPERPARAMETERS,
    SWAGMoments,
    collected_iterates,
    fit_swa,
    fit_swa_copies,
    moments_memory,
    refresh_batch_norm,
)

MAX_SHRINKS = 200
"""Bracket shrinks after which an ESS step gives up and stays put (the bracket is then ~2π·2⁻²⁰⁰)."""


def elliptical_slice(
    z: Tensor,
    log_likelihood_fn: Callable[[Tensor], float],
    prior_std: float | Tensor,
    generator: torch.Generator,
    log_lik: float | None = None,
) -> tuple[Tensor, float, int]:
    """One elliptical slice sampling step (Murray, Adams & MacKay 2010, Fig. 2) for the target
    N(z; 0, prior_std² I) · exp(log_likelihood_fn(z)).

    Returns ``(z_new, log_lik_new, n_evals)``; ``n_evals`` counts calls of ``log_likelihood_fn`` (the
    current point's is counted when ``log_lik`` is not supplied).  Randomness comes from ``generator``
    (on its own device; z may live elsewhere).  The step never rejects: it returns a point on the
    ellipse through z and an auxiliary prior draw ν whose log-likelihood exceeds the slice level.
    """
    n_evals = 0
    if log_lik is None:
        log_lik = float(log_likelihood_fn(z))
        n_evals += 1
    if not math.isfinite(log_lik):
        raise FloatingPointError(f"log-likelihood at the current point is {log_lik}")
    gdev = generator.device

    def uniform() -> float:
        return float(torch.rand((), generator=generator, dtype=torch.float64, device=gdev))

    nu = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=gdev).to(z.device) * prior_std
    level = log_lik + math.log(1.0 - uniform())  # 1 − U ∈ (0, 1]
    angle = 2 * math.pi * uniform()
    low, high = angle - 2 * math.pi, angle
    for _ in range(MAX_SHRINKS):
        proposal = z * math.cos(angle) + nu * math.sin(angle)
        value = float(log_likelihood_fn(proposal))
        n_evals += 1
        if value > level:  # NaN compares False: shrink past it
            return proposal, value, n_evals
        if angle < 0:
            low = angle
        else:
            high = angle
        angle = low + (high - low) * uniform()
    return z, log_lik, n_evals


def pca_basis(deviations: Tensor, rank: int) -> Tensor:
    """Rows s_j v_jᵀ of the top-``rank`` singular triplets of ``deviations`` (K × P), largest first.

    With ``deviations`` = (θ_i − θ̄)/√(K−1) the rows span the top principal directions, scaled by the
    trajectory's standard deviation along each; BᵀB is the rank-``rank`` approximation of DᵀD.
    """
    if deviations.shape[0] < 1:
        raise ValueError("no deviations to decompose")
    _, singular_values, vh = torch.linalg.svd(deviations, full_matrices=False)
    rank = min(rank, singular_values.numel())
    return singular_values[:rank, None] * vh[:rank]


def load_subspace_point(
    model: nn.Module, problem: Problem, mean: Tensor, basis: Tensor, z: Tensor, chunk: int = BN_CHUNK
) -> None:
    """Load θ̄ + Bᵀz into ``model``, recompute its batch-norm statistics (if any) and set eval mode."""
    theta = mean + z.to(device=basis.device, dtype=basis.dtype) @ basis
    load_flat_parameters(model, theta)
    del theta
    refresh_batch_norm(model, problem, chunk)
    model.eval()


def subspace_log_likelihood(
    model: nn.Module,
    problem: Problem,
    mean: Tensor,
    basis: Tensor,
    likelihood_temperature: float,
    chunk: int = BN_CHUNK,
) -> Callable[[Tensor], float]:
    """z ↦ (1/T) Σ_i log p(y_i | x_i, θ̄ + Bᵀz) over the whole training set (model in eval mode,
    batch-norm statistics recomputed for θ(z) first when the network has batch norm).

    The returned function loads θ(z) into ``model`` as a side effect.
    """

    def log_likelihood(z: Tensor) -> float:
        load_subspace_point(model, problem, mean, basis, z, chunk)
        total = torch.zeros((), dtype=torch.float64, device=problem.x.device)
        with torch.no_grad():
            for i in range(0, problem.n_train, chunk):
                out = model(problem.x[i : i + chunk])
                total += problem.likelihood.log_prob(out, problem.y[i : i + chunk]).sum().to(torch.float64)
        return float(total) / likelihood_temperature

    return log_likelihood


def _two_iterates(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """A PCA of the trajectory needs two iterates (checked when their number is known)."""
    n = collected_iterates(config, n_train)
    if n is None or n >= 2:
        return None
    return (
        "swa_epochs and swa_collect_every must collect at least two iterates (a PCA subspace needs two collected "
        f"iterates); got {n} from swa_epochs={config['swa_epochs']}, swa_collect_every={config['swa_collect_every']}"
    )


def _rank_fits_iterates(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """The subspace has ``rank`` dimensions only if that many iterates are collected."""
    n = collected_iterates(config, n_train)
    if n is None or config["rank"] <= n:
        return None
    return (
        f"rank must be at most the {n} collected iterates (swa_epochs={config['swa_epochs']}, "
        f"swa_collect_every={config['swa_collect_every']}); got rank={config['rank']}"
    )


def subspace_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """The basis B (rank × P) and the mean θ̄ (P) as (rank + 1)·P weights, and the S sample coordinates z
    (S · rank) as other values (the constraints ensure the basis has ``rank`` rows)."""
    rank = config["rank"]
    return StorageCount(weights=(rank + 1) * n_parameters(sample), other_values=n_samples * rank)


class PCAESS(Method):
    name = "pca_ess"
    description = (
        "subspace inference: PCA of SGD iterates (rank-K subspace around the SWA mean), elliptical slice "
        "sampling of the full-batch posterior in the subspace, likelihood tempered by 1/T"
    )
    hyperparameters = (
        SGD_HYPERPARAMETERS
        + SWA_HYPERPARAMETERS
        + (
            Hyperparameter("rank", int, 20, "subspace dimension: PCA of the last `rank` iterates", low=1),
            Hyperparameter(
                "likelihood_temperature",
                float,
                1.0,
                "T dividing only the log-likelihood, the prior untempered: target ∝ N(z; 0, s² I)·p(D | θ(z))^(1/T); "
                "URSABench: 5000 for MNIST",
                low=1e-12,
                formerly=("temperature",),
            ),
            Hyperparameter(
                "subspace_prior_std", float, 2.0, "std of the N(0, s² I) prior on subspace coordinates", low=1e-12
            ),
            Hyperparameter("ess_burn_in", int, 0, "ESS steps discarded before the first sample", low=0),
            Hyperparameter("n_samples", int, 30, "ESS steps kept, one sample each", low=1),
        )
    )
    # The number of collected iterates is not monotone in swa_collect_every (0 collects once per epoch) but is
    # smallest at an end of any range of it, so checking a search space's corners still suffices.
    constraints = (
        COLLECTS_ITERATES,
        Constraint(
            ("swa_epochs", "swa_collect_every", "batch_size"),
            "at least two collected iterates: swa_epochs ≥ 2 (swa_collect_every = 0), else "
            "⌊swa_epochs · ⌈N / batch_size⌉ / swa_collect_every⌋ ≥ 2",
            _two_iterates,
        ),
        Constraint(
            ("rank", "swa_epochs", "swa_collect_every", "batch_size"),
            "rank ≤ collected iterates: swa_epochs (swa_collect_every = 0), else "
            "⌊swa_epochs · ⌈N / batch_size⌉ / swa_collect_every⌋",
            _rank_fits_iterates,
        ),
    )
    posterior_storage = staticmethod(subspace_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        check_constraints(self, config, problem.n_train)
        model, moments = fit_swa(problem, config, stats, max(config["rank"], 2), "final")
        yield from subspace_samples(model, moments, problem, config, stats)

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """A copy's network and its trajectory (moments and ``rank`` iterates)."""
        return 1 + moments_memory(max(config["rank"], 2))

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's SWA trajectory as one batched computation (:func:`fit_swa_copies`), then each
        problem's elliptical slice sampler on its own, one step of each per item."""
        check_constraints(self, config, problems[0].n_train)
        models, moments = fit_swa_copies(problems, config, stats, max(config["rank"], 2), "final")
        streams = [
            subspace_samples(*one)
            for one in zip(models, moments, problems, [config] * len(problems), stats, strict=True)
        ]
        del moments  # each stream keeps its basis and mean only
        for samples in zip(*streams, strict=True):
            yield list(samples)


def subspace_samples(
    model: nn.Module, moments: SWAGMoments, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
) -> Iterator[nn.Module]:
    """The rank-K PCA subspace of the collected iterates around their mean, then ``ess_burn_in`` +
    ``n_samples`` elliptical slice steps from the SWA mean (z = 0), each kept step loaded into ``model``."""
    rank = config["rank"]
    dtype = next(model.parameters()).dtype
    deviations = moments.deviation_matrix()  # a fresh K × P tensor (iterates − θ̄)
    deviations /= math.sqrt(moments.n_stored - 1)
    basis = pca_basis(deviations, rank)
    del deviations
    mean = moments.mean.to(dtype)
    del moments  # frees the iterate buffer and the float64 moments, once the caller drops its reference
    stats["subspace_rank"] = basis.shape[0]

    log_likelihood = subspace_log_likelihood(model, problem, mean, basis, config["likelihood_temperature"])
    evaluated: list[Tensor | None] = [None]

    def tracked(z: Tensor) -> float:
        evaluated[0] = z
        return log_likelihood(z)

    z = torch.zeros(basis.shape[0], dtype=torch.float64)  # start at the SWA mean
    log_lik = tracked(z)
    stats["likelihood_evals"] = 1
    for step in range(config["ess_burn_in"] + config["n_samples"]):
        z, log_lik, n_evals = elliptical_slice(
            z, tracked, config["subspace_prior_std"], problem.generator, log_lik=log_lik
        )
        stats["likelihood_evals"] += n_evals
        if step < config["ess_burn_in"]:
            continue
        if evaluated[0] is not z:  # the model holds the last point evaluated, not the accepted one
            load_subspace_point(model, problem, mean, basis, z)
        stats["n_samples"] = step - config["ess_burn_in"] + 1
        yield model


METHODS = (PCAESS(),)
