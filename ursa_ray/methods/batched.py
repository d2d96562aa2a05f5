"""Batched copies of one small network: C independent copies (seeds, ensemble members or chains) trained as
one computation with ``torch.func``.

The copies' parameters live in one ``(C, P)`` tensor ``theta`` (copy c's P values contiguous in row c, in
the order of :func:`~ursa_ray.methods.base.flat_parameters`).  A forward pass of all copies is
``vmap(functional_call)`` of the architecture over the rows of ``theta`` and a ``(C, B, ...)`` stack of
mini-batches; the training loss is the *sum* of the copies' own losses, so that ∂loss/∂theta[c] is exactly
copy c's own gradient.  Every update the methods apply -- SGD with momentum and weight decay, Adam, the
Langevin and SGHMC steps -- is elementwise, so an optimiser over ``theta`` computes for each copy what it
would alone, up to floating-point order.

Each copy keeps its own ``nn.Module`` (the one ``problem.make_model()`` built for it) whose parameters are
re-seated as views of its row of ``theta``: it is the copy's predictor, evaluated exactly as an unbatched
network would be.  Each copy also keeps its own ``torch.Generator`` for its mini-batch order (and its
bootstrap resample), so that no two copies share a random stream.

Dropout inside the batched forward draws its masks with ``vmap(randomness="different")``: independent
masks per copy from torch's global generator.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from ursa_ray.evaluation.precision import Float32Linear
from ursa_ray.methods._training import minimise
from ursa_ray.methods.base import Likelihood, Problem, flat_parameters, view_as_parameter

warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
# (the gradient views of StackedNetworks are strided like their parameters' rows; accumulating into them is
# intended and correct, torch warns because it would have chosen another layout for a fresh gradient)

MAX_BATCHED_PARAMETERS = 5_000_000
"""Networks with more parameters than this run one copy at a time (a ResNet50 has 23.5 million): batching
pays for small networks, whose step is dominated by per-operation overhead, not arithmetic."""

COPY_MEMORY_BUDGET = 2 * 1024**3
"""Bytes the copies of one batched run may take for parameters, gradients, optimiser state and a
mini-batch's activations (see :func:`max_copies`)."""


