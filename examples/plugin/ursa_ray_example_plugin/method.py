"""``temperature_sgd``: SGD, then temperature scaling (Guo et al. 2017).

The network is trained by SGD on the training set less a held-out share; the temperature T > 0 is then
the one minimising the held-out negative log-likelihood of softmax(logits / T).  One "posterior sample":
the trained network with its logits divided by T.  Classification only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import Hyperparameter, Method, Predictor, Problem, StorageCount, n_parameters


class TemperatureScaled(nn.Module):
    """``network``'s logits divided by ``temperature`` (a float: not a weight, so never quantised)."""

    def __init__(self, network: nn.Module, temperature: float) -> None:
        super().__init__()
        self.network = network
        self.temperature = temperature

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x) / self.temperature


def fit_temperature(logits: Tensor, labels: Tensor) -> float:
    """The T > 0 minimising the mean NLL of softmax(logits / T), found by L-BFGS on log T in float64."""
    logits = logits.detach().double()
    log_t = torch.zeros((), dtype=torch.float64, device=logits.device, requires_grad=True)
    optimiser = torch.optim.LBFGS([log_t], lr=1.0, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimiser.step(closure)
    return float(log_t.detach().exp())


class TemperatureSGD(Method):
    """A subclass of ursa_ray.methods.base.Method, as the built-in ``sgd`` is: its defaults for everything but
    the stream and its storage (no constraints, every task, one sample, no batched stream)."""

    name = "temperature_sgd"
    description = "SGD, then the logits divided by a temperature fitted on held-out data (Guo et al. 2017)"
    hyperparameters = SGD_HYPERPARAMETERS + (
        Hyperparameter(
            "holdout_fraction",
            float,
            0.1,
            "share of the training set held out to fit the temperature",
            low=0.01,
            high=0.5,
        ),
    )

    @staticmethod
    def posterior_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
        """The trained network and its temperature."""
        return StorageCount(weights=n_parameters(sample), other_values=1)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        """Hold out a share of the training set (drawn from the trial's data stream), train by SGD on the
        rest, fit T on the held-out share and yield the one sample."""
        if problem.likelihood.name != "categorical":
            kind = problem.likelihood.name
            raise ValueError(f"temperature_sgd needs classification, got a {kind} likelihood")
        n_held = max(1, round(config["holdout_fraction"] * problem.n_train))
        order = torch.randperm(problem.n_train, generator=problem.generator).to(problem.device)
        held, fit = order[:n_held], order[n_held:]
        training = dataclasses.replace(problem, x=problem.x[fit], y=problem.y[fit])
        network = train_sgd(problem.make_model(), training, config, stats)
        network.eval()
        with torch.no_grad():
            logits = network(problem.x[held])
        temperature = fit_temperature(logits, problem.y[held])
        stats["temperature"] = temperature
        stats["n_samples"] = 1
        yield TemperatureScaled(network, temperature)
