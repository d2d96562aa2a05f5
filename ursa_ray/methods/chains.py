"""Convergence diagnostics of several MCMC chains run side by side (``n_chains`` of SGLD, SGHMC and HMC).

The weights of a neural network are not identifiable (permuting hidden units leaves the function
unchanged), so R̂ on weights says nothing; the chains are compared in function space instead.  Each sample
is summarised by its outputs on a fixed probe set -- the first :data:`N_PROBES` training inputs --
(regression: the predicted mean; classification: the log-probabilities, which a constant shift of the
logits leaves unchanged), and ArviZ computes, for each of those scalar quantities over the (chain, draw)
array, the rank-normalised split-R̂ and the bulk effective sample size of Vehtari, Gelman, Simpson,
Carpenter & Bürkner (2021).  The summary keeps the worst of each: ``rhat_max`` (≈ 1 for chains that agree,
above 1.01–1.1 for chains that have not mixed) and ``ess_bulk_min``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor, nn

N_PROBES = 8
"""Training inputs whose outputs summarise a sample."""


def _arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's notice of its coming refactor
        import arviz
    return arviz


def warm_up_diagnostics() -> None:
    """Import ArviZ (about 2 s) before any timed trial."""
    _arviz()


class ChainTrace:
    """The function-space summaries of every sample of ``n_chains`` chains, for :meth:`summary`."""

    def __init__(self, probe_x: Tensor, n_chains: int):
        if n_chains < 1:
            raise ValueError(f"n_chains must be at least 1, got {n_chains}")
        self.probe_x = probe_x[:N_PROBES]
        self.draws: list[list[np.ndarray]] = [[] for _ in range(n_chains)]

    def record(self, chain: int, predictor: nn.Module) -> None:
        """Add the outputs of one sample of chain ``chain`` on the probe inputs."""
        with torch.no_grad():
            out = predictor(self.probe_x).float()
        if out.ndim > 1 and out.shape[-1] > 1:
            out = torch.log_softmax(out, dim=-1)
        self.draws[chain].append(out.reshape(-1).double().cpu().numpy())

    def summary(self) -> dict[str, float]:
        """``n_chains``, and with two chains or more and four draws each: ``rhat_max`` (the largest
        rank-normalised split-R̂ over the probe quantities) and ``ess_bulk_min`` (the smallest bulk ESS)."""
        n_chains = len(self.draws)
        draws = min(len(d) for d in self.draws)
        out = {"n_chains": float(n_chains)}
        if n_chains < 2 or draws < 4:
            return out
        values = np.stack([np.stack(d[:draws]) for d in self.draws])  # (chain, draw, quantity)
        arviz = _arviz()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a constant quantity's R̂ divides by zero
            rhat = [float(arviz.rhat(values[:, :, q], method="rank")) for q in range(values.shape[2])]
            ess = [float(arviz.ess(values[:, :, q], method="bulk")) for q in range(values.shape[2])]
        finite = [r for r in rhat if np.isfinite(r)]  # a constant quantity (e.g. a saturated class) has none
        out["rhat_max"] = max(finite) if finite else float("nan")
        out["ess_bulk_min"] = min(e for e in ess if np.isfinite(e)) if any(np.isfinite(ess)) else float("nan")
        return out