def can_batch(model: nn.Module, problem: Problem) -> bool:
    """Whether copies of ``model`` can be batched: no buffers (batch norm's running statistics are per-copy
    state a functional call would not update), no augmentation (it draws per batch, not per copy), no
    channels-last weights, and at most :data:`MAX_BATCHED_PARAMETERS` parameters."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    channels_last = any(p.dim() == 4 and not p.is_contiguous() for p in params)  # a (C, P) row view cannot hold it
    return not list(model.buffers()) and problem.augment is None and n <= MAX_BATCHED_PARAMETERS and not channels_last


def max_copies(model: nn.Module, batch_size: int, input_numel: int) -> int:
    """How many copies of ``model`` fit :data:`COPY_MEMORY_BUDGET`: each takes 4 float32 values per
    parameter (the value, its gradient, two optimiser moments) plus, per example of a mini-batch, its
    input and 3 values per hidden unit (activation, dropout mask, gradient), the hidden units counted as
    the output sizes of its linear layers."""
    n_params = sum(p.numel() for p in model.parameters())
    hidden = sum(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    per_copy = 4 * (4 * n_params + batch_size * (input_numel + 3 * hidden))
    return max(1, COPY_MEMORY_BUDGET // per_copy)


class StackedNetworks:
    """C copies of one architecture (the ``models``, each freshly initialised) with their parameters in the
    rows of one tensor ``theta`` of shape (C, P), and each model's parameters views of its row.

    ``theta.grad`` is a (C, P) buffer; :meth:`parameters` are the named parameters of all copies as
    (C, *shape) leaf tensors that are views of ``theta``, each with ``.grad`` the matching view of
    ``theta.grad``, so a backward pass accumulates every copy's gradient in place into ``theta.grad``
    (no concatenation of the per-layer gradients) and an optimiser over ``[theta]`` updates every copy's
    own model.  Zero it with :meth:`zero_grad`, never ``zero_grad(set_to_none=True)``."""

    def __init__(self, models: Sequence[nn.Module]):
        if not models:
            raise ValueError("StackedNetworks needs at least one model")
        self.models = list(models)
        self.template = self.models[0]
        self.names = [name for name, _ in self.template.named_parameters()]
        self.shapes = [p.shape for p in self.template.parameters()]
        if any([p.shape for p in m.parameters()] != self.shapes for m in self.models):
            raise ValueError("the copies of a StackedNetworks must share one architecture")
        self.sizes = [math.prod(s) for s in self.shapes]
        with torch.no_grad():
            self.theta = torch.stack([flat_parameters(m) for m in self.models])
        self.theta.grad = torch.zeros_like(self.theta)
        n_copies = self.theta.shape[0]
        self._leaves: dict[str, Tensor] = {}
        offset = 0
        for name, shape, n in zip(self.names, self.shapes, self.sizes, strict=True):
            leaf = self.theta[:, offset : offset + n].view(n_copies, *shape).requires_grad_(True)
            leaf.grad = self.theta.grad[:, offset : offset + n].view(n_copies, *shape)
            self._leaves[name] = leaf
            offset += n
        for c, model in enumerate(self.models):
            offset = 0
            for p, n in zip(model.parameters(), self.sizes, strict=True):
                p.data = view_as_parameter(self.theta[c, offset : offset + n], p)
                offset += n
        self._forward = vmap(self._one, randomness="different")
        self._forward_with_features = vmap(self._one_with_features, randomness="different")
        self._layers = _plain_layers(self.template)

    def parameters(self) -> dict[str, Tensor]:
        """The named parameters of every copy: (C, *shape) leaves whose gradients land in ``theta.grad``."""
        return self._leaves

    def zero_grad(self) -> None:
        self.theta.grad.zero_()

    def parameters_of(self, theta: Tensor) -> dict[str, Tensor]:
        """The named parameters of every copy as (C, *shape) views of another (C, P) tensor ``theta`` (HMC's
        positions; gradients through them reach ``theta`` by autograd)."""
        chunks = torch.split(theta, self.sizes, dim=1)
        return {
            name: chunk.view(theta.shape[0], *shape)
            for name, chunk, shape in zip(self.names, chunks, self.shapes, strict=True)
        }

    def _one(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.template, params, (x,))

    def __call__(self, x: Tensor) -> Tensor:
        """Outputs of every copy on its own inputs: ``x`` (C, B, ...) → (C, B, n_outputs).

        A plain MLP (``nn.Sequential`` of Flatten, Linear, ReLU and Dropout) runs as batched matrix
        products, ``baddbmm`` per linear layer; any other network through ``vmap(functional_call)``.
        Both compute the same function; the first has less per-operation overhead (measured in
        ``benchmarks/bench_vectorised.py``)."""
        if self._layers is None:
            return self._forward(self._leaves, x)
        return self.forward_with_features(x)[0]

    def forward_with_features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Outputs of every copy and the inputs of their output layer (the last ``nn.Linear``), (C, B, F):
        the penultimate features.  A plain MLP as batched matrix products; any other network through
        ``vmap(functional_call)`` with a forward hook on its output layer."""
        if self._layers is None:
            return self._forward_with_features(self._leaves, x)
        params = self._leaves
        h = features = x
        for name, layer in self._layers:
            if isinstance(layer, nn.Linear):
                features = h
                weight, bias = params[f"{name}.weight"], params.get(f"{name}.bias")
                if isinstance(layer, Float32Linear):  # float32 under autocast too, as the layer computes
                    with torch.autocast(h.device.type, enabled=False):
                        h = _batched_linear(h.float(), weight.float(), None if bias is None else bias.float())
                else:
                    h = _batched_linear(h, weight, bias)
            elif isinstance(layer, nn.Flatten):
                h = h.reshape(h.shape[0], h.shape[1], -1)
            else:  # ReLU, or Dropout: elementwise, so each copy gets its own mask
                h = layer(h)
        return h, features

    def _one_with_features(self, params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        kept: list[Tensor] = []
        output_layer = [m for m in self.template.modules() if isinstance(m, nn.Linear)][-1]
        handle = output_layer.register_forward_hook(lambda module, inputs, output: kept.append(inputs[0]))
        try:
            outputs = functional_call(self.template, params, (x,))
        finally:
            handle.remove()
        return outputs, kept[-1]

    def train(self, mode: bool = True) -> None:
        """Training (or evaluation) mode for every copy; the batched forward follows the template's mode."""
        for model in self.models:
            model.train(mode)


def _batched_linear(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """y_c = h_c W_cᵀ + b_c for every copy c: (C, B, in), (C, out, in), (C, out) → (C, B, out)."""
    if bias is None:
        return torch.bmm(h, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))


def _plain_layers(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The named layers of ``model`` when it is an ``nn.Sequential`` of Flatten (of the whole input),
    Linear, ReLU and Dropout layers only, else None.  A linear layer is an ``nn.Linear`` or the
    :class:`~ursa_ray.evaluation.precision.Float32Linear` a GPU trial makes of the output layer (computed
    in float32 here too); any other subclass may compute something else, so it is not plain."""
    if type(model) is not nn.Sequential:
        return None
    layers = list(model.named_children())
    for _, layer in layers:
        if type(layer) not in (nn.Linear, Float32Linear, nn.ReLU, nn.Dropout) and not (
            type(layer) is nn.Flatten and layer.start_dim == 1 and layer.end_dim == -1
        ):
            return None
    return layers


@dataclass
class CopyData:
    """The training data of C copies, gathered per step into (C, B, ...) mini-batches without stacking C
    copies of the inputs: the copies share one input tensor ``x`` (N, ...) when their problems' inputs are
    equal (the usual case: seeds of a final phase, members of an ensemble), each with its own row index
    ``rows[c]`` (a bootstrap resample, or all N rows) and its own targets ``y[c]``."""

    x: list[Tensor]
    """The distinct input tensors; copy c reads ``x[source[c]]``."""
    source: list[int]
    rows: Tensor
    """(C, N) indices into the copy's input tensor."""
    y: Tensor
    """(C, N) targets, already permuted by ``rows``."""
    generators: list[torch.Generator]
    precision: torch.dtype | None = None
    """The problems' ``training_precision``: the autocast dtype of the copies' forward passes."""

    @property
    def n_train(self) -> int:
        return self.rows.shape[1]

    @classmethod
    def from_problems(
        cls, problems: Sequence[Problem], generators: Sequence[torch.Generator], rows: Sequence[Tensor | None]
    ) -> CopyData:
        """One copy per entry of ``problems`` (the same problem may appear once per ensemble member), each
        drawing its mini-batch order from its own generator and training on ``problem.x[rows[c]]`` (all
        rows when None)."""
        distinct: list[Tensor] = []
        source: list[int] = []
        for problem in problems:
            match = next((i for i, x in enumerate(distinct) if x is problem.x or _same(x, problem.x)), None)
            if match is None:
                distinct.append(problem.x)
                match = len(distinct) - 1
            source.append(match)
        n = problems[0].n_train
        if any(p.n_train != n for p in problems):
            raise ValueError("batched copies need the same number of training examples")
        device = problems[0].x.device
        index = torch.stack([torch.arange(n, device=device) if r is None else r.to(device) for r in rows])
        y = torch.stack([p.y[i] for p, i in zip(problems, index, strict=True)])
        return cls(distinct, source, index, y, list(generators), problems[0].training_precision)

    def minibatches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """One epoch of (C, B, ...) inputs and (C, B) targets, each copy in its own shuffled order (drawn
        from its own generator, as :meth:`Problem.minibatches` draws one copy's)."""
        device = self.rows.device
        order = torch.stack([torch.randperm(self.n_train, generator=g, device="cpu") for g in self.generators])
        order = order.to(device)
        for start in range(0, self.n_train, batch_size):
            index = order[:, start : start + batch_size]
            rows = torch.gather(self.rows, 1, index)
            if len(self.x) == 1:
                xb = self.x[0][rows]
            else:
                xb = torch.stack([self.x[s][r] for s, r in zip(self.source, rows, strict=True)])
            yield xb, torch.gather(self.y, 1, index)


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))


