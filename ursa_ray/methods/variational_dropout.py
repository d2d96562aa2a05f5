"""Variational dropout with learned noise (Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017).

Every weight gets multiplicative Gaussian noise, w = θ (1 + √α ε), ε ~ N(0, 1), with its own learned
α = σ²/θ² (log σ² is the free parameter; log α is clipped to [−10, 10]).  The method takes the network
from ``problem.make_model()`` and wraps each of its ``nn.Linear`` layers in a :class:`VariationalLinear`
(dropout slots are left at rate 0).  Forward passes use the local reparameterisation trick: a layer's
pre-activations are sampled as b ~ N(x θᵀ + bias, x² (α θ²)ᵀ), independently per example.

The objective per training example is −mean log p(y|x,θ) + β · KL/N with Molchanov et al.'s approximation
of the KL to the log-uniform prior,

    −KL(q(w_ij) ‖ p(w_ij)) ≈ k₁ σ(k₂ + k₃ log α) − ½ log(1 + 1/α) − k₁,
    k₁ = 0.63576, k₂ = 1.87320, k₃ = 1.48695,

with β ramped linearly from 0 to ``kl_weight`` over the first ``kl_warmup`` share of training.  Posterior
samples are stochastic forward passes (fresh noise for every call).  A recurrent model applies its Linear maps
once per time step, so its recurrent weights get fresh noise at every step (docs/models.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ursa_ray.methods._training import ADAM_HYPERPARAMETERS, replace_module, train_adam
from ursa_ray.methods.base import (
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    batched_passes,
    one_network_storage,
    passes,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, batched_nll, train_adam_copies

K1, K2, K3 = 0.63576, 1.87320, 1.48695
LOG_ALPHA_CLIP = 10.0


class VariationalLinear(nn.Module):
    """A Linear layer with per-weight Gaussian multiplicative noise of learned variance."""

    def __init__(self, linear: nn.Linear, init_log_sigma2: float) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.log_sigma2 = nn.Parameter(torch.full_like(self.weight, init_log_sigma2))

    @property
    def log_alpha(self) -> Tensor:
        return log_alpha(self.weight, self.log_sigma2)

    def forward(self, x: Tensor) -> Tensor:
        mean = F.linear(x, self.weight, self.bias)
        var = F.linear(x * x, torch.exp(self.log_alpha) * self.weight**2)
        return mean + torch.sqrt(var + 1e-8) * torch.randn_like(mean)

    def kl(self) -> Tensor:
        return kl_terms(self.weight, self.log_sigma2).sum()


def log_alpha(weight: Tensor, log_sigma2: Tensor) -> Tensor:
    """log α = log σ² − log θ², clipped to [−10, 10], elementwise."""
    return torch.clamp(log_sigma2 - torch.log(weight**2 + 1e-8), -LOG_ALPHA_CLIP, LOG_ALPHA_CLIP)


def kl_terms(weight: Tensor, log_sigma2: Tensor) -> Tensor:
    """Molchanov et al.'s approximate KL(q(w_ij) ‖ p(w_ij)) of every weight, elementwise."""
    la = log_alpha(weight, log_sigma2)
    return -(K1 * torch.sigmoid(K2 + K3 * la) - 0.5 * F.softplus(-la) - K1)


def stacked_kl(model: nn.Module) -> Callable[[dict[str, Tensor]], Tensor]:
    """Σ over the :class:`VariationalLinear` layers of ``model`` of their KL, for C copies of ``model`` from
    their named (C, *shape) parameters (:meth:`StackedNetworks.parameters_of`): shape (C,)."""
    layers = [name for name, m in model.named_modules() if isinstance(m, VariationalLinear)]

    def kl(params: dict[str, Tensor]) -> Tensor:
        terms = [kl_terms(params[f"{name}.weight"], params[f"{name}.log_sigma2"]) for name in layers]
        return sum(t.reshape(t.shape[0], -1).sum(1) for t in terms)

    return kl


def install_variational_linear(model: nn.Module, init_log_sigma2: float) -> list[VariationalLinear]:
    """Wrap every ``nn.Linear`` of ``model`` in a :class:`VariationalLinear` (in place)."""
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no Linear layers, so variational dropout cannot apply")
    layers = []
    for name in names:
        layer = VariationalLinear(model.get_submodule(name), init_log_sigma2)
        replace_module(model, name, layer)
        layers.append(layer)
    return layers


class VariationalDropoutMethod(Method):
    name = "variational_dropout"
    description = "variational dropout: per-weight Gaussian multiplicative noise with learned alpha (sparse VD KL)"
    hyperparameters = ADAM_HYPERPARAMETERS + (
        Hyperparameter("init_log_sigma2", float, -10.0, "initial log σ² of every weight's noise", high=0.0),
        Hyperparameter("kl_weight", float, 1.0, "β, the weight of the KL term (1 = the ELBO)", low=0.0),
        Hyperparameter("kl_warmup", float, 0.2, "share of training over which β ramps up from 0", low=0.0, high=1.0),
        Hyperparameter("n_samples", int, 50, "stochastic forward passes", low=1),
    )
    # one network whose parameters are θ, the biases and a learned log σ² per weight of every Linear layer
    posterior_storage = staticmethod(one_network_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = problem.make_model()
        layers = install_variational_linear(model, config["init_log_sigma2"])
        model.to(problem.device)
        warmup, beta = config["kl_warmup"], config["kl_weight"]

        def regulariser(progress: float) -> Tensor:
            ramp = 1.0 if warmup == 0 else min(1.0, progress / warmup)
            return beta * ramp * sum(layer.kl() for layer in layers) / problem.n_train

        train_adam(model, problem, config, stats, regulariser)
        with torch.no_grad():
            log_alpha = torch.cat([layer.log_alpha.reshape(-1) for layer in layers])
        stats["vd_log_alpha_mean"] = float(log_alpha.mean())
        stats["vd_sparsity"] = float((log_alpha > 3).double().mean())  # share of weights Molchanov would prune
        model.eval()
        yield from passes(model, config["n_samples"], stats)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """:meth:`sample_posterior` for every problem at once: one batched Adam run
        (:func:`~ursa_ray.methods.batched.train_adam_copies`) on Σ_c [nll_c + β KL_c/N], each copy's KL from
        its own row of the stacked parameters (:func:`stacked_kl`), its noise drawn independently of the
        other copies'.  Each copy's own network then yields its stochastic passes."""
        models, all_layers = [], []
        for problem in problems:
            model = problem.make_model()
            all_layers.append(install_variational_linear(model, config["init_log_sigma2"]))
            models.append(model.to(problem.device))
        warmup, beta, n_train = config["kl_warmup"], config["kl_weight"], problems[0].n_train
        kl = stacked_kl(models[0])
        stacked = StackedNetworks(models)
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        nll = batched_nll(problems[0].likelihood)

        def loss(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            ramp = 1.0 if warmup == 0 else min(1.0, progress / warmup)
            return nll(stacked(xb), yb) + beta * ramp * kl(stacked.parameters()) / n_train

        steps, last = train_adam_copies(stacked, data, loss, config)
        stacked.train(False)
        for one, layers, final in zip(stats, all_layers, last.tolist(), strict=True):
            with torch.no_grad():
                la = torch.cat([layer.log_alpha.reshape(-1) for layer in layers])
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
            one["final_loss"] = final
            one["vd_log_alpha_mean"] = float(la.mean())
            one["vd_sparsity"] = float((la > 3).double().mean())
        yield from batched_passes(models, config["n_samples"], stats)


METHODS = (VariationalDropoutMethod(),)
