"""Mean-field variational inference: Bayes by Backprop (Blundell, Cornebise, Kavukcuoglu & Wierstra 2015).

Every weight and bias of every ``nn.Linear`` and ``nn.Conv2d`` layer of the network from
``problem.make_model()`` gets a factorised Gaussian q(w) = N(μ, σ²), σ = softplus(ρ), and the prior
p(w) = N(0, s²) with s = ``prior_std``.  Batch-norm scales and shifts, where a model has them, stay point
estimates.  The objective per training example is the negative ELBO

    −(1/B) Σ_batch log p(y | x, w),  w ~ q   +   β · KL(q ‖ p) / N,
    KL(N(μ, σ²) ‖ N(0, s²)) = log(s/σ) + (σ² + μ²)/(2 s²) − ½   (summed over the weights, closed form),

with β ramped linearly from 0 to ``kl_weight`` over the first ``kl_warmup`` share of training (β = 1, no
warm-up: the ELBO), minimised by Adam.

Gradient variance.  Linear layers use the local reparameterisation trick (Kingma, Salimans & Welling
2015): the pre-activations b = x wᵀ of a factorised Gaussian w are Gaussian, so they are sampled directly,
b ~ N(x μᵀ + μ_b, x² (σ²)ᵀ + σ_b²), independently per example: each example sees its own weight draw (its
exact marginal) and the gradient's variance falls as 1/B.  Convolutions use Flipout (Wen et al. 2018):
out = conv(x, μ) + conv(x ⊙ r, σ ⊙ ε) ⊙ s with one Gaussian draw ε per call and random signs r (input
channels) and s (output channels) per example.  The local trick would be wrong there: the output positions
of a convolution share its weights, and sampling them independently would sample no network at all;
Flipout keeps one weight perturbation per example, shared over positions (each example's marginal exact),
and decorrelates the examples of a batch.

Posterior samples are stochastic forward passes of the trained network (fresh draws each call, as in
evaluation every set and sample draws its own); S = ``n_samples`` of them at test time.
"""

from __future__ import annotations

import math
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


def inverse_softplus(sigma: float) -> float:
    """ρ with softplus(ρ) = σ."""
    return sigma + math.log(-math.expm1(-sigma))


def kl_terms(mean: Tensor, rho: Tensor, prior_std: float) -> Tensor:
    """KL(N(μ, σ²) ‖ N(0, s²)) = log(s/σ) + (σ² + μ²)/(2s²) − ½ with σ = softplus(ρ), elementwise."""
    sigma = F.softplus(rho)
    return math.log(prior_std) - torch.log(sigma) + (sigma**2 + mean**2) / (2 * prior_std**2) - 0.5


class BayesianLayer(nn.Module):
    """A factorised Gaussian over the weight and bias of a Linear or Conv2d layer (means, ρ)."""

    def __init__(self, layer: nn.Linear | nn.Conv2d, init_std: float) -> None:
        super().__init__()
        rho = inverse_softplus(init_std)
        self.weight_mean = nn.Parameter(layer.weight.detach().clone())
        self.weight_rho = nn.Parameter(torch.full_like(self.weight_mean, rho))
        if layer.bias is not None:
            self.bias_mean = nn.Parameter(layer.bias.detach().clone())
            self.bias_rho = nn.Parameter(torch.full_like(self.bias_mean, rho))
        else:
            self.bias_mean = self.bias_rho = None

    def kl(self, prior_std: float) -> Tensor:
        """KL(q ‖ p) of this layer's weights and biases."""
        kl = kl_terms(self.weight_mean, self.weight_rho, prior_std).sum()
        if self.bias_mean is not None:
            kl = kl + kl_terms(self.bias_mean, self.bias_rho, prior_std).sum()
        return kl


