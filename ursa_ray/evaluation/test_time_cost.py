"""Test-time cost of a posterior: FLOPs per prediction, storage of the posterior representation, and the
bit depth at which each sample's weights are stored (definitions: docs/test-time-cost.md).

**FLOPs.**  :func:`forward_flops` counts one forward pass of one example with
``torch.utils.flop_counter.FlopCounterMode``: matrix products and convolutions only, each
multiply-accumulate as 2 FLOPs (a Linear layer with n_in inputs and n_out outputs costs 2·n_in·n_out, a
convolution 2·C_out·H_out·W_out·(C_in/groups)·k_h·k_w).  Bias additions, activations, normalisation,
pooling, dropout masks, softmax and other elementwise operations are not counted.  A prediction averages
S_test samples, so FLOPs per prediction = S_test · forward FLOPs (:func:`flops_per_prediction`).

**Storage.**  Each method declares what it keeps (:class:`ursa_ray.methods.base.StorageCount`: weights
and other values); at b bits per weight that is ``weights · b/8 + other_values · 4`` bytes
(:func:`storage_bytes`), b = 32, 16, 8: the nominal size at each bit depth.

**Bit depth.**  :func:`quantise_module` stores a sample's weights at a lower bit depth and back:

- ``float16``, ``bfloat16``: every parameter rounded to that type (round to nearest even) and back to float32;
- ``int8``: per-output-channel symmetric weight-only quantisation of every parameter with two or more
  dimensions (weight matrices, convolution kernels; variational dropout's per-weight log σ² too): for
  output channel c (the first dimension), scale_c = max|w_c| / 127, w_q = clamp(round(w / scale_c), −127,
  127), and the sample is evaluated with w_q · scale_c (a channel of zeros stays zero).  Biases and
  normalisation parameters (one dimension or none) stay float32, as do buffers (batch-norm running
  statistics) in every scheme.

:func:`evaluate_at_bit_depths` evaluates one posterior sample at each scheme, with the same random draws
(dropout masks, weight noise) as the float32 evaluation that follows it; memory stays flat in S.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ursa_ray.methods.base import Method, StorageCount, posterior_storage_count

BITS_PER_WEIGHT = (32, 16, 8)
"""Bit depths at which storage is reported."""

QUANTISATION_SCHEMES = ("float16", "bfloat16", "int8")
"""Bit depths at which a sample's weights can be stored for evaluation (float32 is the reference)."""

INT8_LEVELS = 127
"""Largest int8 code of the symmetric scheme: codes in [−127, 127] (−128 unused, so the grid is symmetric)."""

_ROUND_TRIP_TYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer."""
    tensor = next(iter(module.parameters()), None)
    if tensor is None:
        tensor = next(iter(module.buffers()))
    return tensor.device


@contextmanager
def _forked_rng(device: torch.device) -> Iterator[None]:
    """Random draws inside leave torch's generators (CPU, and ``device``'s when it is a GPU) as they were."""
    gpu = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if gpu else [], device_type="cuda"):
        yield


# ----------------------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------------------


def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward pass of ``model`` on one example of shape ``input_shape`` (no batch dimension).

    Counted by ``FlopCounterMode`` on a zero input: matrix products and convolutions, 2 FLOPs per
    multiply-accumulate; bias additions and elementwise operations are not counted (module docstring).
    A network that computes more than one product per layer is charged for each (variational dropout's
    local reparameterisation: x θᵀ and x² (α θ²)ᵀ, twice the matrix FLOPs of its network).  The pass runs
    in evaluation mode (a batch-norm layer would reject one example in training mode); every module's
    mode, the parameters and torch's random generators are left as they were.
    """
    modes = {module: module.training for module in model.modules()}
    device = _device(model)
    counter = FlopCounterMode(display=False)
    try:
        model.eval()
        with torch.no_grad(), _forked_rng(device), counter:
            model(torch.zeros((1, *input_shape), device=device))
    finally:
        for module, training in modes.items():
            module.training = training
    return int(counter.get_total_flops())


def flops_per_prediction(flops_per_forward: int, n_samples: int) -> int:
    """S_test · forward FLOPs: a prediction of the posterior predictive runs every one of the S_test samples."""
    return n_samples * flops_per_forward


# ----------------------------------------------------------------------------------------------------
# Storage
# ----------------------------------------------------------------------------------------------------


