"""One trial, without Ray: load data onto the device, stream posterior samples, accumulate the posterior
predictive online on every evaluation set, and return the rows that land in the results directory.

The search phase trains on the training set less a seeded validation split and evaluates on that split
only (the test set is never loaded into the evaluation); the final phase trains on the whole training set
and evaluates on the test set and the OOD sets.  Both run this same function, so schedules and budgets
cannot differ between them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ursa_ray import data, methods, models, reference
from ursa_ray.eval_sets import attack_set
from ursa_ray.evaluation import (
    ClassificationPredictive,
    RegressionPredictive,
    classification_metrics,
    fidelity,
    ood_metrics,
    regression_metrics,
)
from ursa_ray.evaluation.adversarial import (
    AdversarialPredictives,
    ModelAverage,
    examples_to_bytes,
    reference_epsilon,
)
from ursa_ray.evaluation.precision import evaluation_precision, keep_output_layer_float32
from ursa_ray.evaluation.predictions import prediction_table
from ursa_ray.evaluation.probes.adversarial import _attack, load_transfer_attack, train_transfer_source
from ursa_ray.evaluation.probes.base import accumulate, predict, predict_expected_entropy
from ursa_ray.evaluation.test_time_cost import cost_metrics_at_test_time, evaluate_at_bit_depths
from ursa_ray.methods import batched
from ursa_ray.methods._training import autocast_dtype, default_precision
from ursa_ray.methods.base import Categorical, Gaussian, Problem
from ursa_ray.prepare import corrupted_sets, pick_device, trial_seeds, validation_split
from ursa_ray.results import Location, metric_key


@dataclass
class TrialOutcome:
    """What a trial produces: its ``trials.parquet`` row, long-format metric rows, regression point rows,
    optional prediction tables by evaluation set, and the validation metrics the search phase selects on."""

    record: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    predictions: dict[str, pd.DataFrame] = field(default_factory=dict)
    selection: dict[str, float] = field(default_factory=dict)
    transfer_examples: bytes | None = None
    """A transfer source's crafted adversarial examples (:func:`examples_to_bytes`), for the other trials."""


def planned_samples(config: Mapping[str, Any]) -> tuple[int, int]:
    """(S, C): the samples per chain and the chains of a method's stream, from its configuration (which
    samples the adversarial model average keeps depends on them): S = ``n_samples``, or
    ``n_cycles × samples_per_cycle`` (cyclical SG-MCMC), else 1 (point estimates); C = ``n_chains``
    (SG-MCMC, HMC), else 1.  The stream yields C·S samples."""
    if "n_samples" in config:
        per_chain = int(config["n_samples"])
    elif "n_cycles" in config:
        per_chain = int(config["n_cycles"] * config["samples_per_cycle"])
    else:
        per_chain = 1
    return per_chain, int(config.get("n_chains", 1))


def chains_in_turn(method: Any, probe: torch.nn.Module, problem: Problem) -> bool:
    """Whether ``method``'s stream pools its chains one after another rather than interleaved: SG-MCMC
    runs them in turn when its network cannot be batched (``sgmcmc._SGMCMC.sample_posterior``); HMC and
    every batched stream yield, at each sampling step, chain 1's sample, then chain 2's, ..."""
    from ursa_ray.methods.sgmcmc import _SGMCMC

    return isinstance(method, _SGMCMC) and not batched.can_batch(probe, problem)


