"""The adversarial probes: white-box attacks on the trial's model average of kept samples, and the transfer
attack's examples crafted by the cell's transfer source (docs/adversarial.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ursa_ray import data
from ursa_ray.evaluation.adversarial import (
    AdversarialExamples,
    AdversarialPredictives,
    AdversarialSettings,
    ModelAverage,
    PixelScale,
    craft,
    examples_from_bytes,
)
from ursa_ray.methods.base import Problem
from ursa_ray.results import Location


def _craft(
    spec: Mapping[str, Any], ds: data.base.Dataset, attacked: ModelAverage, test: tuple[Tensor, Tensor], seed: int
) -> AdversarialExamples:
    """FGSM/PGD on the first ``n_examples`` test images against the model average of the kept samples
    (white box: the attacker knows p̄ and its gradient); ``seed`` (the ``attack`` stream) draws PGD's start."""
    settings = spec["adversarial"]
    x, y = test[0][: settings["n_examples"]], test[1][: settings["n_examples"]].to(test[0].device)
    scale = PixelScale(ds.pixel_mean, ds.pixel_std)
    epsilons = AdversarialSettings(**settings).epsilons_for(spec["dataset"])
    return craft(attacked, x, y, scale, settings["attacks"], epsilons, steps=settings["pgd_steps"], seed=seed)


def _attack(
    spec: Mapping[str, Any], ds: data.base.Dataset, attacked: ModelAverage, test: tuple[Tensor, Tensor], seed: int
) -> AdversarialPredictives:
    """The white-box sets (:func:`_craft`) scored under the model average that was attacked."""
    scored = AdversarialPredictives(_craft(spec, ds, attacked, test, seed), ds.n_outputs)
    for predictor in attacked.predictors():
        scored.update(predictor)
    return scored


def train_transfer_source(
    spec: Mapping[str, Any],
    ds: data.base.Dataset,
    method: Any,
    problem: Problem,
    build: Callable[[], torch.nn.Module],
    test: tuple[Tensor, Tensor],
    seeds: Mapping[str, int],
) -> AdversarialExamples:
    """The transfer attack's examples, crafted by the cell's transfer source (its ``sgd`` trial) on a network
    of its own: ``method`` trained on the trial's training set with the trial's configuration, its initial
    weights (``build``, from torch's generator, and any other draw from it) from the seed's
    ``transfer_init`` stream and its mini-batch order from ``transfer_data``, streams no method's network
    uses.  So no attacked method saw
    the source (the sgd trial's own network is Laplace's θ_MAP when they share settings, and deep-ensemble
    member 0 and MC dropout start from its initial weights).  Its one sample is attacked as a white-box
    model average of M = 1 (:func:`_craft`, draws from the ``attack`` stream).  torch's generators are put
    back afterwards: the trial's own streams are unchanged."""
    device = problem.device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seeds["transfer_init"])
        generator = torch.Generator().manual_seed(seeds["transfer_data"])
        own = dataclasses.replace(problem, make_model=build, generator=generator)
        stream = method.sample_posterior(own, spec["config"], {})
        attacked = ModelAverage(1, 1, seed=seeds["attack"])
        attacked.observe(next(iter(stream)))
        stream.close()
        return _craft(spec, ds, attacked, test, seeds["attack"])


def load_transfer_attack(
    spec: Mapping[str, Any], ds: data.base.Dataset, device: torch.device
) -> AdversarialPredictives | None:
    """The accumulator of the transfer attack: the examples the cell's SGD trial crafted on its network
    (``spec["transfer_examples"]``, a file the run orchestration names once that trial has finished), to be
    scored under this trial's posterior predictive; None when there are none to read."""
    where = spec.get("transfer_examples")
    if not where or ds.pixel_mean is None:
        return None
    saved = Location.parse(where)
    if not saved.exists():
        return None
    examples = examples_from_bytes(saved.read_bytes(), PixelScale(ds.pixel_mean, ds.pixel_std), device)
    return AdversarialPredictives(examples, ds.n_outputs)
