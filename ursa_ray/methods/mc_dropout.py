"""MC dropout (Gal & Ghahramani 2016): train with dropout, keep it on at test time, S stochastic passes.

Each posterior sample is one pass with fresh Bernoulli(1 − p) masks; p(y|x) ≈ (1/S) Σ_s softmax f(x; θ ⊙ m_s).
The network's ``nn.Dropout`` modules (every model of ursa-ray has them, with p = 0 unless a method
sets it) get rate ``p``; batch-norm layers stay in evaluation mode while sampling.  On ``lstm`` and ``gru``
the slots sit on each cell's input and recurrent state and draw one mask per sequence, applied at every time
step (variational RNN dropout, Gal & Ghahramani 2016; :mod:`ursa_ray.models.rnn`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import (
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    batched_passes,
    one_network_storage,
    passes,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, train_sgd_copies


def set_dropout(model: nn.Module, p: float) -> list[nn.Dropout]:
    """Set the rate of every dropout module of ``model`` to ``p``; error if the model has none."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no dropout layers, so MC dropout cannot apply")
    for layer in layers:
        layer.p = p
    return layers


class MCDropout(Method):
    name = "mc_dropout"
    description = "MC dropout: dropout at train and test time, one stochastic forward pass per sample"
    hyperparameters = SGD_HYPERPARAMETERS + (
        Hyperparameter("p", float, 0.2, "dropout rate", low=0.0, high=0.95),
        Hyperparameter("n_samples", int, 20, "stochastic forward passes", low=1),
    )
    # one network: the rate p is a hyperparameter and the masks are drawn at prediction time
    posterior_storage = staticmethod(one_network_storage)

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = problem.make_model()
        dropout_layers = set_dropout(model, config["p"])
        train_sgd(model, problem, config, stats)
        model.eval()
        for layer in dropout_layers:
            layer.train()
        yield from passes(model, config["n_samples"], stats)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """:meth:`sample_posterior` for every problem at once: one batched training run (independent masks
        per copy), then each copy's network yields its stochastic passes."""
        models = [problem.make_model() for problem in problems]
        dropout_layers = [layer for model in models for layer in set_dropout(model, config["p"])]
        stacked = StackedNetworks(models)
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        steps = train_sgd_copies(stacked, data, problems[0].likelihood, config)
        stacked.train(False)
        for layer in dropout_layers:
            layer.train()
        for one in stats:
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
        yield from batched_passes(models, config["n_samples"], stats)


METHODS = (MCDropout(),)
