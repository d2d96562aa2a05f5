"""The anchor model: exact Bayesian linear regression in the true features under the flat prior.

For y = G(x)ᵀγ + ε, ε ~ N(0, σ²) with σ known and π(γ) ∝ 1, the posterior of γ is N(γ̂, σ² V) with
V = (G Gᵀ)⁻¹ and γ̂ = V G y, where G = (G(x_1), …, G(x_N)) ∈ R^{p×N}.  At test inputs x* the prediction
G(x*)ᵀγ is N(G(x*)ᵀγ̂, σ² G(x*)ᵀ V G(x*)).  The flat prior is probability matching, so the 95% credible
interval mean ± 1.96·std is also an exact 95% confidence interval under repeated noise draws.

Numerics: with the thin QR factorisation Φ = QR of the N × p design matrix Φ = Gᵀ, GGᵀ = RᵀR, so
γ̂ = R⁻¹Qᵀy and G*ᵀVG* = ‖R⁻ᵀ g*‖²; both need only triangular solves, never an explicit inverse.
All arithmetic is float64.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _as_float64(a: Tensor | np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(a.detach().cpu() if isinstance(a, Tensor) else a), dtype=torch.float64)


def anchor_predictive(
    train_features: Tensor | np.ndarray,
    train_y: Tensor | np.ndarray,
    test_features: Tensor | np.ndarray,
    noise_std: float,
    rcond: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean G*ᵀγ̂ and epistemic std σ·√(G*ᵀVG*) at each test point (float64 arrays of length M).

    ``train_features`` is N × p (row i = G(x_i)), ``test_features`` M × p.  Raises ValueError when the
    design is rank deficient (the flat-prior posterior is then improper): a diagonal entry of R below
    ``rcond`` (default N·eps) times the largest one.
    """
    phi = _as_float64(train_features)
    y = _as_float64(train_y).reshape(-1)
    phi_star = _as_float64(test_features)
    if phi.ndim != 2 or phi_star.ndim != 2 or phi.shape[1] != phi_star.shape[1]:
        raise ValueError(f"features must be N×p and M×p, got {tuple(phi.shape)} and {tuple(phi_star.shape)}")
    n, p = phi.shape
    if y.shape[0] != n:
        raise ValueError(f"{n} feature rows but {y.shape[0]} targets")
    if n < p:
        raise ValueError(f"the anchor needs at least p = {p} training points, got {n}")
    if noise_std <= 0:
        raise ValueError(f"noise_std must be positive, got {noise_std}")
    # Column scaling leaves the predictive unchanged and keeps R's diagonal comparable across features.
    scale = phi.norm(dim=0).clamp_min(torch.finfo(torch.float64).tiny)
    q, r = torch.linalg.qr(phi / scale, mode="reduced")
    diag = r.diagonal().abs()
    tol = (rcond if rcond is not None else n * torch.finfo(torch.float64).eps) * diag.max()
    if bool((diag <= tol).any()):
        raise ValueError("the training design G(x) is rank deficient; the flat-prior anchor is undefined")
    coef = torch.linalg.solve_triangular(r, (q.T @ y).unsqueeze(1), upper=True).squeeze(1)  # scaled γ̂
    mean = (phi_star / scale) @ coef
    z = torch.linalg.solve_triangular(r.T, (phi_star / scale).T, upper=False)  # R⁻ᵀ g*, p × M
    std = noise_std * z.norm(dim=0)
    return mean.numpy(), std.numpy()


def anchor_for_dataset(dataset) -> tuple[np.ndarray, np.ndarray]:
    """The anchor's (mean, std) at ``dataset.test_x``, using ``dataset.feature_map`` on float64 inputs."""
    if dataset.feature_map is None or dataset.noise_std is None:
        raise ValueError(f"{dataset.name} has no feature map or noise level, so it has no anchor")
    g = dataset.feature_map
    return anchor_predictive(
        g(dataset.train_x.to(torch.float64)),
        dataset.train_y,
        g(dataset.test_x.to(torch.float64)),
        dataset.noise_std,
    )
