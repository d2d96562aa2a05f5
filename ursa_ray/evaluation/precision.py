"""Mixed-precision evaluation: where it is used, and the float32 output layer that keeps it honest.

On a GPU, classification evaluation runs the network body under bfloat16 autocast.  The output layer does
not: bfloat16 has 8 significant bits, so at logits of 8–32 its spacing (0.06–0.125) is as large as the
spread between posterior samples on confident inputs, and the mutual information (a small difference of
entropies) would become rounding noise.  The output layer, the softmax and the accumulation therefore stay
float32 or wider (the accumulators work in float64).  ``tests/test_mixed_precision.py`` checks the result
on the CPU with the same autocast: mutual-information AUROCs move by at most 0.002.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def evaluation_precision(device: torch.device, task: str) -> torch.dtype | None:
    """bfloat16 autocast for the body of a classification network on a GPU; else None (full float32).

    Regression stays in float32: its uncertainties are compared with the exact anchor at a few per cent.
    """
    return torch.bfloat16 if device.type == "cuda" and task == "classification" else None


class Float32Linear(nn.Linear):
    """An ``nn.Linear`` that computes y = x Wᵀ + b in float32 even inside an autocast region."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return nn.functional.linear(x.float(), self.weight.float(), bias)


def keep_output_layer_float32(model: nn.Module, n_outputs: int) -> nn.Module:
    """Make the output layer of ``model`` (its last ``nn.Linear`` with ``n_outputs`` outputs) compute in
    float32 under autocast, in place, and return ``model``.

    The layer's class becomes :class:`Float32Linear` (a subclass of ``nn.Linear`` with the same parameters
    and state-dict keys), so copies, flat parameter views and ``isinstance`` checks see the same layer.
    A model without such a layer is returned unchanged.
    """
    heads = [m for m in model.modules() if type(m) is nn.Linear and m.out_features == n_outputs]
    if heads:
        heads[-1].__class__ = Float32Linear
    return model
