"""The one interface every inference method implements.

A method turns a :class:`Problem` (training tensors already on the trial's device, a likelihood and a
factory of freshly initialised models) into a *stream of posterior samples*.  Each sample is a
:data:`Predictor`: an ``nn.Module`` from an input batch to the network output (class logits, or the
regression mean).  The evaluator consumes each predictor on every evaluation set before asking for the
next one, so a method may hand out a view of its live parameters and the posterior predictive is
accumulated online: memory does not grow with the number of samples.

Methods know nothing of Ray, of evaluation sets or of result files.  Counters worth recording (gradient
evaluations, HMC acceptance rate, ...) go into the ``stats`` dict passed to :meth:`Method.sample_posterior`;
they land in ``trials.parquet``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

Predictor = nn.Module
"""A network whose current parameters (or, for dropout methods, its stochastic forward pass) are the sample:
maps an input batch to network outputs; valid only until the next sample is requested.  The evaluator also
reads its structure (test-time FLOPs) and briefly stores its weights at lower bit depths."""

BatchedStream = Callable[..., Iterator[list[Predictor]]]
"""``(problems, config, stats) -> Iterator[list[Predictor]]``: :attr:`Method.sample_posterior_batched`."""


Reduction = Literal["mean", "sum"]


class Likelihood(Protocol):
    """Observation model p(y | f(x)).  ``log_prob`` returns one log-likelihood per example; ``nll`` their
    negated mean or sum in one fused operation (the training loss: fewer autograd nodes than
    ``-log_prob(...).mean()``, about 50 µs a step less at batch 128)."""

    name: str

    def log_prob(self, outputs: Tensor, targets: Tensor) -> Tensor: ...

    def nll(self, outputs: Tensor, targets: Tensor, reduction: Reduction = "mean") -> Tensor: ...


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


@dataclass(frozen=True)
class Categorical:
    """p(y | logits) = softmax(logits)[y]."""

    name: str = "categorical"

    def log_prob(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return -nn.functional.cross_entropy(outputs, targets, reduction="none")

    def nll(self, outputs: Tensor, targets: Tensor, reduction: Reduction = "mean") -> Tensor:
        _check_reduction(reduction)
        return nn.functional.cross_entropy(outputs, targets, reduction=reduction)


@dataclass(frozen=True)
class Gaussian:
    """p(y | f) = N(y; f, noise_std²) with a known noise standard deviation."""

    noise_std: float
    name: str = "gaussian"

    def log_prob(self, outputs: Tensor, targets: Tensor) -> Tensor:
        residual = (outputs.reshape(targets.shape) - targets) / self.noise_std
        return -0.5 * residual**2 - self._log_normaliser()

    def nll(self, outputs: Tensor, targets: Tensor, reduction: Reduction = "mean") -> Tensor:
        _check_reduction(reduction)
        squares = nn.functional.mse_loss(outputs.reshape(targets.shape), targets, reduction=reduction)
        count = 1 if reduction == "mean" else targets.numel()
        return squares / (2 * self.noise_std**2) + count * self._log_normaliser()

    def _log_normaliser(self) -> float:
        return math.log(self.noise_std) + 0.5 * math.log(2 * math.pi)


Augment = Callable[[Tensor, torch.Generator], Tensor]


@dataclass
class Problem:
    """What a method may see of a trial.

    ``x`` and ``y`` are the whole training set on ``device``.  ``make_model()`` returns a freshly
    initialised network on ``device``; its initial weights come from torch's global random number
    generator, which the trial seeds, so each seed and each call (each ensemble member) starts from its
    own initialisation.  ``generator`` drives the mini-batch order and the methods' own randomness.  ``augment``, when set, is applied to
    every training mini-batch (random crop and flip for CIFAR).

    ``training_precision`` is the autocast dtype of the network body while a method trains (its forward
    and backward passes): ``torch.bfloat16`` for mixed precision, None (the default) for float32
    throughout.  Either way parameters, gradients, optimiser and sampler state and injected noise stay
    float32 (the master weights), and the loss is computed in float32; a training loop enters the region
    with :func:`~ursa_ray.methods._training.autocast_body`.
    """

    x: Tensor
    y: Tensor
    likelihood: Likelihood
    make_model: Callable[[], nn.Module]
    generator: torch.Generator
    device: torch.device
    augment: Augment | None = None
    training_precision: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.training_precision not in (None, torch.bfloat16):
            raise ValueError(
                f"training_precision must be None (float32) or torch.bfloat16, got {self.training_precision}"
            )

    @property
    def n_train(self) -> int:
        return int(self.x.shape[0])

    def minibatches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """One epoch of shuffled mini-batches (the last one may be smaller), drawn from ``generator``."""
        order = torch.randperm(self.n_train, generator=self.generator, device="cpu").to(self.device)
        for start in range(0, self.n_train, batch_size):
            index = order[start : start + batch_size]
            xb = self.x[index]
            if self.augment is not None:
                xb = self.augment(xb, self.generator)
            yb = self.y[index]
            yield xb, yb


@dataclass(frozen=True)
class Hyperparameter:
    """One named setting of a method, with its type, default and allowed range (inclusive).

    ``formerly`` lists names this setting had before a rename.  For one release a grid that still uses
    one of them is rejected by validation with a hint to use ``name`` (never silently mapped: a renamed
    setting usually changed its meaning, or its name hid what it does).
    """

    name: str
    kind: type
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    formerly: tuple[str, ...] = ()

    def check(self, value: Any) -> Any:
        """Return ``value`` coerced to ``kind`` or raise ValueError naming what is allowed."""
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.kind is float and isinstance(value, str):
            # YAML 1.1 reads 1e-3 (no dot) as a string; accept it when it is a number
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"expected float, got {value!r}") from None
        if self.kind is bool and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        if self.kind in (int, float) and (isinstance(value, bool) or not isinstance(value, self.kind)):
            raise ValueError(f"expected {self.kind.__name__}, got {value!r}")
        if self.kind is str and not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        if self.kind is list:
            if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
            ):
                raise ValueError(f"expected a list of positive integers, got {value!r}")
            return list(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"expected one of {list(self.choices)}, got {value!r}")
        if self.low is not None and value < self.low:
            raise ValueError(f"expected a value >= {self.low}, got {value!r}")
        if self.high is not None and value > self.high:
            raise ValueError(f"expected a value <= {self.high}, got {value!r}")
        return value

    def describe(self) -> str:
        bounds = ""
        if self.choices is not None:
            bounds = f" one of {list(self.choices)}"
        elif self.low is not None or self.high is not None:
            bounds = (
                f" in [{self.low if self.low is not None else '-inf'}, {self.high if self.high is not None else 'inf'}]"
            )
        renamed = f" (formerly {', '.join(self.formerly)})" if self.formerly else ""
        return f"{self.name} ({self.kind.__name__}{bounds}, default {self.default!r}): {self.doc}{renamed}"


@dataclass(frozen=True)
class Constraint:
    """A rule between some of a method's hyperparameters that their own ranges cannot express (e.g.
    ``burn_in_epochs < epochs``), declared by the method next to its hyperparameters.

    ``names`` are the hyperparameters the rule involves and ``rule`` states it in a few words.
    ``violation(config, n_train)`` returns None when ``config`` (a resolved configuration) satisfies the
    rule, else a one-line message naming the hyperparameters, what is allowed and the values given.
    ``n_train`` is the number of examples a trial trains on; None where it is not known (grid validation),
    and then only the part of the rule that does not depend on it is checked.

    Grid validation evaluates every rule on the resolved configuration of each (method entry, model) pair
    before any trial, and for a search space at every corner of the searched ``names`` (each end of a
    range, each value of a choice).  A rule must therefore be monotone in each numeric hyperparameter it
    involves: holding at the corners of a space then means holding everywhere in it.  A method's
    ``sample_posterior`` checks the same rules, with ``n_train``, before it trains
    (:func:`check_constraints`).
    """

    names: tuple[str, ...]
    rule: str
    violation: Callable[[Mapping[str, Any], int | None], str | None]

    def check(self, config: Mapping[str, Any], n_train: int | None = None) -> None:
        """Raise ValueError with the rule's message when ``config`` violates it."""
        message = self.violation(config, n_train)
        if message is not None:
            raise ValueError(message)


