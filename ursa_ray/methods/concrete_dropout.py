"""Concrete dropout (Gal, Hron & Kendall 2017): dropout whose per-layer rate p is learned.

The method takes the network from ``problem.make_model()`` and replaces each of its ``nn.Dropout``
slots by a :class:`ConcreteDropout` module that drops the inputs of the next weight layer.  During
training the Bernoulli mask is replaced by its concrete (relaxed Bernoulli) version,

    z̃ = sigmoid((log p − log(1 − p) + log u − log(1 − u)) / t),   u ~ U(0, 1),   x ← x (1 − z̃) / (1 − p),

so the loss is differentiable in p (temperature t = 0.1 by default).  The objective per training example is
the negative ELBO: −mean log p(y|x,θ) + KL/N, with Gal's approximation for a layer whose K inputs are
dropped with rate p and whose weights W follow the N(0, 1/l²) prior,

    KL ≈ (l² / 2) ‖W‖² / (1 − p) − K H(p),   H(p) = −p log p − (1 − p) log(1 − p);

weights of layers without a dropout slot get (l²/2)‖W‖².  Posterior samples are stochastic forward passes
with exact Bernoulli(p) masks at the learned rates.  ``stats`` records the learned rates (``cd_p_mean``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods._training import ADAM_HYPERPARAMETERS, replace_module, train_adam
from ursa_ray.methods.base import (
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    StorageCount,
    batched_passes,
    n_parameters,
    passes,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, batched_nll, train_adam_copies

_EPS = 1e-7
_WEIGHT_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)


class ConcreteDropout(nn.Module):
    """Dropout with a learned rate p = sigmoid(p_logit); concrete relaxation in training, Bernoulli when
    sampling.  ``in_features`` (K of the regulariser) is read from the first input if not given."""

    def __init__(self, init_p: float, temperature: float, in_features: int | None = None) -> None:
        super().__init__()
        self.p_logit = nn.Parameter(torch.tensor(math.log(init_p) - math.log1p(-init_p)))
        self.temperature = temperature
        self.in_features = in_features

    @property
    def p(self) -> Tensor:
        return torch.sigmoid(self.p_logit)

    def forward(self, x: Tensor) -> Tensor:
        if self.in_features is None:
            self.in_features = int(x.shape[1]) if x.ndim > 1 else 1
        p = self.p
        if self.training:
            u = torch.rand_like(x)
            drop = torch.sigmoid(
                (torch.log(p + _EPS) - torch.log1p(-p + _EPS) + torch.log(u + _EPS) - torch.log1p(-u + _EPS))
                / self.temperature
            )
        else:
            drop = (torch.rand_like(x) < p).to(x.dtype)
        return x * (1.0 - drop) / (1.0 - p)

    def entropy(self) -> Tensor:
        return bernoulli_entropy(self.p)


def bernoulli_entropy(p: Tensor) -> Tensor:
    """H(p) = −p log p − (1 − p) log(1 − p), elementwise, p clamped to [ε, 1 − ε]."""
    p = p.clamp(_EPS, 1 - _EPS)
    return -(p * torch.log(p) + (1 - p) * torch.log1p(-p))


def install_concrete_dropout(
    model: nn.Module, init_p: float, temperature: float
) -> list[tuple[ConcreteDropout | None, nn.Module]]:
    """Replace every dropout slot of ``model`` by :class:`ConcreteDropout`.

    Returns (dropout, weight layer) pairs: each concrete dropout with the first weight layer (Linear or
    convolution) after it in module order, and (None, layer) for weight layers with no dropout in front.
    """
    leaves = [(name, m) for name, m in model.named_modules() if not list(m.children())]
    pending: ConcreteDropout | None = None
    pairs: list[tuple[ConcreteDropout | None, nn.Module]] = []
    found = False
    for name, module in leaves:
        if isinstance(module, nn.modules.dropout._DropoutNd):
            found = True
            pending = ConcreteDropout(init_p, temperature)
            replace_module(model, name, pending)
        elif isinstance(module, _WEIGHT_LAYERS):
            if pending is not None:
                pending.in_features = module.in_features if isinstance(module, nn.Linear) else module.in_channels
            pairs.append((pending, module))
            pending = None
    if not found:
        raise ValueError(f"{type(model).__name__} has no dropout layers, so concrete dropout cannot apply")
    if pending is not None:  # a dropout slot after the last weight layer: rate and entropy only
        pairs.append((pending, nn.Identity()))
    return pairs


def uncovered_parameters(pairs: list[tuple[ConcreteDropout | None, nn.Module]], model: nn.Module) -> list[Tensor]:
    """The weights of ``model`` in no (dropout, layer) pair and not a dropout rate: their prior is plain
    (l²/2)‖W‖².  Fixed for the whole run, so found once."""
    covered = {id(w) for _, layer in pairs for w in layer.parameters()}
    covered.update(id(d.p_logit) for d, _ in pairs if d is not None)
    return [w for w in model.parameters() if id(w) not in covered]


def concrete_regulariser(
    pairs: list[tuple[ConcreteDropout | None, nn.Module]], uncovered: list[Tensor], length_scale: float, n_train: int
) -> Tensor:
    """KL/N of Gal et al.'s approximation (see the module docstring); ``uncovered`` from
    :func:`uncovered_parameters`."""
    half_l2 = 0.5 * length_scale**2
    terms = []
    for dropout, layer in pairs:
        sq = sum((w**2).sum() for w in layer.parameters())
        if dropout is None:
            terms.append(half_l2 * sq)
        else:
            terms.append(half_l2 * sq / (1 - dropout.p) - dropout.in_features * dropout.entropy())
    terms.extend(half_l2 * (w**2).sum() for w in uncovered)
    return sum(terms) / n_train


def stacked_concrete_regulariser(
    model: nn.Module,
    pairs: list[tuple[ConcreteDropout | None, nn.Module]],
    uncovered: list[Tensor],
    length_scale: float,
    n_train: int,
) -> Callable[[dict[str, Tensor]], Tensor]:
    """:func:`concrete_regulariser` of C copies of ``model`` (whose ``pairs`` and ``uncovered`` weights
    these are) from their named (C, *shape) parameters (:meth:`StackedNetworks.parameters_of`): the same
    terms, each reduced over all but the copy dimension, shape (C,)."""
    names = {id(p): name for name, p in model.named_parameters()}
    plan = [
        (
            None if d is None else names[id(d.p_logit)],
            None if d is None else d.in_features,
            [names[id(w)] for w in layer.parameters()],
        )
        for d, layer in pairs
    ]
    rest = [names[id(w)] for w in uncovered]
    half_l2 = 0.5 * length_scale**2

    def squares(w: Tensor) -> Tensor:
        return (w**2).reshape(w.shape[0], -1).sum(1)

    def regulariser(params: dict[str, Tensor]) -> Tensor:
        terms = []
        for rate, k, weights in plan:
            sq = sum(squares(params[name]) for name in weights)
            if rate is None:
                terms.append(half_l2 * sq)
            else:
                p = torch.sigmoid(params[rate])
                terms.append(half_l2 * sq / (1 - p) - k * bernoulli_entropy(p))
        terms.extend(half_l2 * squares(params[name]) for name in rest)
        return sum(terms) / n_train

    return regulariser


def concrete_dropout_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """One network: its P weights, and the L learned rates (one ``p_logit`` per :class:`ConcreteDropout`
    slot) as other values; the masks are drawn at prediction time."""
    rates = sum(1 for m in sample.modules() if isinstance(m, ConcreteDropout))
    return StorageCount(weights=n_parameters(sample) - rates, other_values=rates)


class ConcreteDropoutMethod(Method):
    name = "concrete_dropout"
    description = "concrete dropout: MC dropout with per-layer rates learned through the concrete relaxation"
    hyperparameters = ADAM_HYPERPARAMETERS + (
        Hyperparameter("init_p", float, 0.1, "initial dropout rate of every layer", low=1e-4, high=0.9),
        Hyperparameter(
            "relaxation_temperature",
            float,
            0.1,
            "t of the concrete (relaxed Bernoulli) relaxation of the dropout masks; tempers no posterior",
            low=1e-3,
            formerly=("temperature",),
        ),
        Hyperparameter("length_scale", float, 1.0, "prior length-scale l: weights ~ N(0, 1/l²)", low=0.0),
        Hyperparameter("n_samples", int, 50, "stochastic forward passes", low=1),
    )
    posterior_storage = staticmethod(concrete_dropout_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = problem.make_model()
        pairs = install_concrete_dropout(model, config["init_p"], config["relaxation_temperature"])
        model.to(problem.device)
        # A first pass fixes the K of any dropout slot that is not in front of a known weight layer.
        with torch.no_grad():
            model(problem.x[:2])
        uncovered = uncovered_parameters(pairs, model)
        train_adam(
            model,
            problem,
            config,
            stats,
            lambda progress: concrete_regulariser(pairs, uncovered, config["length_scale"], problem.n_train),
        )
        rates = [float(d.p.detach()) for d, _ in pairs if d is not None]
        stats["cd_p_mean"] = sum(rates) / len(rates)
        stats["cd_p_max"] = max(rates)
        model.eval()  # Bernoulli masks at the learned rates; batch norm (if any) in evaluation mode
        yield from passes(model, config["n_samples"], stats)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """:meth:`sample_posterior` for every problem at once: one batched Adam run
        (:func:`~ursa_ray.methods.batched.train_adam_copies`) on Σ_c [nll_c + KL_c/N], each copy's KL from its
        own row of the stacked parameters (:func:`stacked_concrete_regulariser`), its mini-batches from its
        problem's generator, its concrete masks drawn independently of the other copies'.  Each copy's own
        network (its :class:`ConcreteDropout` rates views of its row) then yields its stochastic passes."""
        models, all_pairs = [], []
        for problem in problems:
            model = problem.make_model()
            all_pairs.append(install_concrete_dropout(model, config["init_p"], config["relaxation_temperature"]))
            model.to(problem.device)
            with torch.no_grad():  # as in sample_posterior: fixes K of a slot in front of no weight layer
                model(problem.x[:2])
            models.append(model)
        n_train = problems[0].n_train
        regulariser = stacked_concrete_regulariser(
            models[0], all_pairs[0], uncovered_parameters(all_pairs[0], models[0]), config["length_scale"], n_train
        )
        stacked = StackedNetworks(models)
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        nll = batched_nll(problems[0].likelihood)

        def loss(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
            return nll(stacked(xb), yb) + regulariser(stacked.parameters())

        steps, last = train_adam_copies(stacked, data, loss, config)
        stacked.train(False)  # Bernoulli masks at the learned rates
        for one, pairs, final in zip(stats, all_pairs, last.tolist(), strict=True):
            rates = [float(d.p.detach()) for d, _ in pairs if d is not None]
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
            one["final_loss"] = final
            one["cd_p_mean"] = sum(rates) / len(rates)
            one["cd_p_max"] = max(rates)
        yield from batched_passes(models, config["n_samples"], stats)


METHODS = (ConcreteDropoutMethod(),)
