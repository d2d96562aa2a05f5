"""The adversarial probes: white-box attacks on the trial's model average of kept samples, and the transfer
attack's examples crafted by the cell's transfer source (docs/adversarial.md)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ursa_ray import data, eval_sets
from ursa_ray.evaluation.adversarial import (
    AdversarialExamples,
    AdversarialPredictives,
    AdversarialSettings,
    ModelAverage,
    PixelScale,
    craft,
    examples_from_bytes,
    examples_to_bytes,
    reference_epsilon,
)
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, predict, predict_expected_entropy
from ursa_ray.methods.base import Problem
from ursa_ray.results import Location
from ursa_ray.spec import TrialSpec


def _craft(
    spec: TrialSpec, ds: data.base.Dataset, attacked: ModelAverage, test: tuple[Tensor, Tensor], seed: int
) -> AdversarialExamples:
    """FGSM/PGD on the first ``n_examples`` test images against the model average of the kept samples
    (white box: the attacker knows p̄ and its gradient); ``seed`` (the ``attack`` stream) draws PGD's start."""
    settings = spec.adversarial
    x, y = test[0][: settings["n_examples"]], test[1][: settings["n_examples"]].to(test[0].device)
    scale = PixelScale(ds.pixel_mean, ds.pixel_std)
    epsilons = AdversarialSettings(**settings).epsilons_for(spec.dataset)
    return craft(attacked, x, y, scale, settings["attacks"], epsilons, steps=settings["pgd_steps"], seed=seed)


def _attack(
    spec: TrialSpec, ds: data.base.Dataset, attacked: ModelAverage, test: tuple[Tensor, Tensor], seed: int
) -> AdversarialPredictives:
    """The white-box sets (:func:`_craft`) scored under the model average that was attacked."""
    scored = AdversarialPredictives(_craft(spec, ds, attacked, test, seed), ds.n_outputs)
    for predictor in attacked.predictors():
        scored.update(predictor)
    return scored


def train_transfer_source(
    spec: TrialSpec,
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
        stream = method.sample_posterior(own, spec.config, {})
        attacked = ModelAverage(1, 1, seed=seeds["attack"])
        attacked.observe(next(iter(stream)))
        stream.close()
        return _craft(spec, ds, attacked, test, seeds["attack"])


def load_transfer_attack(spec: TrialSpec, ds: data.base.Dataset, device: torch.device) -> AdversarialPredictives | None:
    """The accumulator of the transfer attack: the examples the cell's SGD trial crafted on its network
    (``spec.transfer_examples``, a file the run orchestration names once that trial has finished), to be
    scored under this trial's posterior predictive; None when there are none to read."""
    where = spec.transfer_examples
    if not where or ds.pixel_mean is None:
        return None
    saved = Location.parse(where)
    if not saved.exists():
        return None
    examples = examples_from_bytes(saved.read_bytes(), PixelScale(ds.pixel_mean, ds.pixel_std), device)
    return AdversarialPredictives(examples, ds.n_outputs)


class WhiteBoxProbe(Probe):
    """``adv:SET``: keeps the attacker's samples as they stream (:class:`ModelAverage`), attacks their model
    average once at the end (:func:`_attack`) and scores the crafted sets under it; ``reference`` marks
    the robustness composite's set (PGD at the dataset family's reference ε)."""

    clock = "attack_s"

    def __init__(self, context: ProbeContext, attacked: ModelAverage) -> None:
        super().__init__()
        self.trial, self.attacked = context.trial, attacked
        self.scored: AdversarialPredictives | None = None

    def observe(self, predictor: Any) -> None:
        self.attacked.observe(predictor)  # copying a kept sample is part of the attack's cost

    def compute(self) -> dict[str, dict[str, float]]:
        if self.attacked.n_kept == 0:
            return {}
        tick = time.perf_counter()
        spec, trial = self.trial.spec, self.trial
        self.scored = _attack(spec, trial.ds, self.attacked, trial.eval_sets["test"], trial.seeds["attack"])
        reference = eval_sets.attack_set("pgd", reference_epsilon(spec.dataset))
        values = {
            eval_sets.adversarial(name): table | ({"reference": float(name == reference)} if name != "clean" else {})
            for name, table in self.scored.metrics().items()
        }
        self.seconds += time.perf_counter() - tick
        return values

    def rows(self) -> dict[str, pd.DataFrame]:
        return {} if self.scored is None else {eval_sets.adversarial(n): t for n, t in self.scored.tables().items()}


class TransferProbe(Probe):
    """``transfer:SET``: examples crafted by the cell's transfer source (:func:`train_transfer_source` when
    this trial is the source, else read by :func:`load_transfer_attack`) scored under this trial's posterior
    predictive, reported when the white-box attack is (``attacked`` kept samples).  ``source``: the trial
    whose examples they are; ``crafted``: the source's own examples, for the other trials."""

    clock = "attack_s"

    def __init__(
        self, context: ProbeContext, scored: AdversarialPredictives, attacked: ModelAverage, crafted: bytes | None
    ) -> None:
        super().__init__()
        self.precision, self.scored, self.attacked, self.crafted = context.trial.precision, scored, attacked, crafted
        spec = context.trial.spec
        self.source = spec.trial_id if spec.transfer_source else spec.transfer_from

    def observe(self, predictor: Any) -> None:
        self.scored.update(
            lambda x: predict(predictor, x, self.precision),
            lambda x: predict_expected_entropy(predictor, x, self.precision),
        )

    def compute(self) -> dict[str, dict[str, float]]:
        return {} if self.attacked.n_kept == 0 else {eval_sets.transfer(n): t for n, t in self.scored.metrics().items()}

    def rows(self) -> dict[str, pd.DataFrame]:
        return {} if self.attacked.n_kept == 0 else {eval_sets.transfer(n): t for n, t in self.scored.tables().items()}


def probes(context: ProbeContext) -> list[Probe]:
    """The white-box probe and, where there are examples to score, the transfer probe, in trials whose
    cells are attacked (:attr:`~ursa_ray.prepare.PreparedTrial.robustness`); none elsewhere."""
    trial = context.trial
    if not trial.robustness:
        return []
    per_chain, n_chains, in_turn = context.sample_plan()
    attacked = ModelAverage(
        per_chain,
        trial.spec.adversarial["attack_samples"],
        n_chains=n_chains,
        chains_in_turn=in_turn,
        seed=trial.seeds["attack"],
    )
    white_box = WhiteBoxProbe(context, attacked)
    transfer, crafted = load_transfer_attack(trial.spec, trial.ds, trial.device), None
    tick = time.perf_counter()
    if trial.spec.transfer_source:  # its transfer sets: examples crafted on a network of its own
        examples = train_transfer_source(
            trial.spec, trial.ds, trial.method, trial.problem, trial.build_model, trial.eval_sets["test"], trial.seeds
        )
        crafted, transfer = examples_to_bytes(examples), AdversarialPredictives(examples, trial.ds.n_outputs)
    if transfer is None:
        return [white_box]
    scored = TransferProbe(context, transfer, attacked, crafted)
    scored.seconds = time.perf_counter() - tick if crafted is not None else 0.0
    return [white_box, scored]