@dataclass(frozen=True)
class StorageCount:
    """What a method keeps to represent its posterior at test time, in numbers stored.

    ``weights`` are the values that scale with the network (its parameters, SWAG's moments and deviations,
    a subspace basis), stored at the bit depth under study; ``other_values`` the few others (learned
    dropout rates, subspace coordinates), counted at 32 bits whatever the bit depth.  Declared by each
    method next to its hyperparameters as ``posterior_storage(sample, config, n_samples)``, where
    ``sample`` is one posterior sample (the network a predictor is, with any parameters the method added),
    ``config`` the resolved configuration and ``n_samples`` the S samples used at test time.
    """

    weights: int
    other_values: int = 0


def n_parameters(network: nn.Module) -> int:
    """P: the number of parameters of ``network`` (every ``nn.Parameter`` entry)."""
    return sum(p.numel() for p in network.parameters())


def sample_networks_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """S networks: S · P weights, P = parameters of one sample.  The storage of a method that declares
    no ``posterior_storage``."""
    return StorageCount(weights=n_samples * n_parameters(sample))


def one_network_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """One network, whatever S: P weights (a point estimate, or a network whose samples are drawn at
    prediction time, such as MC dropout's masks)."""
    return StorageCount(weights=n_parameters(sample))


@dataclass(frozen=True)
class SamplePlan:
    """The shape of a method's sample stream: C = ``n_chains`` chains of S = ``per_chain`` samples each, C·S
    samples in all.  Which samples the adversarial model average keeps depends on it
    (:func:`~ursa_ray.evaluation.adversarial.kept_sample_indices`)."""

    per_chain: int
    n_chains: int = 1

    @property
    def total(self) -> int:
        """C·S, the samples the stream yields."""
        return self.per_chain * self.n_chains


