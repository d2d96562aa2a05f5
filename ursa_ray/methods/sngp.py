"""SNGP: spectral-normalised neural Gaussian process (Liu, Lin, Padhy, Tran, Bedrax-Weiss & Lakshminarayanan
2020, "Simple and principled uncertainty estimation with deterministic deep learning via distance
awareness").

The network from ``problem.make_model()`` keeps its hidden layers, each ``nn.Linear`` and ``nn.Conv2d``
under spectral normalisation (``torch.nn.utils.parametrizations.spectral_norm``: W / σ_max(W), σ_max by
one power iteration per training step; a convolution's kernel is normalised as its (out, in·k·k) matrix,
an approximation of the convolution's operator norm).  Its output layer, the last ``nn.Linear``, becomes
a random-feature Gaussian process (:class:`RandomFeatureGP`): for the hidden features h,

    φ(h) = √(2/D) cos(W h / ℓ + b),  W_dj ~ N(0, 1), b_d ~ U(0, 2π) fixed (D = ``n_features``, ℓ = ``lengthscale``),
    g_k(h) = φ(h)ᵀ β_k,  β_k ~ N(0, I),

an approximation of a GP with an RBF kernel of lengthscale ℓ on h.  The network and β are trained by Adam
on −mean log p(y | g) + ½ ‖β‖² / N (the MAP of β under its prior).  In the last epoch the GP layer
accumulates the Laplace precision of each output k at the current mini-batch predictions (paper eq. 9),

    Σ_k⁻¹ = I + Σ_i p_ik (1 − p_ik) φ_i φ_iᵀ   (categorical, p_i = softmax(g_i)),
    Σ⁻¹  = I + Σ_i φ_i φ_iᵀ / σ²              (Gaussian likelihood of noise std σ: then exact for fixed φ),

and at test time the posterior variance of each output is v_ik = φ_iᵀ Σ_k φ_i.  Classification uses the
mean-field approximation of the predictive (paper §3.2, Lu et al. 2020): p_i = softmax(g_i / √(1 + λ v_i)),
λ = π/8, one deterministic sample (so the mutual information is 0 and OOD detection goes by entropy), unless
``predictive: sampled``; regression, and ``predictive: sampled``, draw S = ``n_samples`` outputs
g_ik + √v_ik ε per example (each example's exact marginal).

Seeds run one per trial (no batched stream): spectral normalisation keeps per-copy power-iteration state
that a batched functional call would not update.  The MLP has no residual connections, so spectral
normalisation bounds its distortion of distances from above only (the paper's bi-Lipschitz argument needs
residual layers, as in the ResNet and WRN).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm

from ursa_ray.methods._training import ADAM_HYPERPARAMETERS, minimise, replace_module
from ursa_ray.methods.base import (
    Gaussian,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    SamplePlan,
    StorageCount,
    n_parameters,
)

MEAN_FIELD_FACTOR = math.pi / 8
"""λ of the mean-field approximation E[softmax(g)] ≈ softmax(g / √(1 + λ v))."""


class RandomFeatureGP(nn.Module):
    """The GP output layer: fixed random Fourier features φ(h) and trained output weights β (module
    docstring).  ``precision`` (K or 1, D, D) is the Laplace precision accumulated while
    ``accumulating`` (after :meth:`reset_precision`); :meth:`finalise` turns it into ``covariance``."""

    def __init__(
        self, in_features: int, n_outputs: int, n_features: int, lengthscale: float, gaussian_noise_std: float | None
    ) -> None:
        super().__init__()
        self.n_outputs, self.n_features = n_outputs, n_features
        self.register_buffer("projection", torch.randn(n_features, in_features) / lengthscale)
        self.register_buffer("phase", 2 * math.pi * torch.rand(n_features))
        self.beta = nn.Parameter(torch.zeros(n_outputs, n_features))
        nn.init.normal_(self.beta, std=0.01)
        self.gaussian_noise_std = gaussian_noise_std
        self.blocks = 1 if gaussian_noise_std is not None else n_outputs
        # covariance: a float32 buffer, so the network's tensors share one dtype (bit depths, attacks flatten
        # them); precision: float64 training state (sums over N examples), made by reset_precision
        self.register_buffer("covariance", torch.eye(n_features).repeat(self.blocks, 1, 1))
        self.precision: Tensor | None = None
        self.accumulating = False
        self.output_mode = "mean"  # "mean" (training), "mean_field" or "sampled" (test time)

    def features(self, h: Tensor) -> Tensor:
        """φ(h) = √(2/D) cos(W h / ℓ + b), shape (B, D)."""
        return math.sqrt(2.0 / self.n_features) * torch.cos(h @ self.projection.T + self.phase)

    def reset_precision(self) -> None:
        eye = torch.eye(self.n_features, dtype=torch.float64, device=self.beta.device)
        self.precision = eye.repeat(self.blocks, 1, 1)

    def update_precision(self, phi: Tensor, outputs: Tensor) -> None:
        """Add Σ_i w_ik φ_i φ_iᵀ of a mini-batch: w_ik = p_ik (1 − p_ik), or 1/σ² for a Gaussian likelihood."""
        phi = phi.detach().to(self.precision.dtype)
        if self.gaussian_noise_std is not None:
            self.precision[0] += phi.T @ phi / self.gaussian_noise_std**2
        else:
            p = torch.softmax(outputs.detach().to(self.precision.dtype), dim=-1)
            self.precision += torch.einsum("bk,bd,be->kde", p * (1 - p), phi, phi)

    def finalise(self) -> None:
        """covariance = precision⁻¹ (per block, by Cholesky in float64); the precision is then dropped."""
        if self.precision is None:
            raise RuntimeError("no Laplace precision accumulated (reset_precision, then forward passes)")
        self.covariance.copy_(torch.cholesky_inverse(torch.linalg.cholesky(self.precision)))
        self.precision = None

    def variance(self, phi: Tensor) -> Tensor:
        """v_ik = φ_iᵀ Σ_k φ_i, shape (B, K) (one column broadcast for a Gaussian likelihood)."""
        v = torch.einsum("bd,kde,be->bk", phi, self.covariance, phi)
        return v.expand(-1, self.n_outputs) if v.shape[1] != self.n_outputs else v

    def forward(self, h: Tensor) -> Tensor:
        with torch.autocast(h.device.type, enabled=False):  # float32 even in a mixed-precision evaluation
            return self._forward(h.float())

    def _forward(self, h: Tensor) -> Tensor:
        phi = self.features(h)
        outputs = phi @ self.beta.T
        if self.accumulating:
            self.update_precision(phi, outputs)
        if self.output_mode == "mean_field":
            return outputs / torch.sqrt(1 + MEAN_FIELD_FACTOR * self.variance(phi))
        if self.output_mode == "sampled":
            return outputs + torch.sqrt(self.variance(phi).clamp_min(0)) * torch.randn_like(outputs)
        return outputs


def install_sngp(model: nn.Module, config: Mapping[str, Any], gaussian_noise_std: float | None) -> RandomFeatureGP:
    """Spectral normalisation on every hidden Linear and Conv2d of ``model`` and its last Linear replaced by
    a :class:`RandomFeatureGP` (in place)."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no Linear output layer, so sngp cannot apply")
    output_name = linears[-1]
    output = model.get_submodule(output_name)
    for name, m in list(model.named_modules()):
        if isinstance(m, (nn.Linear, nn.Conv2d)) and name != output_name:
            spectral_norm(m)
    gp = RandomFeatureGP(
        output.in_features, output.out_features, config["n_features"], config["lengthscale"], gaussian_noise_std
    )
    replace_module(model, output_name, gp.to(output.weight.device))
    return gp


