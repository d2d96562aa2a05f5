"""Online accumulation of the posterior predictive, one posterior sample at a time.

Each accumulator holds a fixed set of float64 running sums whose size depends only on the number of
examples (and classes), never on the number of samples S, so a method may stream as many samples as it
likes.  Every property returns a fresh ``numpy.ndarray`` of dtype float64 on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _entropy(probs: Tensor) -> Tensor:
    """−Σ_k p_k log p_k over the last dimension (``torch.special.entr``: 0·log 0 = 0)."""
    return torch.special.entr(probs).sum(dim=-1)


class _OnlineAccumulator:
    """Counts the posterior samples an accumulator has seen; properties need at least one."""

    _n_samples: int = 0

    @property
    def n_samples(self) -> int:
        """Number of posterior samples accumulated so far (S)."""
        return self._n_samples

    def _require_samples(self) -> None:
        if self._n_samples == 0:
            raise RuntimeError("no posterior samples accumulated yet")


class ClassificationPredictive(_OnlineAccumulator):
    """Running posterior predictive of a K-class classifier on n fixed examples.

    With per-sample class probabilities p_s = softmax(logits_s), s = 1..S:

    * ``mean_probs``        p̄ = (1/S) Σ_s p_s                                (n×K)
    * ``total_entropy``     H[p̄] = −Σ_k p̄_k log p̄_k                          (n)
    * ``expected_entropy``  (1/S) Σ_s H[p_s], H[p_s] = −Σ_k p_sk log p_sk      (n)
    * ``mutual_information`` max(H[p̄] − (1/S) Σ_s H[p_s], 0)  (knowledge / epistemic uncertainty)

    Entropies use natural logarithms, 0·log 0 = 0.  Both entropies come from one float64 routine,
    :func:`_entropy`, applied to float64 probabilities; with S = 1, p̄ is p_1 bit for bit, so H[p̄] and
    (1/S) Σ_s H[p_s] are the same number and the mutual information is exactly 0 (a single-sample method
    carries no knowledge uncertainty, and its mutual-information AUROCs are exactly 0.5: all scores tie).

    **Distilled expectations.**  A single network may carry its own estimate of the expected entropy
    (GPED, :mod:`ursa_ray.methods.distillation`: a head distilled from a Monte Carlo teacher).  It is
    handed over per sample as ``update(logits, expected_entropy=...)`` and replaces H[p_s] in the running
    sum, so ``expected_entropy`` and ``mutual_information`` mean the same as for a sampler (with S = 1:
    MI = max(H[p_1] − the distilled estimate, 0)).  Without it (every other method) nothing changes, and
    the S = 1 mutual information stays exactly 0.  The trial passes it for any predictor that has a
    ``distilled_expected_entropy(x)`` method (docs/extending.md).
    """

    def __init__(self, n_examples: int, n_classes: int, device: torch.device | str = "cpu") -> None:
        if n_examples < 1 or n_classes < 2:
            raise ValueError(f"need n_examples >= 1 and n_classes >= 2, got {n_examples}, {n_classes}")
        self.n_examples = n_examples
        self.n_classes = n_classes
        self.device = torch.device(device)
        self._n_samples = 0
        self._prob_sum = torch.zeros(n_examples, n_classes, dtype=torch.float64, device=self.device)
        self._entropy_sum = torch.zeros(n_examples, dtype=torch.float64, device=self.device)

    def update(self, logits: Tensor, expected_entropy: Tensor | None = None) -> None:
        """Add one posterior sample's logits (n×K, any floating dtype) to the running sums.

        ``expected_entropy`` (shape n, non-negative), when given, is the sample's own estimate of the
        expected entropy (a distilled head, see the class docstring) and is summed in place of H[p_s].
        """
        if logits.shape != (self.n_examples, self.n_classes):
            raise ValueError(f"expected logits of shape {(self.n_examples, self.n_classes)}, got {tuple(logits.shape)}")
        if expected_entropy is not None and expected_entropy.shape != (self.n_examples,):
            raise ValueError(
                f"expected expected_entropy of shape ({self.n_examples},), got {tuple(expected_entropy.shape)}"
            )
        with torch.no_grad():
            p = torch.softmax(logits.detach().to(self.device, torch.float64), dim=-1)
            if expected_entropy is None:
                self._entropy_sum += _entropy(p)
            else:
                self._entropy_sum += expected_entropy.detach().to(self.device, torch.float64).clamp_min(0.0)
            self._prob_sum += p
        self._n_samples += 1

    @property
    def mean_probs(self) -> np.ndarray:
        """p̄ = (1/S) Σ_s softmax(logits_s), shape n×K, float64."""
        self._require_samples()
        return (self._prob_sum / self._n_samples).cpu().numpy()

    @property
    def total_entropy(self) -> np.ndarray:
        """H[p̄] = −Σ_k p̄_k log p̄_k per example, shape n, float64."""
        self._require_samples()
        return _entropy(self._prob_sum / self._n_samples).cpu().numpy()

    @property
    def expected_entropy(self) -> np.ndarray:
        """(1/S) Σ_s H[p_s] per example, shape n, float64."""
        self._require_samples()
        return (self._entropy_sum / self._n_samples).cpu().numpy()

    @property
    def mutual_information(self) -> np.ndarray:
        """max(H[p̄] − (1/S) Σ_s H[p_s], 0) per example, shape n, float64.

        Non-negative in exact arithmetic (entropy is concave); the clip removes rounding noise, and it is
        exactly 0 for S = 1 (see the class docstring).
        """
        return np.clip(self.total_entropy - self.expected_entropy, 0.0, None)


class RegressionPredictive(_OnlineAccumulator):
    """Running mean and spread of per-sample predicted means f_s(x) on n fixed examples (Welford).

    After S samples, with δ = f_S − mean_{S−1}:
    ``mean_S = mean_{S−1} + δ / S`` and ``M2_S = M2_{S−1} + δ (f_S − mean_S)``;
    ``mean`` = mean_S and ``std`` = √(M2_S / (S − 1)), the sample (divide-by-(S − 1)) standard deviation
    across samples, i.e. the epistemic spread; 0 when S = 1 (one sample carries no spread).

    The S − 1 divisor makes the *variance* unbiased: if the f_s are independent draws with variance v,
    E[std²] = v.  (std itself stays slightly below √v, by Jensen, e.g. by 6% for S = 5; the divide-by-S
    estimator would shrink it by a further factor √((S − 1)/S) = 0.894 and a correct spread's 95%
    coverage to about 92%.)
    """

    def __init__(self, n_examples: int, device: torch.device | str = "cpu") -> None:
        if n_examples < 1:
            raise ValueError(f"need n_examples >= 1, got {n_examples}")
        self.n_examples = n_examples
        self.device = torch.device(device)
        self._n_samples = 0
        self._mean = torch.zeros(n_examples, dtype=torch.float64, device=self.device)
        self._m2 = torch.zeros(n_examples, dtype=torch.float64, device=self.device)

    def update(self, outputs: Tensor) -> None:
        """Add one posterior sample's predicted means, shape (n,) or (n, 1)."""
        if outputs.shape not in ((self.n_examples,), (self.n_examples, 1)):
            raise ValueError(
                f"expected outputs of shape ({self.n_examples},) or ({self.n_examples}, 1), got {tuple(outputs.shape)}"
            )
        with torch.no_grad():
            f = outputs.detach().reshape(-1).to(self.device, torch.float64)
            self._n_samples += 1
            delta = f - self._mean
            self._mean += delta / self._n_samples
            self._m2 += delta * (f - self._mean)

    @property
    def mean(self) -> np.ndarray:
        """(1/S) Σ_s f_s per example, shape n, float64."""
        self._require_samples()
        return self._mean.cpu().numpy().copy()

    @property
    def std(self) -> np.ndarray:
        """√((1/(S − 1)) Σ_s (f_s − mean)²) per example (0 when S = 1), shape n, float64."""
        self._require_samples()
        if self._n_samples == 1:
            return np.zeros(self.n_examples)
        return torch.sqrt(self._m2.clamp_min(0.0) / (self._n_samples - 1)).cpu().numpy()
