"""One trial, without Ray: load data onto the device, stream posterior samples, accumulate the posterior
predictive online on every evaluation set, and return the rows that land in the results directory.

The search phase trains on the training set less a seeded validation split and evaluates on that split
only (the test set is never loaded into the evaluation); the final phase trains on the whole training set
and evaluates on the test set and the OOD sets.  Both run this same function, so schedules and budgets
cannot differ between them.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from ursa_ray import data, eval_sets, methods, reference
from ursa_ray.evaluation import (
    ClassificationPredictive,
    RegressionPredictive,
    classification_metrics,
    fidelity,
)
from ursa_ray.evaluation.predictions import SavedPredictive, reference_prediction_table, validation_temperature
from ursa_ray.evaluation.probes import calibration, make_probes
from ursa_ray.evaluation.probes.adversarial import TransferProbe
from ursa_ray.evaluation.probes.base import ProbeContext, predict
from ursa_ray.evaluation.probes.fidelity import FidelityProbe
from ursa_ray.evaluation.probes.in_domain import in_domain_metrics
from ursa_ray.evaluation.test_time_cost import cost_metrics_at_test_time
from ursa_ray.methods import batched
from ursa_ray.methods.base import Categorical, Method, Problem, as_method
from ursa_ray.prepare import PreparedTrial, pick_device, prepare
from ursa_ray.results import Location, metric_key, with_eval_kind
from ursa_ray.spec import TrialSpec


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


def planned_samples(method: Method, config: Mapping[str, Any], problem: Problem) -> tuple[int, int]:
    """(S, C): the samples per chain and the chains of ``method``'s stream for ``config`` on ``problem``, as
    the method declares them (:meth:`~ursa_ray.methods.base.Method.sample_plan`; which samples the
    adversarial model average keeps depends on them).  The stream yields C·S samples."""
    plan = as_method(method).sample_plan(config, problem)
    return plan.per_chain, plan.n_chains


def chains_in_turn(method: Method, probe: torch.nn.Module, problem: Problem) -> bool:
    """Whether ``method``'s stream pools its chains one after another rather than interleaved: on a network
    that cannot be batched, where the method declares so (``chains_in_turn_when_unbatchable``: SG-MCMC); HMC
    and every batched stream yield, at each sampling step, chain 1's sample, then chain 2's, ..."""
    return as_method(method).chains_in_turn_when_unbatchable and not batched.can_batch(probe, problem)


_warmed_up: set[tuple[str, torch.device]] = set()
"""What this process has paid its one-off costs for (:func:`warm_up_worker`): ("", device) for the process
itself, (method name, device) for each method, (:data:`TORCHVISION_WARM_UP`, device) for torchvision."""

TORCHVISION_WARM_UP = "<torchvision>"
""":data:`_warmed_up`'s name for importing torchvision (no method has it: names are identifiers)."""


def warm_up_worker(device: torch.device, method_names: Iterable[str], torchvision: bool = False) -> float:
    """Pay a worker process's one-off costs before a timed trial of ``method_names``; returns the seconds
    spent (0 when the process has paid them all before).

    The process's own on its first call: torch's first calls (thread pool, autograd, the optimiser, the
    device's context) and the evaluation path (accumulator and scikit-learn metrics).  Each method's
    (:meth:`~ursa_ray.methods.base.Method.warm_up`: compiled kernels, packages it imports lazily) the first
    time the process runs that method, so that a worker that never runs a method never pays for it; with
    ``torchvision`` (the trial may import it, :func:`~ursa_ray.prepare.needs_torchvision`), torchvision and its
    v2 transforms the first time (~1 s with torch._dynamo, which a worker that never needs them skips).  The
    trial runner calls it before every trial and records the time in its own column, ``worker_setup_s``, so
    that no method's cost depends on whether it ran first in a worker.
    """
    start = time.perf_counter()
    due = [name for name in ("", *method_names) if (name, device) not in _warmed_up]
    if torchvision and (TORCHVISION_WARM_UP, device) not in _warmed_up:
        due.append(TORCHVISION_WARM_UP)
    for name in due:
        if name == TORCHVISION_WARM_UP:
            _warm_up_torchvision()
        elif name:
            methods.get_method(name).warm_up(device)
        else:
            _warm_up_process(device)
        _warmed_up.add((name, device))
    if not due:
        return 0.0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _warm_up_torchvision() -> None:
    """Import torchvision with the v2 transforms corrupting uses (the package brings its dataset readers, ops and
    torch._dynamo)."""
    import torchvision.transforms.v2.functional  # noqa: F401


