"""Recurrent sequence classifiers, ``lstm`` and ``gru``, with variational RNN dropout (Gal & Ghahramani 2016).

Input: a batch of sequences, shape (B, T, F).  Each layer (and each direction, when bidirectional) runs the
cell over time; the classifier reads the top layer's last state (for a bidirectional network: the forward
direction's last state and the backward direction's state at t = 1) or the mean of its states over time
(``pooling``), through a dropout slot, into a Linear head.

The cells are the PyTorch parameterisation written out with ``nn.Linear`` maps (a test checks them against
``nn.LSTM`` / ``nn.GRU`` with copied weights), so every method that works on Linear layers works here
(Laplace, variational and concrete dropout, the batched ``torch.func`` training):

- LSTM: (i, f, g, o) = (σ, σ, tanh, σ)(W_x x_t + b_x + W_h h_{t−1} + b_h), c_t = f c_{t−1} + i g,
  h_t = o tanh(c_t);
- GRU: (r, z) = σ(W_x^{rz} x_t + b_x^{rz} + W_h^{rz} h_{t−1} + b_h^{rz}), n = tanh(W_x^n x_t + b_x^n
  + r (W_h^n h_{t−1} + b_h^n)), h_t = (1 − z) n + z h_{t−1}.

**Variational dropout.**  Every cell has two ``nn.Dropout`` slots, on its input x_t and on its recurrent
state h_{t−1}.  Each slot draws its mask once per sequence, ``dropout(ones(B, width))``, and applies that
same mask at every time step (Gal & Ghahramani 2016, "A theoretically grounded application of dropout in
recurrent neural networks"), never a fresh mask per step.  The model option ``dropout`` is the rate between
layers (on the input of layers 2, 3, …); the other slots start at rate 0, for a method (MC dropout) to set.

**Variable lengths.**  A time step whose features are NaN is padding (:mod:`ursa_ray.data.sequence` pads
shorter sequences so): the state is carried over it unchanged and mean pooling skips it, so a padded
sequence gives exactly what the shorter sequence gives (the effect of packing).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.models.base import ModelSpec

GATES = {"lstm": 4, "gru": 3}
POOLING = ("last", "mean")


class RecurrentCell(nn.Module):
    """One direction of one layer: input dropout slot, input map W_x, recurrent dropout slot, recurrent map
    W_h (in this order, so that each dropout slot precedes the weight layer it feeds)."""

    def __init__(self, kind: str, n_in: int, hidden: int, input_rate: float) -> None:
        super().__init__()
        self.kind, self.hidden = kind, hidden
        self.input_dropout = nn.Dropout(input_rate)
        self.input_map = nn.Linear(n_in, GATES[kind] * hidden)
        self.hidden_dropout = nn.Dropout(0.0)
        self.hidden_map = nn.Linear(hidden, GATES[kind] * hidden)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """States h_t (B, T, H) of the sequences ``x`` (B, T, F); ``valid`` (B, T) marks non-padding steps,
        over which the state is carried unchanged.  One input and one recurrent mask per sequence."""
        input_mask = self.input_dropout(torch.ones_like(x[:, 0, :]))
        projected = self.input_map(x * input_mask.unsqueeze(1))  # every step's W_x x_t + b_x at once
        h = torch.zeros_like(projected[:, 0, : self.hidden])
        c = torch.zeros_like(h)
        hidden_mask = self.hidden_dropout(torch.ones_like(h))
        states = []
        for t in range(x.shape[1]):
            recurrent = self.hidden_map(h * hidden_mask)
            if self.kind == "lstm":
                i, f, g, o = (projected[:, t] + recurrent).chunk(4, dim=-1)
                c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h_new = torch.sigmoid(o) * torch.tanh(c_new)
                c = torch.where(valid[:, t, None], c_new, c)
            else:
                x_r, x_z, x_n = projected[:, t].chunk(3, dim=-1)
                h_r, h_z, h_n = recurrent.chunk(3, dim=-1)
                r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
                h_new = (1 - z) * torch.tanh(x_n + r * h_n) + z * h
            h = torch.where(valid[:, t, None], h_new, h)
            states.append(h)
        return torch.stack(states, dim=1)


class RecurrentClassifier(nn.Module):
    """Stacked (optionally bidirectional) LSTM or GRU cells, pooling over time, dropout slot, Linear head."""

    def __init__(
        self,
        kind: str,
        n_features: int,
        n_outputs: int,
        hidden: int,
        layers: int,
        bidirectional: bool,
        dropout: float,
        pooling: str,
    ) -> None:
        super().__init__()
        self.pooling = pooling
        directions = 2 if bidirectional else 1
        self.cells = nn.ModuleList()
        for layer in range(layers):
            n_in = n_features if layer == 0 else directions * hidden
            rate = 0.0 if layer == 0 else dropout
            self.cells.append(nn.ModuleList(RecurrentCell(kind, n_in, hidden, rate) for _ in range(directions)))
        self.output_dropout = nn.Dropout(0.0)
        self.head = nn.Linear(directions * hidden, n_outputs)
        bound = 1.0 / math.sqrt(hidden)  # PyTorch's RNN initialisation, U(−1/√H, 1/√H), for the recurrent part
        for cell in self.cells.modules():
            if isinstance(cell, nn.Linear):
                nn.init.uniform_(cell.weight, -bound, bound)
                nn.init.uniform_(cell.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        valid = ~torch.isnan(x).any(dim=-1)  # (B, T): padding steps are NaN
        h = torch.nan_to_num(x, nan=0.0)
        for directions in self.cells:
            outputs = [directions[0](h, valid)]
            if len(directions) == 2:  # the backward direction reads the reversed sequence
                outputs.append(directions[1](h.flip(1), valid.flip(1)).flip(1))
            h = torch.cat(outputs, dim=-1)
        if self.pooling == "mean":
            weights = valid.to(h.dtype).unsqueeze(-1)
            pooled = (h * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        else:
            hidden = h.shape[-1] // len(self.cells[0])
            pooled = h[:, -1]  # the forward state after the last valid step (carried over the padding)
            if len(self.cells[0]) == 2:
                pooled = torch.cat([h[:, -1, :hidden], h[:, 0, hidden:]], dim=-1)
        return self.head(self.output_dropout(pooled))


def build_recurrent(kind: str):
    """The builder of ``kind`` ("lstm" or "gru") for a :class:`ModelSpec`."""

    def build(
        input_shape: tuple[int, ...],
        n_outputs: int,
        hidden: int = 64,
        layers: int = 1,
        bidirectional: bool = False,
        dropout: float = 0.0,
        pooling: str = "last",
    ) -> RecurrentClassifier:
        if len(input_shape) != 2:
            raise ValueError(
                f"{kind} reads sequences of shape (time steps, features); got inputs of shape {input_shape}"
            )
        return RecurrentClassifier(kind, input_shape[1], n_outputs, hidden, layers, bidirectional, dropout, pooling)

    build.__doc__ = f"A {kind} sequence classifier (:class:`RecurrentClassifier`) on inputs (T, F)."
    return build


OPTIONS = (
    Hyperparameter("hidden", int, 64, "hidden units per direction and layer", low=1),
    Hyperparameter("layers", int, 1, "stacked recurrent layers", low=1, high=8),
    Hyperparameter("bidirectional", bool, False, "also read every sequence backwards"),
    Hyperparameter(
        "dropout", float, 0.0, "variational dropout rate between layers (one mask per sequence)", low=0.0, high=0.95
    ),
    Hyperparameter(
        "pooling", str, "last", "what the classifier reads: the last state or the mean over time", choices=POOLING
    ),
)

MODELS = (
    ModelSpec(
        name="lstm",
        description="LSTM sequence classifier (Hochreiter & Schmidhuber 1997), variational RNN dropout slots",
        build=build_recurrent("lstm"),
        options=OPTIONS,
        batchable=True,
        reads_padded_sequences=True,
    ),
    ModelSpec(
        name="gru",
        description="GRU sequence classifier (Cho et al. 2014), variational RNN dropout slots",
        build=build_recurrent("gru"),
        options=OPTIONS,
        batchable=True,
        reads_padded_sequences=True,
    ),
)
