"""Fidelity of an approximate posterior predictive to a reference posterior predictive.

The reference is a long multi-chain full-batch HMC run (Izmailov, Vikram, Hoffman & Wilson 2021, "What
are Bayesian neural network posteriors really like?"; the NeurIPS 2021 approximate-inference competition
scored entries the same way).  With p_i the reference's and q_i the method's predictive distribution on
example i = 1..n (classification, K classes):

* ``agreement``        (1/n) Σ_i 1[argmax_k p_ik = argmax_k q_ik]   (top-1 agreement; ties go to the first class)
* ``total_variation``  (1/n) Σ_i ½ Σ_k |p_ik − q_ik|
* ``kl``               (1/n) Σ_i Σ_k p_ik log(p_ik / max(q_ik, ε)), with 0·log 0 = 0, ε = :data:`KL_EPSILON`

KL(reference ‖ method) is infinite where the method gives probability 0 to a class the reference does not;
floating-point softmax reaches 0 for logits far apart, so q is clipped below at ε = 1e-12 (a cost of at most
log(1/ε) ≈ 27.6 nats per such class, weighted by p_ik).

Regression (the predictive of the noise-free output, Gaussian per point): the 2-Wasserstein distance
W₂(N(m₁, s₁²), N(m₂, s₂²)) = √((m₁ − m₂)² + (s₁ − s₂)²) per point (closed form for 1-d Gaussians),
averaged over points (``w2``).

**Noise floor.**  The reference itself is a Monte Carlo estimate: the same metrics between the predictives
of the first ⌊C/2⌋ of its C chains and of the other chains (:func:`noise_floor`) say how close two runs of
the reference are, so what "close" means for a method.

**Convergence.**  ``convergence`` computes, with ArviZ, the rank-normalised split-R̂ and the bulk effective
sample size (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021) of each per-example predictive
probability (each example and class: one scalar quantity with a (chain, draw) array) and reports the
largest R̂ (``rhat_max``) and the smallest ESS (``ess_bulk_min``) over them -- the worst case, not a
quantile.  The reference is ``converged`` when ``rhat_max ≤ RHAT_MAX`` (1.1, Gelman et al.'s classic
threshold; Vehtari et al. recommend 1.01 for final results) and ``ess_bulk_min ≥ ESS_MIN`` (100: Vehtari
et al.'s 100 per chain for four chains, applied to the total as the lenient end).  Quantities constant
across every draw (a saturated class) have no R̂ and are skipped.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import rel_entr

KL_EPSILON = 1e-12
"""Lower clip of the method's probabilities in KL(reference ‖ method)."""

RHAT_MAX = 1.1
"""Default: a reference is converged only when its largest split-R̂ is at most this."""

ESS_MIN = 100.0
"""Default: a reference is converged only when its smallest bulk ESS is at least this."""


