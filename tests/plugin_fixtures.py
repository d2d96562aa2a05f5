"""Plug-ins named by import path in tests/test_plugins.py (``tests.plugin_fixtures:NAME``): working ones and
ones that break the protocol."""

from __future__ import annotations

import math

from torch import nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.methods.sgd import SGD
from ursa_ray.models.base import ModelSpec


class RenamedSGD(SGD):
    """A working method: the built-in SGD under another name."""

    name = "renamed_sgd"


def _build_tiny(input_shape: tuple[int, ...], n_outputs: int, width: int = 8) -> nn.Module:
    hidden = nn.Linear(math.prod(input_shape), width)
    return nn.Sequential(nn.Flatten(), hidden, nn.ReLU(), nn.Dropout(0.0), nn.Linear(width, n_outputs))


TINY_MODEL = ModelSpec(
    name="tiny",
    description="one hidden layer",
    build=_build_tiny,
    options=(Hyperparameter("width", int, 8, "hidden width", low=1),),
)


class EarlierProtocolSGD:
    """A working method written against the earlier protocol: no base class and no ``constraints``; the
    built-in SGD's stream."""

    name = "earlier_sgd"
    description = "the built-in SGD, declared without the base class"
    hyperparameters = SGD.hyperparameters

    def sample_posterior(self, problem, config, stats):
        yield from SGD().sample_posterior(problem, config, stats)


class MissingSamplePosterior:
    name = "no_sampler"
    description = "declares everything but sample_posterior"
    hyperparameters = ()
    constraints = ()


class NoValidDefault(SGD):
    name = "no_default"
    hyperparameters = (Hyperparameter("lr", float, None, "learning rate", low=0.0),)


class DefaultOutOfRange(SGD):
    name = "out_of_range"
    hyperparameters = (Hyperparameter("lr", float, -1.0, "learning rate", low=0.0),)


NOT_A_MODEL = object()