def sngp_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """One network (its parameters, β included) plus the random projection, phases and the covariance
    blocks (K or 1) × D × D the predictive reads."""
    (gp,) = [m for m in sample.modules() if isinstance(m, RandomFeatureGP)]
    extra = gp.projection.numel() + gp.phase.numel() + gp.covariance.numel()
    return StorageCount(weights=n_parameters(sample) + extra)


def _mean_field(config: Mapping[str, Any], problem: Problem) -> bool:
    """Whether the predictive is the mean-field softmax (classification with ``predictive: mean_field``)."""
    return not isinstance(problem.likelihood, Gaussian) and config["predictive"] == "mean_field"


class SNGPMethod(Method):
    name = "sngp"
    description = "SNGP: spectral-normalised hidden layers and a random-feature GP output with its Laplace covariance"
    hyperparameters = ADAM_HYPERPARAMETERS + (
        Hyperparameter("n_features", int, 512, "D, random Fourier features of the GP layer", low=1),
        Hyperparameter("lengthscale", float, 2.0, "ℓ, the RBF kernel's lengthscale on the hidden features", low=1e-6),
        Hyperparameter(
            "predictive",
            str,
            "mean_field",
            "classification predictive: mean-field softmax (one sample) or sampled outputs",
            choices=("mean_field", "sampled"),
        ),
        Hyperparameter("n_samples", int, 20, "output draws at test time where the predictive is sampled", low=1),
    )
    posterior_storage = staticmethod(sngp_storage)

    def sample_plan(self, config: Mapping[str, Any], problem: Problem) -> SamplePlan:
        """One sample for the mean-field classification predictive, else ``n_samples`` output draws."""
        return SamplePlan(1 if _mean_field(config, problem) else config["n_samples"])

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        gaussian = problem.likelihood.noise_std if isinstance(problem.likelihood, Gaussian) else None
        model = problem.make_model()
        gp = install_sngp(model, config, gaussian)
        model.to(problem.device)
        steps_per_epoch = math.ceil(problem.n_train / config["batch_size"])
        last_epoch = (config["epochs"] - 1) * steps_per_epoch
        optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"])
        step = 0

        def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            nonlocal step
            if step == last_epoch:
                gp.reset_precision()
                gp.accumulating = True
            step += 1
            ridge = 0.5 * gp.beta.pow(2).sum() / problem.n_train
            return problem.likelihood.nll(model(xb), yb) + ridge

        model.train()
        steps, loss = minimise(
            problem.minibatches,
            problem.n_train,
            config,
            optimiser,
            config["epochs"],
            loss_at,
            precision=problem.training_precision,  # the body; the GP layer computes in float32 (its forward)
        )
        gp.accumulating = False
        gp.finalise()
        stats["grad_evals"] = stats.get("grad_evals", 0.0) + steps
        stats["final_loss"] = float(loss)
        model.eval()
        mean_field = _mean_field(config, problem)
        gp.output_mode = "mean_field" if mean_field else "sampled"
        for s in range(self.sample_plan(config, problem).per_chain):
            stats["n_samples"] = s + 1
            yield model


METHODS = (SNGPMethod(),)