def _warm_up_process(device: torch.device) -> None:
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


def _sample_plan(trial: PreparedTrial) -> tuple[int, int, bool]:
    """(S, C, in turn): the samples per chain and chains of the method's stream (:func:`planned_samples`)
    and, with several chains, whether they run in turn (:func:`chains_in_turn`, on a network built with
    torch's generator put back afterwards)."""
    per_chain, n_chains = planned_samples(trial.method, trial.spec.config, trial.problem)
    in_turn = False
    if n_chains > 1:
        with torch.random.fork_rng(devices=[]):
            in_turn = chains_in_turn(trial.method, trial.build_model(), trial.problem)
    return per_chain, n_chains, in_turn


def new_predictive(ds: data.base.Dataset, n: int, device: torch.device) -> Any:
    """An empty posterior-predictive accumulator of ``n`` examples for ``ds``'s task."""
    if ds.task == "classification":
        return ClassificationPredictive(n, ds.n_outputs, device)
    return RegressionPredictive(n, device)


class TrialRun:
    """One trial: its prepared data and problem (:func:`~ursa_ray.prepare.prepare`), the posterior predictive
    on each evaluation set, and its evaluation probes (:mod:`ursa_ray.evaluation.probes`).  :meth:`observe`
    passes a posterior sample to every probe, :meth:`finish` computes the metrics and rows.
    :func:`run_trial` drives one method stream through it; :func:`run_trials_batched` one batched stream
    through several.

    ``own_init_stream``: model initialisations come from a generator state of this trial's own (seeded
    with its ``init`` seed) rather than torch's global generator, so that several trials prepared side by
    side each build the networks they would alone."""

    def __init__(self, spec: TrialSpec, device: torch.device | None = None, own_init_stream: bool = False):
        self.trial = trial = prepare(spec, device, own_init_stream)
        self.spec, self.device, self.seeds, self.ds = spec, trial.device, trial.seeds, trial.ds
        self.problem, self.method, self.eval_sets = trial.problem, trial.method, trial.eval_sets
        self.precision, self.training_precision = trial.precision, trial.training_precision
        self.build_model, self.setup_s, self.started_cpu = trial.build_model, trial.setup_s, trial.started_cpu
        self.accumulators = {
            name: new_predictive(self.ds, x.shape[0], self.device) for name, (x, _) in self.eval_sets.items()
        }
        self.probes = make_probes(ProbeContext(trial, self.accumulators, functools.partial(_sample_plan, trial)))
        self.stats: dict[str, float] = {}
        self.train_s = 0.0
        self.last_predictor: Any = None

    @property
    def n_params(self) -> int:
        """Parameters of the model as built (before a method adds its own), counted by its first build."""
        return self.build_model.n_params

    def seconds(self, clock: str) -> float:
        """The probes' seconds charged to the trial-row column ``clock``."""
        return sum(probe.seconds for probe in self.probes if probe.clock == clock)

    def observe(
        self, predictor: Any, progress: Callable[[int, dict[str, float], dict[str, float]], None] | None = None
    ) -> None:
        """Pass one posterior sample to every probe in registration order, timing each."""
        self.last_predictor = predictor
        for probe in self.probes:
            tick = time.perf_counter()
            probe.observe(predictor)
            probe.seconds += time.perf_counter() - tick
        if progress is not None and "validation" in self.eval_sets:
            running = in_domain_metrics(
                self.ds, self.accumulators["validation"], self.eval_sets["validation"][1], "validation"
            )
            progress(
                self.accumulators["validation"].n_samples,
                {f"val_{k}": float(v) for k, v in running.items()},
                {"train_s": self.train_s, "cpu_s": time.process_time() - self.started_cpu},
            )

    def finish(self) -> TrialOutcome:
        """The trial's metrics and rows from what its probes observed (``train_s`` set by the driver)."""
        spec, ds = self.spec, self.ds
        n_samples = next(iter(self.accumulators.values())).n_samples
        if n_samples == 0:
            raise RuntimeError(f"method {spec.method} produced no posterior samples")
        values: dict[str, dict[str, float]] = {}
        for probe in self.probes:  # two families may report on one set (their metric names differ)
            for name, table in probe.compute().items():
                values.setdefault(name, {}).update(table)
        transfer = next((p for p in self.probes if isinstance(p, TransferProbe)), None)
        scored_by = next((p.reference_from for p in self.probes if isinstance(p, FidelityProbe)), "")
        outcome = TrialOutcome(record={}, transfer_examples=None if transfer is None else transfer.crafted)
        if spec.phase == "final" and ds.task != "classification" and not ds.test_y_observed:
            anchor = _anchor(ds)
            outcome.points = _points(spec, ds, self.accumulators["test"], anchor)  # a file's set has no truth
            if anchor is not None:  # the exact posterior: this cell's reference (W₂ per point, in and out)
                values[eval_sets.fidelity(eval_sets.TEST)] = _anchor_fidelity(ds, self.accumulators["test"], anchor)
        if "validation" in values:
            outcome.selection = {f"val_{k}": float(v) for k, v in values["validation"].items()}
        saving = spec.save_predictions and spec.phase == "final" and ds.task == "classification"
        tables = self.prediction_tables() if saving or spec.calibrate else {}
        if spec.calibrate:
            values.update(self.calibrated(tables))
        values["cost"] = self.cost(n_samples)
        outcome.metrics = metric_rows(spec, values)
        if saving:
            outcome.predictions = tables
        # the trial whose examples the transfer sets are (the source's own id for itself)
        outcome.record = self.record(
            n_samples, transfer.source if transfer and transfer.attacked.n_kept else "", scored_by
        )
        return outcome

    def prediction_tables(self) -> dict[str, pd.DataFrame]:
        """Every probe's prediction tables by set name (after :meth:`Probe.compute`: the attacks' exist then)."""
        return {name: table for probe in self.probes for name, table in probe.rows().items()}

    def calibrated(self, tables: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, float]]:
        """Temperature scaling: T fitted on the validation split's predictive (its seconds charged to the
        validation probe's eval clock and, with T, recorded in ``method_stats`` as ``temperature_fit_s`` and
        ``validation_temperature``), then every ``SET@calibrated`` (:func:`calibration.calibrated_sets`)."""
        tick = time.perf_counter()
        held_out = SavedPredictive(tables[eval_sets.VALIDATION])
        temperature = validation_temperature(held_out, held_out.labels)
        fit_s = time.perf_counter() - tick
        next(p for p in self.probes if isinstance(p, calibration.ValidationProbe)).seconds += fit_s
        self.stats.update(validation_temperature=temperature, temperature_fit_s=fit_s)
        cost = None if self.ds.cost_matrix is None else self.ds.cost_matrix.numpy()
        return calibration.calibrated_sets(tables, temperature, cost)

    def cost(self, n_samples: int) -> dict[str, float]:
        """The ``cost`` metrics: training and prediction time, size, and the test-time cost of the posterior
        (the last sample stands for the structure of every one: FLOPs of a forward pass, storage)."""
        n_eval_examples = sum(x.shape[0] for x, _ in self.eval_sets.values())
        return {
            "train_s": self.train_s,
            "s_per_sample": self.train_s / n_samples,
            "predict_s_per_example": self.seconds("eval_s") / n_eval_examples,
            "n_params": float(self.n_params),
            "n_samples": float(n_samples),
            **cost_metrics_at_test_time(
                self.method, self.last_predictor, self.spec.config, n_samples, self.ds.input_shape
            ),
        }

    def record(self, n_samples: int, transfer_from: str, reference_from: str) -> dict[str, Any]:
        """The trial's ``trials.parquet`` row: ``transfer_from`` the trial whose examples its transfer sets are,
        ``reference_from`` what scored its fidelity (:func:`~ursa_ray.evaluation.probes.fidelity.scoring_reference`)."""
        stats = self.stats
        return {
            "n_samples": n_samples,
            "n_params": self.n_params,
            "setup_s": self.setup_s,
            "train_s": self.train_s,
            "eval_s": self.seconds("eval_s"),
            "bit_depth_eval_s": self.seconds("bit_depth_eval_s"),
            "attack_s": self.seconds("attack_s"),
            "device": str(self.device),
            "precision": self.training_precision,
            "grad_evals": float(stats.get("grad_evals", math.nan)),
            "accept_rate": float(stats.get("accept_rate", math.nan)),
            "method_stats": json.dumps({k: float(v) for k, v in stats.items()}, sort_keys=True),
            "transfer_from": transfer_from,
            "reference_from": reference_from,
        }