class Method(abc.ABC):
    """An approximate-inference method: a name, its hyperparameters, the constraints between them and a
    sample stream, with a default for everything but the stream (as laplace-torch's ``BaseLaplace`` gives
    its subclasses theirs).

    A subclass declares ``name``, ``description`` and ``hyperparameters`` and implements
    :meth:`sample_posterior`; it overrides a default only where the method differs from it:

    - ``constraints``: rules between hyperparameters (:class:`Constraint`); none by default.
    - ``tasks``: the dataset tasks it supports ("classification", "regression"); None (the default) for every
      task.  Grid validation refuses any other.
    - :meth:`sample_plan`: the shape of the stream, S = ``n_samples`` per chain of C = ``n_chains``.
    - :attr:`sample_posterior_batched` and :meth:`batched_copies`: the streams of several seeds as one
      batched computation, and its memory rule; :attr:`batchable` says whether the subclass has one.
    - ``chains_in_turn_when_unbatchable``: how the stream pools its chains on a network that cannot be
      batched.
    - :meth:`posterior_storage`: what it stores at test time (default S networks).
    - :meth:`warm_up`: one-off costs of a fresh worker (default none).
    - :meth:`model_refusal`: a model the method cannot run with a configuration (default: none refused).
    - ``member_curve``: whether its samples are the members of an ensemble, so that a trial reports the test
      metrics after each member (``members:M`` sets, the curve the deep-ensemble equivalent reads); False.

    An object written against the earlier protocol (the same attributes, no base class) is adapted by
    :func:`as_method`.
    """

    name: str
    description: str
    hyperparameters: tuple[Hyperparameter, ...]
    constraints: tuple[Constraint, ...] = ()
    tasks: tuple[str, ...] | None = None
    member_curve: bool = False
    """Whether its samples are the members of an ensemble (see the class docstring)."""
    chains_in_turn_when_unbatchable: bool = False
    """Whether, on a network that cannot be batched (:func:`~ursa_ray.methods.batched.can_batch`), the stream
    yields its chains one after another (chain 1's S samples, then chain 2's, ...) rather than interleaved
    (at each sampling step chain 1's sample, then chain 2's, ...: every batched stream, and the default)."""

    @abc.abstractmethod
    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        """Yield the :meth:`sample_plan`'s C·S posterior samples as predictors, each valid until the next
        is asked for; counters worth recording go into ``stats``.  The one thing every method writes."""

    def sample_plan(self, config: Mapping[str, Any], problem: Problem) -> SamplePlan:
        """The shape of :meth:`sample_posterior`'s stream for ``config`` on ``problem``: S = ``n_samples``
        (1 where the method declares none: a point estimate), C = ``n_chains`` (1 where none)."""
        return SamplePlan(int(config.get("n_samples", 1)), int(config.get("n_chains", 1)))

    sample_posterior_batched: BatchedStream | None = None
    """None (the default), or ``sample_posterior_batched(problems, config, stats)``: the streams of several
    problems (seeds of one grid cell: same N, same configuration, a batchable network) as one batched
    computation (:mod:`ursa_ray.methods.batched`); each item holds one predictor per problem, the s-th sample
    of each problem's stream, and each stream must be what :meth:`sample_posterior` would give that problem
    (up to float order, or in distribution where it draws from torch's global generator).  A subclass with
    one defines it as a method."""

    @property
    def batchable(self) -> bool:
        """Whether the method has a batched stream (:attr:`sample_posterior_batched` is not None)."""
        return self.sample_posterior_batched is not None

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """The memory rule of the batched run: one problem's share, in networks' training state (the unit of
        :func:`~ursa_ray.methods.batched.max_copies`): the networks it trains side by side (ensemble
        members, chains) plus what it keeps beside them (SWAG's moments, a Laplace posterior); default 1."""
        return 1

    def posterior_storage(self, sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
        """What the method stores to represent its posterior at test time (:class:`StorageCount`); default
        S networks (:func:`sample_networks_storage`)."""
        return sample_networks_storage(sample, config, n_samples)

    def model_refusal(self, model: Any, config: Mapping[str, Any]) -> str | None:
        """None when the method can run ``config`` on ``model`` (a :class:`~ursa_ray.models.base.ModelSpec`),
        else a one-line reason naming the hyperparameters and what would work; grid validation asks for every
        (method entry, model) pair it runs, at every corner of the entry's search space.  Default: None."""
        return None

    def warm_up(self, device: torch.device) -> None:
        """Pay the method's one-off costs in a fresh worker (compiling kernels) before any timed trial;
        :func:`ursa_ray.trial.warm_up_worker` calls it the first time a worker process runs the method.  Nothing
        by default."""
        return None


class EarlierProtocolMethod(Method):
    """A method object written against the earlier protocol, without the base class: its own ``name``,
    ``description``, ``hyperparameters`` and ``sample_posterior``, and whichever of the optional
    attributes it has (``constraints``, ``tasks``, ``sample_posterior_batched``, ``batched_copies``,
    ``posterior_storage``, ``warm_up``); the base class's defaults for the others.  Each attribute is read
    from the object when asked for."""

    def __init__(self, item: Any):
        self.item = item

    @property
    def name(self) -> str:
        return self.item.name

    @property
    def description(self) -> str:
        return self.item.description

    @property
    def hyperparameters(self) -> tuple[Hyperparameter, ...]:
        return self.item.hyperparameters

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        return getattr(self.item, "constraints", ())

    @property
    def tasks(self) -> tuple[str, ...] | None:
        return getattr(self.item, "tasks", None)

    @property
    def chains_in_turn_when_unbatchable(self) -> bool:
        return getattr(self.item, "chains_in_turn_when_unbatchable", False)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        return self.item.sample_posterior(problem, config, stats)

    def sample_plan(self, config: Mapping[str, Any], problem: Problem) -> SamplePlan:
        own = getattr(self.item, "sample_plan", None)
        return own(config, problem) if own is not None else super().sample_plan(config, problem)

    @property
    def sample_posterior_batched(self) -> BatchedStream | None:  # type: ignore[override]
        return getattr(self.item, "sample_posterior_batched", None)

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        own = getattr(self.item, "batched_copies", None)
        return own(config, model) if own is not None else 1

    def posterior_storage(self, sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
        own = getattr(self.item, "posterior_storage", None) or sample_networks_storage
        return own(sample, config, n_samples)

    def model_refusal(self, model: Any, config: Mapping[str, Any]) -> str | None:
        own = getattr(self.item, "model_refusal", None)
        return own(model, config) if own is not None else None

    def warm_up(self, device: torch.device) -> None:
        own = getattr(self.item, "warm_up", None)
        if own is not None:
            own(device)


def as_method(item: Any) -> Method:
    """``item`` itself when it subclasses :class:`Method`, else ``item`` adapted
    (:class:`EarlierProtocolMethod`)."""
    return item if isinstance(item, Method) else EarlierProtocolMethod(item)


def passes(model: nn.Module, n_samples: int, stats: dict[str, float]) -> Iterator[Predictor]:
    """The stream of a method whose one trained network is stochastic at test time (dropout masks, weight
    noise drawn in each forward pass): ``model`` yielded ``n_samples`` times, each counted in
    ``stats["n_samples"]``."""
    for s in range(n_samples):
        stats["n_samples"] = s + 1
        yield model


def batched_passes(
    models: list[nn.Module], n_samples: int, stats: Sequence[dict[str, float]]
) -> Iterator[list[Predictor]]:
    """:func:`passes` for every copy of a batched run: ``models`` (one per problem) yielded ``n_samples``
    times, each counted in every problem's ``stats``."""
    for s in range(n_samples):
        for one in stats:
            one["n_samples"] = s + 1
        yield models


def resolve_config(method: Method, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``method`` updated with ``overrides``; each value checked, unknown names rejected."""
    declared = {h.name: h for h in method.hyperparameters}
    config = {h.name: h.default for h in method.hyperparameters}
    for name, value in overrides.items():
        if name not in declared:
            raise KeyError(name)
        config[name] = declared[name].check(value)
    return config


def check_constraints(method: Method, config: Mapping[str, Any], n_train: int | None = None) -> None:
    """Raise ValueError with the message of the first of ``method``'s constraints that ``config`` violates
    (``n_train``: the number of training examples, None where unknown; see :class:`Constraint`)."""
    for constraint in method.constraints:
        constraint.check(config, n_train)


def posterior_storage_count(
    method: Method, sample: nn.Module, config: Mapping[str, Any], n_samples: int
) -> StorageCount:
    """What ``method`` stores for its posterior: its ``posterior_storage`` declaration, else S networks
    (:func:`sample_networks_storage`)."""
    return as_method(method).posterior_storage(sample, config, n_samples)


def _channels_last(p: Tensor) -> bool:
    """A 4-D tensor laid out N, H, W, C in memory (the layout a GPU trial gives convolution weights)."""
    return p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last)


def memory_order(p: Tensor) -> Tensor:
    """``p`` (a view of it) with its dimensions in memory order: N, H, W, C for a channels-last tensor."""
    return p.permute(0, 2, 3, 1) if _channels_last(p) else p


def view_as_parameter(chunk: Tensor, p: Tensor) -> Tensor:
    """The 1-D ``chunk`` seen with ``p``'s shape and memory layout (values in :func:`memory_order`)."""
    if _channels_last(p):
        n, c, h, w = p.shape
        return chunk.view(n, h, w, c).permute(0, 3, 1, 2)
    return chunk.view_as(p)


def flat_parameters(model: nn.Module) -> Tensor:
    """All trainable parameters of ``model`` as one detached vector, each parameter's values in memory order
    (:func:`memory_order`: N, H, W, C for a channels-last convolution weight), so that flat views of the
    parameters keep their layout."""
    return torch.cat([memory_order(p.detach()).reshape(-1) for p in model.parameters()])


def load_flat_parameters(model: nn.Module, vector: Tensor) -> None:
    """Copy ``vector`` (as produced by :func:`flat_parameters`) into the parameters of ``model``."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(view_as_parameter(vector[offset : offset + n], p))
            offset += n