class BayesianLinear(BayesianLayer):
    """Linear layer sampled by the local reparameterisation trick (module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        mean = F.linear(x, self.weight_mean, self.bias_mean)
        bias_var = None if self.bias_rho is None else F.softplus(self.bias_rho) ** 2
        var = F.linear(x * x, F.softplus(self.weight_rho) ** 2, bias_var)
        return mean + torch.sqrt(var + 1e-16) * torch.randn_like(mean)


class BayesianConv2d(BayesianLayer):
    """Conv2d layer sampled by Flipout (module docstring)."""

    def __init__(self, layer: nn.Conv2d, init_std: float) -> None:
        super().__init__(layer, init_std)
        self.conv_options = dict(
            stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups
        )
        if layer.padding_mode != "zeros":
            raise ValueError("mfvi supports zero-padded convolutions only")

    def forward(self, x: Tensor) -> Tensor:
        mean = F.conv2d(x, self.weight_mean, self.bias_mean, **self.conv_options)
        weight_noise = F.softplus(self.weight_rho) * torch.randn_like(self.weight_mean)
        bias_noise = None if self.bias_rho is None else F.softplus(self.bias_rho) * torch.randn_like(self.bias_mean)
        signs_in = _random_signs(x.shape[0], x.shape[1], x)
        signs_out = _random_signs(x.shape[0], mean.shape[1], x)
        perturbation = F.conv2d(x * signs_in, weight_noise, None, **self.conv_options) * signs_out
        if bias_noise is not None:
            perturbation = perturbation + bias_noise.view(1, -1, 1, 1)
        return mean + perturbation


def _random_signs(n: int, channels: int, like: Tensor) -> Tensor:
    """(n, channels, 1, 1) independent ±1 with probability ½ each."""
    return torch.randint(0, 2, (n, channels, 1, 1), device=like.device).to(like.dtype) * 2 - 1


def install_bayesian_layers(model: nn.Module, init_std: float) -> list[BayesianLayer]:
    """Replace every ``nn.Linear`` and ``nn.Conv2d`` of ``model`` by its Bayesian layer (in place)."""
    names = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not names:
        raise ValueError(f"{type(model).__name__} has no Linear or Conv2d layers, so mfvi cannot apply")
    layers: list[BayesianLayer] = []
    for name in names:
        old = model.get_submodule(name)
        layer = BayesianConv2d(old, init_std) if isinstance(old, nn.Conv2d) else BayesianLinear(old, init_std)
        replace_module(model, name, layer.to(old.weight.device))
        layers.append(layer)
    return layers


def stacked_kl(model: nn.Module, prior_std: float) -> Callable[[dict[str, Tensor]], Tensor]:
    """Σ over the Bayesian layers of ``model`` of their KL, for C copies from their named (C, *shape)
    parameters (:meth:`StackedNetworks.parameters`): shape (C,)."""
    pairs = []
    for name, m in model.named_modules():
        if isinstance(m, BayesianLayer):
            pairs.append((f"{name}.weight_mean", f"{name}.weight_rho"))
            if m.bias_mean is not None:
                pairs.append((f"{name}.bias_mean", f"{name}.bias_rho"))

    def kl(params: dict[str, Tensor]) -> Tensor:
        total = 0.0
        for mean_name, rho_name in pairs:
            terms = kl_terms(params[mean_name], params[rho_name], prior_std)
            total = total + terms.reshape(terms.shape[0], -1).sum(1)
        return total

    return kl


def _record(stats: dict[str, float], layers: Sequence[BayesianLayer]) -> None:
    with torch.no_grad():
        sigma = torch.cat([F.softplus(layer.weight_rho).reshape(-1) for layer in layers])
    stats["mfvi_sigma_mean"] = float(sigma.mean())


def _ramp(config: Mapping[str, Any], progress: float) -> float:
    warmup = config["kl_warmup"]
    return config["kl_weight"] * (1.0 if warmup == 0 else min(1.0, progress / warmup))


class MeanFieldVIMethod(Method):
    name = "mfvi"
    description = "mean-field VI (Bayes by Backprop): factorised Gaussian weights, local reparameterisation / Flipout"
    hyperparameters = ADAM_HYPERPARAMETERS + (
        Hyperparameter("prior_std", float, 1.0, "s, the std of the Gaussian prior N(0, s²) on every weight", low=1e-6),
        Hyperparameter(
            "init_std", float, 1e-3, "initial σ of every weight (means start at the model's init)", low=1e-8
        ),
        Hyperparameter("kl_weight", float, 1.0, "β, the weight of the KL term (1 = the ELBO)", low=0.0),
        Hyperparameter("kl_warmup", float, 0.2, "share of training over which β ramps up from 0", low=0.0, high=1.0),
        Hyperparameter("n_samples", int, 30, "weight draws (stochastic forward passes) at test time", low=1),
    )
    # one network whose parameters are the means and ρ of every weight of its Linear and Conv2d layers
    posterior_storage = staticmethod(one_network_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = problem.make_model()
        layers = install_bayesian_layers(model, config["init_std"])
        model.to(problem.device)

        def regulariser(progress: float) -> Tensor:
            kl = sum(layer.kl(config["prior_std"]) for layer in layers)
            return _ramp(config, progress) * kl / problem.n_train

        train_adam(model, problem, config, stats, regulariser)
        _record(stats, layers)
        model.eval()  # batch norm (if any) in evaluation mode; the Bayesian layers keep sampling
        yield from passes(model, config["n_samples"], stats)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """:meth:`sample_posterior` for every problem at once: one batched Adam run
        (:func:`~ursa_ray.methods.batched.train_adam_copies`) on Σ_c [nll_c + β KL_c/N], each copy's KL from
        its own row of the stacked parameters (:func:`stacked_kl`), its noise drawn independently of the
        other copies' (``vmap(randomness="different")``).  Each copy's own network then yields its passes."""
        models, all_layers = [], []
        for problem in problems:
            model = problem.make_model()
            all_layers.append(install_bayesian_layers(model, config["init_std"]))
            models.append(model.to(problem.device))
        n_train = problems[0].n_train
        kl = stacked_kl(models[0], config["prior_std"])
        stacked = StackedNetworks(models)
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        nll = batched_nll(problems[0].likelihood)

        def loss(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return nll(stacked(xb), yb) + _ramp(config, progress) * kl(stacked.parameters()) / n_train

        steps, last = train_adam_copies(stacked, data, loss, config)
        stacked.train(False)
        for one, layers, final in zip(stats, all_layers, last.tolist(), strict=True):
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
            one["final_loss"] = final
            _record(one, layers)
        yield from batched_passes(models, config["n_samples"], stats)


METHODS = (MeanFieldVIMethod(),)