def metric_rows(spec: TrialSpec, values: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Long-format ``metrics.parquet`` rows of a trial: one per (evaluation set, metric), each with the
    ``eval_kind`` of its set.  A set name outside :mod:`ursa_ray.eval_sets`' grammar raises here, in the
    worker, so that the trial that made it is recorded as failed (the driver would refuse its rows)."""
    base = metric_key(spec)
    return with_eval_kind(
        [
            {**base, "eval_set": eval_set, "metric": metric, "value": float(value)}
            for eval_set, table in values.items()
            for metric, value in table.items()
        ]
    )


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
    spec: TrialSpec,
    device: torch.device | None = None,
    progress: Callable[[int, dict[str, float], dict[str, float]], None] | None = None,
) -> TrialOutcome:
    """Run the trial described by ``spec`` (see :meth:`ursa_ray.grid.Grid.spec_for`).

    ``progress(n_samples, validation_metrics, cost_so_far)`` is called after each posterior sample in the
    search phase (the running posterior predictive on the validation split), for early stopping."""
    run = TrialRun(spec, device)
    stream = run.method.sample_posterior(run.problem, spec.config, run.stats)
    run.train_s = _stream_into([run], stream, False, progress)
    return run.finish()


def run_trials_batched(specs: list[TrialSpec], device: torch.device | None = None) -> list[TrialOutcome]:
    """Run the trials of ``specs`` -- seeds of one (method, model, dataset, configuration) -- with the
    method's batched stream (``sample_posterior_batched``; :mod:`ursa_ray.methods.batched`): every trial
    gets the outcome it would alone (its own data, initialisation, random streams, evaluation), but the
    training is one computation.  The training seconds, like the trial's other shared costs, are split
    evenly over the trials (the driver's trial row says how many shared it: ``seeds_in_trial``).  The seeds
    run in chunks whose copies (seeds × the method's ``batched_copies(config, model)``: ensemble members,
    chains, what it keeps per seed) fit
    :data:`~ursa_ray.methods.batched.COPY_MEMORY_BUDGET` (:func:`~ursa_ray.methods.batched.max_copies`).
    A method without a batched stream, or a network too large to batch, runs the trials one after another."""
    first = TrialRun(specs[0], device, own_init_stream=True)
    method = first.method
    with torch.random.fork_rng(devices=[]):
        probe = first.build_model()
    if not method.batchable or not batched.can_batch(probe, first.problem):
        return [run_trial(spec, device) for spec in specs]
    runs = [first] + [TrialRun(spec, device, own_init_stream=True) for spec in specs[1:]]
    config = specs[0].config
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
            outcomes.append(run.finish())
    return outcomes


def run_reference_trial(spec: TrialSpec, device: torch.device | None = None) -> TrialOutcome:
    """A reference trial (phase ``reference``, :func:`ursa_ray.grid.expand._link_references`): its cell's reference
    reused from ``spec.references_dir`` or computed and stored there (:func:`stored_or_computed`); metric rows
    ``reference:SET`` (its noise floor ``noise_*``, ``rhat_max``, ``ess_bulk_min``, ``converged``) and ``cost``
    (``computed``: 1 when this trial ran the chains, 0 when it reused them; the stored run's cost either way)."""
    run = TrialRun(reference.reference_spec(spec, spec.reference), device)
    ref, computed = _stored_or_computed(run, spec, spec.reference, Location.parse(spec.references_dir))
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
    if spec.save_predictions and ref.task == "classification":
        outcome.predictions = _reference_predictions(ref, run)
    spent = ref.cost if computed else {}
    outcome.record = {
        "n_samples": int(ref.cost.get("n_samples", 0)),
        "setup_s": spent.get("setup_s", 0.0),
        "train_s": spent.get("train_s", 0.0),
        "eval_s": spent.get("eval_s", 0.0),
        "device": str(device or pick_device(spec.resources["gpu"])),
        "grad_evals": float(ref.cost.get("grad_evals", math.nan)) if computed else 0.0,
        "accept_rate": float(ref.cost.get("accept_rate", math.nan)),
        "method_stats": json.dumps(
            {"fingerprint": ref.fingerprint, "computed": computed, **ref.convergence.as_metrics()}, sort_keys=True
        ),
        "transfer_from": "",
        "reference_from": "",
    }
    return outcome


def _anchor(ds: data.base.Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact anchor's (mean, std) of the noise-free output at the test points, where the dataset has one
    (a feature map: the synthetic regression experiments)."""
    from ursa_ray.regression.anchor import anchor_for_dataset

    return anchor_for_dataset(ds) if ds.feature_map is not None else None


def _anchor_fidelity(
    ds: data.base.Dataset, pred: RegressionPredictive, anchor: tuple[np.ndarray, np.ndarray]
) -> dict[str, float]:
    """The method's W₂ to the anchor (:func:`~ursa_ray.evaluation.fidelity.regression_fidelity`), over every test
    point and over those inside and outside the training region."""
    inside = ds.test_info.get("in_distribution")
    inside = None if inside is None else np.asarray(inside, dtype=bool)
    return fidelity.regression_fidelity(anchor[0], anchor[1], pred.mean, pred.std, inside)


def _points(
    spec: TrialSpec,
    ds: data.base.Dataset,
    pred: RegressionPredictive,
    anchor: tuple[np.ndarray, np.ndarray] | None,
) -> list[dict[str, Any]]:
    """Per-test-point rows for the method and, where there is one, for the exact ``anchor`` (method "blr"),
    built column-wise without DataFrames (:func:`~ursa_ray.regression.points.points_rows`; docs/vectorised.md)."""
    from ursa_ray.regression.points import ANCHOR_METHOD, ANCHOR_MODEL, points_rows

    complexity = spec.complexity_or_nan
    where = {"complexity": complexity, "repetition": spec.seed}
    rows = points_rows(ds, pred.mean, pred.std, method=spec.label, model=spec.model, trial_id=spec.trial_id, **where)
    if anchor is not None:
        anchor_id = f"blr-{spec.dataset}-c{complexity:g}-s{spec.seed}"
        rows += points_rows(ds, *anchor, method=ANCHOR_METHOD, model=ANCHOR_MODEL, trial_id=anchor_id, **where)
    return rows


def compute_reference(
    spec: TrialSpec, settings: Mapping[str, Any], device: torch.device | None = None
) -> reference.Reference:
    """Run the reference of ``spec``'s cell (:mod:`ursa_ray.reference`: the existing HMC with the grid's
    reference settings, its chains' predictives accumulated online) and check it."""
    return _run_reference(TrialRun(reference.reference_spec(spec, settings), device), spec, settings)


def _run_reference(run: TrialRun, spec: TrialSpec, settings: Mapping[str, Any]) -> reference.Reference:
    """The reference's chains streamed through ``run`` (a :class:`TrialRun` of :func:`reference_spec`)."""
    merged = {**reference.SETTINGS_DEFAULTS, **settings}
    if merged["method"] != "hmc":
        raise ValueError(f"reference method must be 'hmc', got {merged['method']!r}")
    task, config = run.ds.task, run.spec.config
    n_chains = config["n_chains"]
    per_chain = {
        name: [new_predictive(run.ds, x.shape[0], run.device) for _ in range(n_chains)]
        for name, (x, _) in run.eval_sets.items()
    }
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
    pooled, chains, floors = _pooled_chains_and_floors(task, run.accumulators, per_chain)
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
    fingerprint = reference.fingerprint(spec, settings, reference.data_digest(run.ds))
    return reference.Reference(fingerprint, task, pooled, chains, checked, floors, reference.what_it_is(merged), cost)


def _pooled_chains_and_floors(
    task: str, pooled_predictives: Mapping[str, Any], per_chain: Mapping[str, list[Any]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, dict[str, float]]]:
    """The reference's pooled and per-chain predictives by set (classification: mean probabilities;
    regression: columns mean, std) and, with several chains, its noise floor by set
    (:func:`~ursa_ray.evaluation.fidelity.noise_floor`, :func:`~ursa_ray.evaluation.fidelity.regression_noise_floor`)."""
    pooled, chains, floors = {}, {}, {}
    for name, acc in pooled_predictives.items():
        if task == "classification":
            pooled[name] = acc.mean_probs
            chains[name] = np.stack([a.mean_probs for a in per_chain[name]])
            if len(per_chain[name]) > 1:
                floors[name] = fidelity.noise_floor(chains[name])
        else:
            pooled[name] = np.stack([acc.mean, acc.std], axis=1)
            chains[name] = np.stack([np.stack([a.mean, a.std], axis=1) for a in per_chain[name]])
            if len(per_chain[name]) > 1:
                floors[name] = fidelity.regression_noise_floor(chains[name][..., 0], chains[name][..., 1] ** 2)
    return pooled, chains, floors


def stored_or_computed(
    spec: TrialSpec, settings: Mapping[str, Any], references: Location, device: torch.device | None = None
) -> tuple[reference.Reference, bool]:
    """The cell's reference from the ``references`` folder when one with its fingerprint is stored there, else
    computed and stored (atomically); the second value says whether it was computed."""
    return _stored_or_computed(TrialRun(reference.reference_spec(spec, settings), device), spec, settings, references)


def _stored_or_computed(
    run: TrialRun, spec: TrialSpec, settings: Mapping[str, Any], references: Location
) -> tuple[reference.Reference, bool]:
    """:func:`stored_or_computed` with the reference's :class:`TrialRun` (its data) made by the caller."""
    where = reference.reference_location(
        references, reference.fingerprint(spec, settings, reference.data_digest(run.ds))
    )
    if where.exists():
        return reference.read_reference(where), False
    computed = _run_reference(run, spec, settings)
    where.write_parquet(computed.to_table())
    return computed, True


def _reference_predictions(ref: reference.Reference, run: TrialRun) -> dict[str, pd.DataFrame]:
    """The reference's pooled predictive on every set it covers, saved like a method's
    (:func:`~ursa_ray.evaluation.predictions.reference_prediction_table`: the test set with its labels, an OOD
    set with none, the reference's checks on the set as columns)."""
    n_samples = int(ref.cost.get("n_samples", 0))
    tables = {}
    for name, probs in ref.pooled.items():
        labels = run.eval_sets[name][1]
        tables[name] = reference_prediction_table(
            probs, None if labels is None else labels.cpu().numpy(), n_samples, ref.checks(name)
        )
    return tables