def batched_nll(likelihood: Likelihood) -> Callable[[Tensor, Tensor], Tensor]:
    """The per-copy mean negative log-likelihood of (C, B, out) outputs against (C, B) targets, shape (C,):
    ``likelihood.log_prob`` of all C·B examples at once, averaged per copy (no ``vmap``: one call)."""

    def nll(outputs: Tensor, targets: Tensor) -> Tensor:
        copies, batch = targets.shape[:2]
        log_prob = likelihood.log_prob(outputs.flatten(0, 1), targets.flatten(0, 1))
        return -log_prob.view(copies, batch).mean(1)

    return nll


def copy_generators(problem: Problem, n_copies: int) -> list[torch.Generator]:
    """Generators of ``n_copies`` copies trained on one problem (ensemble members, chains), seeded from
    ``problem.generator`` (one 63-bit draw each, before any copy starts): each copy's mini-batch order,
    bootstrap resample and noise are its own stream, the same whether or not other problems' copies are
    batched with them."""
    seeds = torch.randint(2**63 - 1, (n_copies,), generator=problem.generator, device="cpu").tolist()
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def train_sgd_copies(
    stacked: StackedNetworks,
    data: CopyData,
    likelihood: Likelihood,
    config: Mapping[str, Any],
    loss_fn: Callable[[StackedNetworks, Tensor, Tensor], Tensor] | None = None,
) -> int:
    """:func:`~ursa_ray.methods._training.train_sgd` for every copy at once: SGD with momentum and weight
    decay (elementwise, so exact per copy) on Σ_c −mean_B log p(y_c | x_c, θ_c), or on
    Σ_c ``loss_fn(stacked, xb, yb)[c]`` when given; same schedule.  Returns the steps taken."""
    optimiser = torch.optim.SGD(
        [stacked.theta], lr=config["lr"], momentum=config["momentum"], weight_decay=config["weight_decay"], fused=True
    )  # fused: one pass over the (C, P) parameters, not four
    nll = batched_nll(likelihood)

    def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
        losses = nll(stacked(xb), yb) if loss_fn is None else loss_fn(stacked, xb, yb)
        return losses.sum()

    stacked.train()
    steps, _ = minimise(
        data.minibatches, data.n_train, config, optimiser, config["epochs"], loss_at, stacked.zero_grad, data.precision
    )
    return steps


def train_adam_copies(
    stacked: StackedNetworks,
    data: CopyData,
    loss_fn: Callable[[Tensor, Tensor, float], Tensor],
    config: Mapping[str, Any],
) -> tuple[int, Tensor]:
    """:func:`~ursa_ray.methods._training.train_adam` for every copy at once (Adam is elementwise, so exact
    per copy): minimise Σ_c ``loss_fn(xb, yb, progress)[c]``.  Returns (steps, the copies' last losses)."""
    optimiser = torch.optim.Adam([stacked.theta], lr=config["lr"], fused=True)
    last: list[Tensor] = []

    def loss_at(xb: Tensor, yb: Tensor, progress: float) -> Tensor:
        losses = loss_fn(xb, yb, progress)
        last[:] = [losses.detach()]
        return losses.sum()

    stacked.train()
    steps, _ = minimise(
        data.minibatches, data.n_train, config, optimiser, config["epochs"], loss_at, stacked.zero_grad, data.precision
    )
    return steps, last[0]