def _check(reference: np.ndarray, method: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as C-ordered float64 arrays: numpy's sums round by memory layout, and a table read back from
    Parquet is column-ordered where a trial's accumulator is row-ordered; one layout makes the metrics
    recomputed from saved tables equal the trial's to the last bit."""
    p, q = np.ascontiguousarray(reference, dtype=np.float64), np.ascontiguousarray(method, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 2:
        raise ValueError(f"need two (n, K) arrays of the same shape, got {p.shape} and {q.shape}")
    return p, q


def agreement(reference: np.ndarray, method: np.ndarray) -> float:
    """Top-1 agreement (1/n) Σ_i 1[argmax p_i = argmax q_i] of two (n, K) probability arrays."""
    p, q = _check(reference, method)
    return float(np.mean(p.argmax(1) == q.argmax(1)))


def total_variation(reference: np.ndarray, method: np.ndarray) -> float:
    """Mean total variation (1/n) Σ_i ½ ‖p_i − q_i‖₁ of two (n, K) probability arrays."""
    p, q = _check(reference, method)
    return float(np.mean(0.5 * np.abs(p - q).sum(1)))


def kl_divergence(reference: np.ndarray, method: np.ndarray, epsilon: float = KL_EPSILON) -> float:
    """Mean KL(p_i ‖ q_i) = (1/n) Σ_i Σ_k p_ik log(p_ik / max(q_ik, ε)) (``scipy.special.rel_entr``:
    0·log 0 = 0) from the reference p to the method q."""
    p, q = _check(reference, method)
    return float(np.mean(rel_entr(p, np.maximum(q, epsilon)).sum(1)))


def classification_fidelity(reference: np.ndarray, method: np.ndarray) -> dict[str, float]:
    """``agreement``, ``total_variation`` and ``kl`` of a method's (n, K) predictive against the reference's."""
    return {
        "agreement": agreement(reference, method),
        "total_variation": total_variation(reference, method),
        "kl": kl_divergence(reference, method),
    }


def wasserstein2_gaussian(mean_1: np.ndarray, std_1: np.ndarray, mean_2: np.ndarray, std_2: np.ndarray) -> np.ndarray:
    """Per point W₂(N(m₁, s₁²), N(m₂, s₂²)) = √((m₁ − m₂)² + (s₁ − s₂)²)."""
    m1, s1, m2, s2 = (np.asarray(a, dtype=np.float64) for a in (mean_1, std_1, mean_2, std_2))
    return np.sqrt((m1 - m2) ** 2 + (s1 - s2) ** 2)


def regression_fidelity(
    reference_mean: np.ndarray,
    reference_std: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    in_distribution: np.ndarray | None = None,
) -> dict[str, float]:
    """``w2``: the mean over points of :func:`wasserstein2_gaussian` between the reference's and the method's
    Gaussian predictive of the noise-free output; with ``in_distribution`` (a boolean per point), also
    ``w2_in_distribution`` and ``w2_out_of_distribution``, its means over the points inside and outside the
    training region (each where there are any)."""
    w2 = wasserstein2_gaussian(reference_mean, reference_std, mean, std)
    scores = {"w2": float(np.mean(w2))}
    if in_distribution is not None:
        inside = np.asarray(in_distribution, dtype=bool).reshape(-1)
        for name, chosen in (("w2_in_distribution", inside), ("w2_out_of_distribution", ~inside)):
            if chosen.any():
                scores[name] = float(np.mean(w2[chosen]))
    return scores


def noise_floor(chain_predictives: np.ndarray) -> dict[str, float]:
    """Classification fidelity between the pooled predictive of the first ⌊C/2⌋ chains and that of the rest,
    from per-chain predictives (C, n, K) of equal sample counts (so pooling is the mean over chains)."""
    chains = np.asarray(chain_predictives, dtype=np.float64)
    if chains.ndim != 3 or chains.shape[0] < 2:
        raise ValueError(f"need per-chain predictives (C >= 2, n, K), got shape {chains.shape}")
    half = chains.shape[0] // 2
    return classification_fidelity(chains[:half].mean(0), chains[half:].mean(0))


def regression_noise_floor(chain_means: np.ndarray, chain_vars: np.ndarray) -> dict[str, float]:
    """``w2`` between the two halves of C chains (each half's pooled Gaussian: the mean of its chains' means;
    variance the mean of their variances plus the variance of their means), from per-chain (C, n) predictive
    means and variances of equal sample counts."""
    means, variances = np.asarray(chain_means, np.float64), np.asarray(chain_vars, np.float64)
    if means.ndim != 2 or means.shape[0] < 2:
        raise ValueError(f"need per-chain means (C >= 2, n), got shape {means.shape}")
    half = means.shape[0] // 2

    def pooled(m: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return m.mean(0), np.sqrt(v.mean(0) + m.var(0))

    return regression_fidelity(*pooled(means[:half], variances[:half]), *pooled(means[half:], variances[half:]))


@dataclass(frozen=True)
class Convergence:
    """The worst split-R̂ and bulk ESS over a reference's monitored quantities, and the verdict."""

    rhat_max: float
    ess_bulk_min: float
    converged: bool

    def as_metrics(self) -> dict[str, float]:
        return {"rhat_max": self.rhat_max, "ess_bulk_min": self.ess_bulk_min, "converged": float(self.converged)}


def convergence(draws: np.ndarray, rhat_max: float = RHAT_MAX, ess_min: float = ESS_MIN) -> Convergence:
    """Rank-normalised split-R̂ and bulk ESS (ArviZ) of every quantity of ``draws`` (chain, draw, ...) -- e.g.
    per-example predictive probabilities (chain, draw, example, class) -- and whether the largest R̂ is at most
    ``rhat_max`` and the smallest ESS at least ``ess_min``.  Needs two chains and four draws each; with fewer
    the result is NaN and not converged."""
    values = np.asarray(draws, dtype=np.float64)
    if values.ndim < 2 or values.shape[0] < 2 or values.shape[1] < 4:
        return Convergence(float("nan"), float("nan"), False)
    values = values.reshape(values.shape[0], values.shape[1], -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's refactor notice; a constant quantity's R̂ divides by zero
        import arviz

        dataset = arviz.convert_to_dataset(values)
        rhat = np.asarray(arviz.rhat(dataset, method="rank")["x"].values, dtype=np.float64)
        ess = np.asarray(arviz.ess(dataset, method="bulk")["x"].values, dtype=np.float64)
    rhat, ess = rhat[np.isfinite(rhat)], ess[np.isfinite(ess)]
    worst_rhat = float(rhat.max()) if rhat.size else float("nan")
    worst_ess = float(ess.min()) if ess.size else float("nan")
    ok = bool(np.isfinite(worst_rhat) and worst_rhat <= rhat_max and np.isfinite(worst_ess) and worst_ess >= ess_min)
    return Convergence(worst_rhat, worst_ess, ok)