def warm_up_worker(device: torch.device) -> float:
    """Pay a fresh worker process's one-off costs before any timed trial; returns the seconds spent.

    torch's first calls (thread pool, autograd, the optimiser, the device's context), the evaluation path
    (accumulator and scikit-learn metrics) and every method's compiled kernels (``warm_up(device)``, where
    a method declares one).  The trial runner calls it once per worker and records the time in its own
    column, ``worker_setup_s``, so that no method's cost depends on whether it ran first in a worker.
    """
    start = time.perf_counter()
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    ).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(32, 8, device=device), torch.arange(32, device=device) % 3
    for _ in range(3):
        optimiser.zero_grad()
        Categorical().nll(model(x), y).backward()
        optimiser.step()
    predictive = ClassificationPredictive(32, 3, device)
    predictive.update(predict(model, x))
    classification_metrics(predictive, y.cpu().numpy())
    for method in methods.registry().values():
        if hasattr(method, "warm_up"):
            method.warm_up(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


class TrialRun:
    """One trial's data, problem, evaluation sets and accumulators: :meth:`observe` adds a posterior sample
    to every accumulator, :meth:`finish` computes the metrics and rows.  :func:`run_trial` drives one
    method stream through it; :func:`run_trials_batched` one batched stream through several.

    ``own_init_stream``: model initialisations come from a generator state of this trial's own (seeded
    with its ``init`` seed) rather than torch's global generator, so that several trials prepared side by
    side each build the networks they would alone."""

    def __init__(self, spec: Mapping[str, Any], device: torch.device | None = None, own_init_stream: bool = False):
        self.started_cpu = time.process_time()
        start_wall = time.perf_counter()
        self.spec = spec
        self.device = device = device or pick_device(spec["resources"]["gpu"])
        self.seed = seed = int(spec["seed"])
        self.seeds = seeds = trial_seeds(seed)
        torch.manual_seed(seeds["init"])
        np.random.seed(seeds["init"] % 2**32)
        generator = torch.Generator().manual_seed(seeds["data"])

        dataset_spec = data.dataset_spec(spec["dataset"], spec.get("dataset_file"))  # registered, or read from files
        self.ds = ds = dataset_spec.load(
            spec["dataset_options"], tuple(spec["ood"]), data.base.data_root(spec["data_root"]), spec["download"], seed
        )
        train_x, train_y = ds.train_x, ds.train_y
        eval_sets: dict[str, tuple[Tensor, Tensor | None]]
        if spec["phase"] == "search":
            fit, val = validation_split(len(train_y), spec["validation_fraction"], seed)
            eval_sets = {"validation": (train_x[val], train_y[val])}
            train_x, train_y = train_x[fit], train_y[fit]
        else:
            eval_sets = {"test": (ds.test_x, ds.test_y)}
            eval_sets.update({name: (x, None) for name, x in ds.ood.items()})
        self.full_precision_sets = list(eval_sets)  # the sets also evaluated at lower bit depths
        train_x, train_y = train_x.to(device), train_y.to(device)
        eval_sets = {k: (x.to(device), y) for k, (x, y) in eval_sets.items()}
        # corruptions and attacks: final classification trials of in-domain cells (composites use no other)
        robustness = spec["phase"] == "final" and ds.task == "classification" and not spec["decision_task"]
        robustness = robustness and ds.pixel_mean is not None  # tabular data have no pixels to perturb
        if robustness:
            eval_sets.update(corrupted_sets(ds, eval_sets["test"], spec["corruptions"], seeds["corruption"]))
        self.eval_sets = eval_sets

        model_spec = models.get_model(spec["model"])
        model_kwargs = dict(spec["model_options"])
        if model_spec.needs_feature_map:
            model_kwargs["feature_map"] = ds.feature_map

        self.precision = precision = evaluation_precision(device, ds.task)
        self.training_precision = spec.get("precision") or default_precision(device, ds.task)
        training_dtype = autocast_dtype(self.training_precision)
        self.n_params = 0  # of the model as built (before a method adds its own parameters), set by the first build
        init_state = torch.Generator().manual_seed(seeds["init"]).get_state() if own_init_stream else None

        def build() -> torch.nn.Module:
            model = model_spec.build(ds.input_shape, ds.n_outputs, **model_kwargs).to(device)
            if device.type == "cuda" and len(ds.input_shape) == 3:
                model = model.to(memory_format=torch.channels_last)
            if precision is not None or training_dtype is not None:
                keep_output_layer_float32(model, ds.n_outputs)
            self.n_params = self.n_params or sum(p.numel() for p in model.parameters())
            return model

        self.build_model = build  # from torch's global generator, whatever ``own_init_stream``

        def make_model() -> torch.nn.Module:
            nonlocal init_state
            if init_state is None:
                return build()
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(init_state)
                model = build()
                init_state = torch.get_rng_state()
            return model

        likelihood = Categorical() if ds.task == "classification" else Gaussian(float(ds.noise_std))
        self.problem = Problem(train_x, train_y, likelihood, make_model, generator, device, ds.augment, training_dtype)
        self.method = methods.get_method(spec["method"])
        self.setup_s = time.perf_counter() - start_wall

        if ds.task == "classification":
            self.accumulators = {
                k: ClassificationPredictive(x.shape[0], ds.n_outputs, device) for k, (x, _) in eval_sets.items()
            }
        else:
            self.accumulators = {k: RegressionPredictive(x.shape[0], device) for k, (x, _) in eval_sets.items()}
        # the final phase also evaluates each classification sample with its weights stored at lower bit depths
        self.schemes = tuple(spec["bit_depths"]) if spec["phase"] == "final" and ds.task == "classification" else ()
        self.at_bit_depth = {
            f"{name}@{scheme}": ClassificationPredictive(eval_sets[name][0].shape[0], ds.n_outputs, device)
            for scheme in self.schemes
            for name in self.full_precision_sets
        }
        self.stats: dict[str, float] = {}
        self.train_s = self.eval_s = self.bit_depth_s = self.attack_s = 0.0
        self.last_predictor: Any = None
        self.attacked = self.transfer = None
        self.transfer_examples: bytes | None = None
        if robustness:
            per_chain, n_chains = planned_samples(spec["config"])
            in_turn = False
            if n_chains > 1:
                with torch.random.fork_rng(devices=[]):
                    in_turn = chains_in_turn(self.method, build(), self.problem)
            self.attacked = ModelAverage(
                per_chain,
                spec["adversarial"]["attack_samples"],
                n_chains=n_chains,
                chains_in_turn=in_turn,
                seed=seeds["attack"],
            )
            self.transfer = load_transfer_attack(spec, ds, device)
            if spec.get("transfer_source"):  # its transfer sets: examples crafted on a network of its own
                tick = time.perf_counter()
                examples = train_transfer_source(spec, ds, self.method, self.problem, build, eval_sets["test"], seeds)
                self.transfer_examples = examples_to_bytes(examples)
                self.transfer = AdversarialPredictives(examples, ds.n_outputs)
                self.attack_s += time.perf_counter() - tick

    def observe(
        self, predictor: Any, progress: Callable[[int, dict[str, float], dict[str, float]], None] | None = None
    ) -> None:
        """Add one posterior sample to every accumulator (and the attack's kept samples), timing each part."""
        precision, eval_sets = self.precision, self.eval_sets
        self.last_predictor = predictor
        tick = time.perf_counter()
        if self.schemes:  # before the float32 pass: each scheme sees the sample's dropout masks, the RNG is restored

            def evaluate_stored(scheme: str, predictor: Any = predictor) -> None:
                for name in self.full_precision_sets:
                    x = eval_sets[name][0]
                    accumulate(self.at_bit_depth[f"{name}@{scheme}"], predictor, x, precision)

            evaluate_at_bit_depths(predictor, evaluate_stored, self.schemes)
            self.bit_depth_s += time.perf_counter() - tick
            tick = time.perf_counter()
        for name, (x, _) in eval_sets.items():
            accumulate(self.accumulators[name], predictor, x, precision)
        self.eval_s += time.perf_counter() - tick
        if self.attacked is not None:
            tick = time.perf_counter()
            self.attacked.observe(predictor)
            if self.transfer is not None:
                self.transfer.update(
                    lambda x, p=predictor: predict(p, x, precision),
                    lambda x, p=predictor: predict_expected_entropy(p, x, precision),
                )
            self.attack_s += time.perf_counter() - tick  # copying a kept sample is part of the attack's cost
        if progress is not None and "validation" in eval_sets:
            running = _evaluate(self.ds, self.accumulators["validation"], eval_sets["validation"][1], "validation")
            progress(
                self.accumulators["validation"].n_samples,
                {f"val_{k}": float(v) for k, v in running.items()},
                {"train_s": self.train_s, "cpu_s": time.process_time() - self.started_cpu},
            )

    def finish(self) -> TrialOutcome:
        """The trial's metrics and rows from what :meth:`observe` accumulated (``train_s`` set by the driver)."""
        spec, ds, seeds = self.spec, self.ds, self.seeds
        eval_sets, accumulators, schemes = self.eval_sets, self.accumulators, self.schemes
        attacked, transfer, stats = self.attacked, self.transfer, self.stats
        n_samples = next(iter(accumulators.values())).n_samples
        if n_samples == 0:
            raise RuntimeError(f"method {spec['method']} produced no posterior samples")

        outcome = TrialOutcome(record={})
        values: dict[str, dict[str, float]] = {}
        adversarial_tables = {}
        transfer_from = ""  # the trial whose examples the transfer sets are (the source's own id for itself)
        outcome.transfer_examples = self.transfer_examples
        if attacked is not None and attacked.n_kept > 0:
            tick = time.perf_counter()
            adversarial = _attack(spec, ds, attacked, eval_sets["test"], seeds["attack"])
            reference = attack_set("pgd", reference_epsilon(spec["dataset"]))
            for name, table in adversarial.metrics().items():  # `reference`: the robustness composite's set
                values[f"adv:{name}"] = table | ({"reference": float(name == reference)} if name != "clean" else {})
            adversarial_tables = {f"adv:{name}": table for name, table in adversarial.tables().items()}
            if transfer is not None:
                transfer_from = spec["trial_id"] if spec.get("transfer_source") else spec["transfer_from"]
                values.update({f"transfer:{name}": table for name, table in transfer.metrics().items()})
                adversarial_tables.update({f"transfer:{name}": table for name, table in transfer.tables().items()})
            self.attack_s += time.perf_counter() - tick
        for name, (_, y) in eval_sets.items():
            if y is not None:
                values[name] = _evaluate(ds, accumulators[name], y, name)
        if spec["phase"] == "final":
            if ds.task == "classification":
                for name in ds.ood:
                    values[name] = ood_metrics(accumulators["test"], accumulators[name])
                for scheme in schemes:
                    test = self.at_bit_depth[f"test@{scheme}"]
                    values[f"test@{scheme}"] = _evaluate(ds, test, eval_sets["test"][1], "test")
                    for name in ds.ood:
                        values[f"{name}@{scheme}"] = ood_metrics(test, self.at_bit_depth[f"{name}@{scheme}"])
            elif not ds.test_y_observed:  # a regression set from files has no noise-free truth
                outcome.points = _points(spec, ds, accumulators["test"])
        if spec["phase"] == "final" and spec.get("reference") is not None and spec.get("references_dir"):
            values.update(_fidelity(spec, ds, accumulators))
        if "validation" in values:
            outcome.selection = {f"val_{k}": float(v) for k, v in values["validation"].items()}

        n_eval_examples = sum(x.shape[0] for x, _ in eval_sets.values())
        values["cost"] = {
            "train_s": self.train_s,
            "s_per_sample": self.train_s / n_samples,
            "predict_s_per_example": self.eval_s / n_eval_examples,
            "n_params": float(self.n_params),
            "n_samples": float(n_samples),
            # the last sample stands for the structure of every one: FLOPs of a forward pass, storage of the posterior
            **cost_metrics_at_test_time(self.method, self.last_predictor, spec["config"], n_samples, ds.input_shape),
        }
        base = metric_key(spec)
        outcome.metrics = [
            {**base, "eval_set": eval_set, "metric": metric, "value": float(value)}
            for eval_set, table in values.items()
            for metric, value in table.items()
        ]
        if spec["save_predictions"] and spec["phase"] == "final" and ds.task == "classification":
            outcome.predictions = {
                name: prediction_table(acc, None if labels is None else labels.numpy())
                for name, acc in {**accumulators, **self.at_bit_depth}.items()
                for labels in [eval_sets[name.split("@")[0]][1]]
            } | adversarial_tables
        outcome.record = {
            "n_samples": n_samples,
            "n_params": self.n_params,
            "setup_s": self.setup_s,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "bit_depth_eval_s": self.bit_depth_s,
            "attack_s": self.attack_s,
            "cpu_s": time.process_time() - self.started_cpu,
            "device": str(self.device),
            "precision": self.training_precision,
            "grad_evals": float(stats.get("grad_evals", math.nan)),
            "accept_rate": float(stats.get("accept_rate", math.nan)),
            "method_stats": json.dumps({k: float(v) for k, v in stats.items()}, sort_keys=True),
            "transfer_from": transfer_from,
            "seeds_in_trial": 1,
        }
        return outcome


def _stream_into(runs: list[TrialRun], stream: Any, batched_stream: bool, progress: Any = None) -> float:
    """Drive ``stream`` into ``runs``: one predictor per item for one run, or (``batched_stream``) a list of
    one predictor per run.  Returns the seconds spent inside the stream (the methods' training)."""
    device = runs[0].device
    train_s = 0.0
    tick = time.perf_counter()
    for item in stream:
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # charge queued GPU work to the method, not to evaluation
        train_s += time.perf_counter() - tick
        for run, predictor in zip(runs, item if batched_stream else [item], strict=True):
            run.observe(predictor, progress)
        tick = time.perf_counter()
    return train_s + time.perf_counter() - tick


def run_trial(
    spec: Mapping[str, Any],
    device: torch.device | None = None,
    progress: Callable[[int, dict[str, float], dict[str, float]], None] | None = None,
) -> TrialOutcome:
    """Run the trial described by ``spec`` (see :meth:`ursa_ray.grid.Grid.spec_for`).

    ``progress(n_samples, validation_metrics, cost_so_far)`` is called after each posterior sample in the
    search phase (the running posterior predictive on the validation split), for early stopping."""
    run = TrialRun(spec, device)
    stream = run.method.sample_posterior(run.problem, spec["config"], run.stats)
    run.train_s = _stream_into([run], stream, False, progress)
    return run.finish()


def run_trials_batched(specs: list[Mapping[str, Any]], device: torch.device | None = None) -> list[TrialOutcome]:
    """Run the trials of ``specs`` -- seeds of one (method, model, dataset, configuration) -- with the
    method's batched stream (``sample_posterior_batched``; :mod:`ursa_ray.methods.batched`): every trial
    gets the outcome it would alone (its own data, initialisation, random streams, evaluation), but the
    training is one computation.  The training seconds, like the trial's other shared costs, are split
    evenly over the trials (``seeds_in_trial`` says how many shared it).  The seeds run in chunks whose
    copies (seeds × the method's ``batched_copies(config, model)``: ensemble members, chains, what it keeps
    per seed) fit
    :data:`~ursa_ray.methods.batched.COPY_MEMORY_BUDGET` (:func:`~ursa_ray.methods.batched.max_copies`).
    A method without a batched stream, or a network too large to batch, runs the trials one after another."""
    first = TrialRun(specs[0], device, own_init_stream=True)
    method = first.method
    with torch.random.fork_rng(devices=[]):
        probe = first.build_model()
    if not method.batchable or not batched.can_batch(probe, first.problem):
        return [run_trial(spec, device) for spec in specs]
    runs = [first] + [TrialRun(spec, device, own_init_stream=True) for spec in specs[1:]]
    config = specs[0]["config"]
    copies_per_seed = method.batched_copies(config, probe)
    batch = config.get("batch_size", runs[0].problem.n_train)  # full-batch methods (HMC) pass every example
    fit = max(1, batched.max_copies(probe, batch, math.prod(runs[0].ds.input_shape)) // copies_per_seed)
    outcomes = []
    for start in range(0, len(runs), fit):  # as many seeds at once as fit the memory budget
        chunk = runs[start : start + fit]
        stream = method.sample_posterior_batched([r.problem for r in chunk], config, [r.stats for r in chunk])
        train_s = _stream_into(chunk, stream, True)
        for run in chunk:
            run.train_s = train_s / len(chunk)
            outcome = run.finish()
            outcome.record["seeds_in_trial"] = len(runs)
            outcomes.append(outcome)
    return outcomes


def _fidelity(
    spec: Mapping[str, Any], ds: data.base.Dataset, accumulators: Mapping[str, Any]
) -> dict[str, dict[str, float]]:
    """``fidelity:SET`` metrics of the trial's predictive on the test and OOD sets against its cell's stored
    reference (:meth:`ursa_ray.reference.Reference.metrics`), found by fingerprint in ``spec["references_dir"]``;
    none when no reference with this cell's fingerprint is stored (its reference trial failed)."""
    key = reference.fingerprint(spec, spec["reference"], reference.data_digest(ds))
    stored = reference.reference_location(Location.parse(spec["references_dir"]), key)
    if not stored.exists():
        return {}
    ref = reference.read_reference(stored)
    return {f"fidelity:{name}": ref.metrics(name, accumulators[name]) for name in ref.pooled if name in accumulators}


def run_reference_trial(spec: Mapping[str, Any], device: torch.device | None = None) -> TrialOutcome:
    """A reference trial (phase ``reference``, :func:`ursa_ray.grid._link_references`): its cell's reference
    reused from ``spec["references_dir"]`` or computed and stored there (:func:`stored_or_computed`); metric rows
    ``reference:SET`` (its noise floor ``noise_*``, ``rhat_max``, ``ess_bulk_min``, ``converged``) and ``cost``
    (``computed``: 1 when this trial ran the chains, 0 when it reused them; the stored run's cost either way)."""
    started_cpu = time.process_time()
    ref, computed = stored_or_computed(spec, spec["reference"], Location.parse(spec["references_dir"]), device)
    values = {
        f"reference:{name}": {**{f"noise_{k}": v for k, v in floor.items()}, **ref.convergence.as_metrics()}
        for name, floor in ref.noise_floor.items()
    }
    values["cost"] = {**ref.cost, "computed": float(computed)}
    base = metric_key(spec)
    outcome = TrialOutcome(record={})
    outcome.metrics = [
        {**base, "eval_set": eval_set, "metric": metric, "value": float(value)}
        for eval_set, table in values.items()
        for metric, value in table.items()
    ]
    spent = ref.cost if computed else {}
    outcome.record = {
        "n_samples": int(ref.cost.get("n_samples", 0)),
        "setup_s": spent.get("setup_s", 0.0),
        "train_s": spent.get("train_s", 0.0),
        "eval_s": spent.get("eval_s", 0.0),
        "cpu_s": time.process_time() - started_cpu,
        "device": str(device or pick_device(spec["resources"]["gpu"])),
        "grad_evals": float(ref.cost.get("grad_evals", math.nan)) if computed else 0.0,
        "accept_rate": float(ref.cost.get("accept_rate", math.nan)),
        "method_stats": json.dumps(
            {"fingerprint": ref.fingerprint, "computed": computed, **ref.convergence.as_metrics()}, sort_keys=True
        ),
        "transfer_from": "",
        "seeds_in_trial": 1,
    }
    return outcome


def _evaluate(ds: data.base.Dataset, pred: Any, targets: Tensor, eval_set: str) -> dict[str, float]:
    """In-domain metrics of the accumulated posterior predictive against labels, or for regression against
    the noise-free truth (the test set's targets: epistemic metrics) or noisy observations (the validation
    split's targets: predictive metrics), see :func:`~ursa_ray.evaluation.metrics.regression_metrics`."""
    if ds.task == "classification":
        cost = None if ds.cost_matrix is None else ds.cost_matrix.numpy()
        return classification_metrics(pred, targets.numpy(), cost)
    # A regression Dataset's test_y is the noise-free truth; the validation split holds noisy training targets.
    if eval_set == "test" and not ds.test_y_observed:  # else observed targets (data from files)
        return regression_metrics(pred, float(ds.noise_std), truth=targets.numpy())
    return regression_metrics(pred, float(ds.noise_std), observed=targets.numpy())


def _points(spec: Mapping[str, Any], ds: data.base.Dataset, pred: RegressionPredictive) -> list[dict[str, Any]]:
    """Per-test-point rows for the method and for the exact anchor model (method "blr"), built column-wise
    without DataFrames (:func:`~ursa_ray.regression.points.points_rows`; docs/vectorised.md)."""
    from ursa_ray.regression.anchor import anchor_for_dataset
    from ursa_ray.regression.points import ANCHOR_METHOD, ANCHOR_MODEL, points_rows

    complexity = float(spec["complexity"]) if spec["complexity"] is not None else math.nan
    where = {"complexity": complexity, "repetition": int(spec["seed"])}
    rows = points_rows(
        ds, pred.mean, pred.std, method=spec["label"], model=spec["model"], trial_id=spec["trial_id"], **where
    )
    if ds.feature_map is not None:
        anchor_id = f"blr-{spec['dataset']}-c{complexity:g}-s{spec['seed']}"
        mean, std = anchor_for_dataset(ds)
        rows += points_rows(ds, mean, std, method=ANCHOR_METHOD, model=ANCHOR_MODEL, trial_id=anchor_id, **where)
    return rows


def compute_reference(
    spec: Mapping[str, Any], settings: Mapping[str, Any], device: torch.device | None = None
) -> reference.Reference:
    """Run the reference of ``spec``'s cell (:mod:`ursa_ray.reference`: the existing HMC with the grid's
    reference settings, its chains' predictives accumulated online) and check it."""
    return _run_reference(TrialRun(reference.reference_spec(spec, settings), device), spec, settings)


def _run_reference(run: TrialRun, spec: Mapping[str, Any], settings: Mapping[str, Any]) -> reference.Reference:
    """The reference's chains streamed through ``run`` (a :class:`TrialRun` of :func:`reference_spec`)."""
    merged = {**reference.SETTINGS_DEFAULTS, **settings}
    if merged["method"] != "hmc":
        raise ValueError(f"reference method must be 'hmc', got {merged['method']!r}")
    task = run.ds.task
    config = run.spec["config"]
    n_chains = config["n_chains"]
    n_outputs = run.ds.n_outputs

    def accumulator(n: int) -> Any:
        return (
            ClassificationPredictive(n, n_outputs, run.device)
            if task == "classification"
            else RegressionPredictive(n, run.device)
        )

    per_chain = {name: [accumulator(x.shape[0]) for _ in range(n_chains)] for name, (x, _) in run.eval_sets.items()}
    draws: list[list[np.ndarray]] = [[] for _ in range(n_chains)]
    stream = run.method.sample_posterior(run.problem, config, run.stats)
    train_s = eval_s = 0.0
    tick = time.perf_counter()
    for k, predictor in enumerate(stream):
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        train_s += time.perf_counter() - tick
        tick = time.perf_counter()
        chain = k % n_chains
        for name, (x, _) in run.eval_sets.items():
            outputs = predict(predictor, x, run.precision)
            run.accumulators[name].update(outputs)
            per_chain[name][chain].update(outputs)
            if name == "test":
                probe = outputs[: reference.N_DIAGNOSTIC_EXAMPLES].double()
                probe = torch.softmax(probe, -1) if task == "classification" else probe.reshape(-1)
                draws[chain].append(probe.cpu().numpy())
        eval_s += time.perf_counter() - tick
        tick = time.perf_counter()
    train_s += time.perf_counter() - tick

    pooled, chains, floors = {}, {}, {}
    for name, acc in run.accumulators.items():
        if task == "classification":
            pooled[name] = acc.mean_probs
            chains[name] = np.stack([a.mean_probs for a in per_chain[name]])
            if n_chains > 1:
                floors[name] = fidelity.noise_floor(chains[name])
        else:
            pooled[name] = np.stack([acc.mean, acc.std], axis=1)
            chains[name] = np.stack([np.stack([a.mean, a.std], axis=1) for a in per_chain[name]])
            if n_chains > 1:
                floors[name] = fidelity.regression_noise_floor(chains[name][..., 0], chains[name][..., 1] ** 2)
    n_draws = min(len(d) for d in draws)
    checked = fidelity.convergence(
        np.stack([np.stack(d[:n_draws]) for d in draws]),
        rhat_max=float(merged.get("rhat_max", fidelity.RHAT_MAX)),
        ess_min=float(merged.get("ess_min", fidelity.ESS_MIN)),
    )
    cost = {
        "train_s": train_s,
        "eval_s": eval_s,
        "setup_s": run.setup_s,
        "cpu_s": time.process_time() - run.started_cpu,
        "grad_evals": float(run.stats.get("grad_evals", float("nan"))),
        "accept_rate": float(run.stats.get("accept_rate", float("nan"))),
        "n_samples": float(run.stats.get("n_samples", 0)),
    }
    return reference.Reference(
        reference.fingerprint(spec, settings, reference.data_digest(run.ds)),
        task,
        pooled,
        chains,
        checked,
        floors,
        {**merged},
        cost,
    )


def stored_or_computed(
    spec: Mapping[str, Any], settings: Mapping[str, Any], references: Location, device: torch.device | None = None
) -> tuple[reference.Reference, bool]:
    """The cell's reference from the ``references`` folder when one with its fingerprint is stored there, else
    computed and stored (atomically); the second value says whether it was computed."""
    run = TrialRun(reference.reference_spec(spec, settings), device)
    where = reference.reference_location(
        references, reference.fingerprint(spec, settings, reference.data_digest(run.ds))
    )
    if where.exists():
        return reference.read_reference(where), False
    computed = _run_reference(run, spec, settings)
    where.write_parquet(computed.to_table())
    return computed, True
