"""A named model: its options and a builder.  Every model contains ``nn.Dropout`` modules (rate 0 unless
a method such as MC dropout sets it) so that dropout-based methods apply to every architecture."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ursa_ray.methods.base import Hyperparameter


@dataclass(frozen=True)
class ModelSpec:
    """``build(input_shape, n_outputs, **options)`` returns a freshly initialised network.

    Initial weights come from torch's global random number generator, which each trial seeds, so every
    (trial, call) pair starts from its own initialisation.  ``tasks`` lists the tasks the model fits.
    A model with ``needs_feature_map`` is built with ``feature_map=dataset.feature_map`` as well.  A
    ``batchable`` one may run several seeds as one batched computation.
    """

    name: str
    description: str
    build: Callable[..., nn.Module]
    options: tuple[Hyperparameter, ...] = ()
    tasks: tuple[str, ...] = ("classification", "regression")
    needs_feature_map: bool = False
    batchable: bool = False
    """Whether copies of the model may be trained as one batched computation (:mod:`ursa_ray.methods.batched`):
    a small network without buffers (no batch norm).  Seeds of a grid batch only on such models."""
    sparse_propagation: bool = False
    """Whether the forward pass multiplies by a sparse matrix (``torch.sparse``: the GCN's normalised
    adjacency), through which forward-mode AD and per-example Jacobians (laplace-torch's diagonal and full
    curvature) cannot differentiate; a method may refuse such a model (:meth:`Method.model_refusal`)."""
    reads_padded_sequences: bool = False
    """Whether the network skips the NaN padding steps of variable-length sequences (the recurrent models);
    a grid pairing any other model with a dataset whose inputs hold padding is refused (NaN outputs)."""


def init_conv_and_batch_norm(model: nn.Module) -> None:
    """He (fan-out) initialisation of every convolution; batch-norm scale 1 and shift 0."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