def storage_bytes(count: StorageCount, bits: int) -> int:
    """Bytes of the posterior representation at ``bits`` per weight: ⌈weights · bits / 8⌉ + 4 · other values
    (other values at 32 bits whatever the bit depth)."""
    if bits < 1:
        raise ValueError(f"bits per weight must be at least 1, got {bits}")
    return -(-count.weights * bits // 8) + 4 * count.other_values


def cost_metrics_at_test_time(
    method: Method, sample: nn.Module, config: Mapping[str, Any], n_samples: int, input_shape: tuple[int, ...]
) -> dict[str, float]:
    """The test-time cost of a trial, by metric name: ``forward_flops``, ``flops_per_prediction``,
    ``storage_weights``, ``storage_other_values`` and ``storage_bytes_{32,16,8}``.

    ``sample`` is one posterior sample of the trial (any of them: only its structure is used), ``config``
    the resolved configuration and ``n_samples`` the S samples its predictive averaged.
    """
    flops = forward_flops(sample, input_shape)
    count = posterior_storage_count(method, sample, config, n_samples)
    return {
        "forward_flops": float(flops),
        "flops_per_prediction": float(flops_per_prediction(flops, n_samples)),
        "storage_weights": float(count.weights),
        "storage_other_values": float(count.other_values),
        **{f"storage_bytes_{bits}": float(storage_bytes(count, bits)) for bits in BITS_PER_WEIGHT},
    }


# ----------------------------------------------------------------------------------------------------
# Bit depth
# ----------------------------------------------------------------------------------------------------


def int8_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(codes, scales) of the symmetric per-output-channel int8 quantisation of ``weight`` (≥ 2 dimensions).

    scale_c = max|w_c| / 127 over output channel c (the first dimension; 1 for a channel of zeros, whose
    codes are 0), codes = clamp(round(w / scale_c), −127, 127) as int8; ``scales`` has ``weight``'s number of
    dimensions (size 1 except the first), so ``codes * scales`` is the dequantised weight.  Each dequantised
    weight is within scale_c / 2 of the original, and a weight already on the grid (an integer multiple of
    scale_c) is reproduced exactly.
    """
    if weight.dim() < 2:
        raise ValueError(f"int8 per-channel quantisation needs a weight of two or more dimensions, got {weight.dim()}")
    largest = weight.abs().amax(dim=tuple(range(1, weight.dim())), keepdim=True)
    scales = torch.where(largest > 0, largest / INT8_LEVELS, torch.ones_like(largest))
    codes = torch.round(weight / scales).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return codes, scales


def quantise_tensor(tensor: Tensor, scheme: str) -> Tensor | None:
    """``tensor`` stored at ``scheme`` and read back in its own dtype, as a new tensor; None where the scheme
    leaves it as it is (int8 keeps tensors of fewer than two dimensions: biases, normalisation parameters)."""
    if scheme in _ROUND_TRIP_TYPES:
        return tensor.to(_ROUND_TRIP_TYPES[scheme]).to(tensor.dtype)
    if scheme == "int8":
        if tensor.dim() < 2:
            return None
        codes, scales = int8_per_channel(tensor)
        return codes.to(tensor.dtype) * scales
    raise ValueError(f"unknown quantisation scheme {scheme!r}; expected one of {list(QUANTISATION_SCHEMES)}")


@contextmanager
def quantise_module(module: nn.Module, scheme: str) -> Iterator[nn.Module]:
    """Inside the block, ``module``'s parameters hold their values stored at ``scheme`` (module docstring);
    on exit, even on an error, the original values are copied back bit for bit.

    Works in place, on the same tensors (views into a method's flat parameter vector stay views): the
    original values of the changed parameters are kept in one copy of them while the block runs, plus one
    parameter's quantised values at a time while they are written.
    """
    originals: list[tuple[nn.Parameter, Tensor]] = []
    try:
        with torch.no_grad():
            for parameter in module.parameters():
                stored = quantise_tensor(parameter.detach(), scheme)
                if stored is None:
                    continue
                originals.append((parameter, parameter.detach().clone()))
                parameter.copy_(stored)
                del stored
        yield module
    finally:
        with torch.no_grad():
            for parameter, original in originals:
                parameter.copy_(original)


def evaluate_at_bit_depths(
    predictor: nn.Module, evaluate: Callable[[str], None], schemes: tuple[str, ...] = QUANTISATION_SCHEMES
) -> None:
    """Call ``evaluate(scheme)`` for each scheme while ``predictor``'s weights are stored at it.

    Each call starts from the random generators' state on entry, and that state is restored on return, so
    every scheme and the float32 evaluation made right after this function see the same dropout masks and
    weight noise (the same posterior sample), and the trial's random stream is as without it.  Parameters
    are restored bit for bit after each scheme (:func:`quantise_module`); nothing is kept between calls,
    so calling it once per sample keeps memory flat in S.
    """
    device = _device(predictor)
    for scheme in schemes:
        with _forked_rng(device), quantise_module(predictor, scheme):
            evaluate(scheme)
