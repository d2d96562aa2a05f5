"""SGD point estimate: one "posterior sample", the trained weights (URSABench's baseline)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import Predictor, Problem, one_network_storage


class SGD:
    name = "sgd"
    description = "SGD with momentum; the trained network is the single sample (a point estimate)"
    hyperparameters = SGD_HYPERPARAMETERS
    constraints = ()  # no rule between its hyperparameters beyond their own ranges
    posterior_storage = staticmethod(one_network_storage)  # the trained network

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = train_sgd(problem.make_model(), problem, config, stats)
        model.eval()
        stats["n_samples"] = 1
        yield model


METHODS = (SGD(),)
