"""SGD point estimate: one "posterior sample", the trained weights (URSABench's baseline)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import Method, Predictor, Problem, one_network_storage
from ursa_ray.methods.batched import CopyData, StackedNetworks, train_sgd_copies


class SGD(Method):
    name = "sgd"
    description = "SGD with momentum; the trained network is the single sample (a point estimate)"
    hyperparameters = SGD_HYPERPARAMETERS
    posterior_storage = staticmethod(one_network_storage)  # the trained network

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = train_sgd(problem.make_model(), problem, config, stats)
        model.eval()
        stats["n_samples"] = 1
        yield model

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """One SGD run per problem, all trained as one batched computation (:mod:`~ursa_ray.methods.batched`);
        each copy draws its mini-batches from its problem's generator, as :meth:`sample_posterior` does."""
        stacked = StackedNetworks([problem.make_model() for problem in problems])
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        steps = train_sgd_copies(stacked, data, problems[0].likelihood, config)
        stacked.train(False)
        for one in stats:
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
            one["n_samples"] = 1
        yield stacked.models


METHODS = (SGD(),)
