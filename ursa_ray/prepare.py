"""A trial's data preparation: its random streams, its device, its data loaded and split, the common
corruptions of its test set, as the evaluation sets its probes observe (:mod:`ursa_ray.evaluation.probes`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray import data, eval_sets, methods, models
from ursa_ray.evaluation.corruptions import corrupt
from ursa_ray.evaluation.precision import evaluation_precision, keep_output_layer_float32
from ursa_ray.methods._training import autocast_dtype, default_precision
from ursa_ray.methods.base import Categorical, Gaussian, Problem
from ursa_ray.spec import TrialSpec

EvalSets = dict[str, tuple[Tensor, Tensor | None]]
"""Evaluation sets by name: inputs on the trial's device, targets on the CPU (None for an OOD set)."""

CALIBRATION_FRACTION = 0.1
"""The share of the training set a trial with ``calibrate: temperature`` holds out to fit its temperature on."""

RANDOM_STREAMS = ("init", "data", "split", "corruption", "transfer_init", "transfer_data", "attack")


def trial_seeds(seed: int) -> dict[str, int]:
    """Independent seeds of a trial's random streams, spawned from ``numpy.random.SeedSequence(seed)``
    (children in the order of ``RANDOM_STREAMS``, 64 bits each):

    - ``init``: torch's global generator (weight initialisation, dropout masks) and numpy's global state;
    - ``data``: ``problem.generator`` (mini-batch order, augmentation, bootstrap resampling, and the
      methods' own draws: SG-MCMC and HMC take their noise key from it once, before the first step);
    - ``split``: the search phase's validation split (the same for every configuration of a cell);
    - ``corruption``: the random draws of the common corruptions (the same images for every method);
    - ``transfer_init``, ``transfer_data``: the transfer source network's initialisation and mini-batch
      order (:func:`train_transfer_source`), which no method's own network shares;
    - ``attack``: the adversarial attacks' draws (PGD's random start, the kept samples' dropout masks).

    No two streams share bits, of one trial or of two seeds (SeedSequence hashes the seed and the
    child's index).  A stream appended to ``RANDOM_STREAMS`` leaves the others' values unchanged.
    """
    children = np.random.SeedSequence(seed).spawn(len(RANDOM_STREAMS))
    return {name: int(c.generate_state(1, np.uint64)[0]) for name, c in zip(RANDOM_STREAMS, children, strict=True)}


def validation_split(n: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded random split of range(n) into (train, validation) indices, ⌈fraction·n⌉ for validation,
    drawn from the trial seed's ``split`` stream (:func:`trial_seeds`)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(trial_seeds(seed)["split"]))
    n_val = max(1, math.ceil(fraction * n))
    return order[n_val:], order[:n_val]


def pick_device(n_gpus: float) -> torch.device:
    """The trial's device: the GPU Ray assigned (visible as cuda:0) when the trial asked for one."""
    if n_gpus > 0 and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def needs_torchvision(spec: TrialSpec) -> bool:
    """Whether ``spec``'s trial may import torchvision: to load its dataset (``DatasetSpec.torchvision``), or to
    build corruption sets (:func:`corrupted_sets`: a final trial, not the decision task's, with corruption
    types in its grid; its dataset decides the rest)."""
    corrupts = spec.phase == "final" and not spec.decision_task and bool(spec.corruptions["types"])
    return corrupts or data.dataset_spec(spec.dataset, spec.dataset_file).torchvision


def corrupted_sets(
    ds: data.base.Dataset, test: tuple[Tensor, Tensor], settings: Mapping[str, Any], seed: int
) -> dict[str, tuple[Tensor, Tensor]]:
    """The first ``n_examples`` test images under each common corruption and severity (Hendrycks &
    Dietterich 2019; MNIST-C), as labelled evaluation sets ``corrupt:TYPE:SEVERITY``, made once per trial on
    its device from the trial seed's ``corruption`` stream (the same images for every method)."""
    if ds.pixel_mean is None or not settings["types"]:
        return {}
    x, y = test[0][: settings["n_examples"]], test[1][: settings["n_examples"]]
    return {
        eval_sets.corruption(kind, severity): (corrupt(x, kind, severity, seed, ds.pixel_mean, ds.pixel_std), y)
        for kind in settings["types"]
        for severity in settings["severities"]
    }


class ModelBuilder:
    """Builds the trial's network on its device from torch's global generator: channels-last for images on
    a GPU, the output layer kept float32 under any autocast.  ``n_params`` counts the parameters of the
    model as built (before a method adds its own), set by the first build."""

    def __init__(self, spec: TrialSpec, ds: data.base.Dataset, device: torch.device, float32_output: bool):
        self.model_spec = models.get_model(spec.model)
        self.kwargs = dict(spec.model_options)
        if self.model_spec.needs_feature_map:
            self.kwargs["feature_map"] = ds.feature_map
        self.input_shape, self.n_outputs = ds.input_shape, ds.n_outputs
        self.device, self.float32_output = device, float32_output
        self.n_params = 0

    def __call__(self) -> torch.nn.Module:
        model = self.model_spec.build(self.input_shape, self.n_outputs, **self.kwargs).to(self.device)
        if self.device.type == "cuda" and len(self.input_shape) == 3:
            model = model.to(memory_format=torch.channels_last)
        if self.float32_output:
            keep_output_layer_float32(model, self.n_outputs)
        self.n_params = self.n_params or sum(p.numel() for p in model.parameters())
        return model


def own_init_stream(build: ModelBuilder, seed: int) -> Callable[[], torch.nn.Module]:
    """``build`` drawing from a generator state of its own, seeded with ``seed`` and carried from one build
    to the next, with torch's global generator left as it was: trials prepared side by side each build
    the networks they would alone."""
    state = torch.Generator().manual_seed(seed).get_state()

    def make_model() -> torch.nn.Module:
        nonlocal state
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            model = build()
            state = torch.get_rng_state()
        return model

    return make_model


@dataclass
class PreparedTrial:
    """A trial ready to stream posterior samples: its data as a :class:`Problem`, its method, and the
    evaluation sets the probes observe (``full_precision_sets``: the ones also evaluated at lower bit
    depths; ``robustness``: whether corruptions and attacks apply)."""

    spec: TrialSpec
    device: torch.device
    seeds: dict[str, int]
    ds: data.base.Dataset
    problem: Problem
    method: Any
    eval_sets: EvalSets
    full_precision_sets: list[str]
    robustness: bool
    precision: torch.dtype | None
    """The evaluation's autocast dtype (:func:`evaluation_precision`)."""
    training_precision: str | None
    build_model: ModelBuilder
    """From torch's global generator, whatever ``own_init_stream``."""
    setup_s: float
    started_cpu: float


def split_sets(spec: TrialSpec, ds: data.base.Dataset) -> tuple[Tensor, Tensor, EvalSets]:
    """(training inputs, targets, evaluation sets): the search phase trains on the training set less a
    seeded validation split and evaluates on that split; any other phase trains on the whole training set
    and evaluates on the test set and the OOD sets, except a trial with ``calibrate`` (temperature scaling),
    which trains on the training set less a seeded validation split of :data:`CALIBRATION_FRACTION` (the
    same ``split`` stream as the search's) and evaluates on that split too (``validation``, last)."""
    if spec.phase == "search":
        fit, val = validation_split(len(ds.train_y), spec.validation_fraction, spec.seed)
        return ds.train_x[fit], ds.train_y[fit], {"validation": (ds.train_x[val], ds.train_y[val])}
    sets: EvalSets = {"test": (ds.test_x, ds.test_y)} | {n: (x, None) for n, x in ds.ood.items()}
    if spec.calibrate is None:
        return ds.train_x, ds.train_y, sets
    fit, val = validation_split(len(ds.train_y), CALIBRATION_FRACTION, spec.seed)
    return ds.train_x[fit], ds.train_y[fit], sets | {"validation": (ds.train_x[val], ds.train_y[val])}


def prepare(spec: TrialSpec, device: torch.device | None = None, own_init: bool = False) -> PreparedTrial:
    """Seed the trial's streams (:func:`trial_seeds`: torch's and numpy's global generators from ``init``,
    the problem's generator from ``data``), load and split its data onto ``device``, corrupt its test set
    (final classification trials of image cells, the composites use no other) and set up its problem.
    ``own_init``: networks from a generator state of the trial's own (:func:`own_init_stream`)."""
    started_cpu, start_wall = time.process_time(), time.perf_counter()
    device = device or pick_device(spec.resources["gpu"])
    seeds = trial_seeds(spec.seed)
    torch.manual_seed(seeds["init"])
    np.random.seed(seeds["init"] % 2**32)
    generator = torch.Generator().manual_seed(seeds["data"])
    dataset_spec = data.dataset_spec(spec.dataset, spec.dataset_file)  # registered, or read from files
    root = data.base.data_root(spec.data_root)
    ds = dataset_spec.load(spec.dataset_options, spec.ood, root, spec.download, spec.seed)
    train_x, train_y, eval_sets = split_sets(spec, ds)
    full_precision_sets = [name for name in eval_sets if name != "validation"]  # the test and OOD sets
    train_x, train_y = train_x.to(device), train_y.to(device)
    eval_sets = {k: (x.to(device), y) for k, (x, y) in eval_sets.items()}
    robustness = spec.phase == "final" and ds.task == "classification" and not spec.decision_task
    robustness = robustness and ds.pixel_mean is not None  # tabular data have no pixels to perturb
    if robustness:
        eval_sets.update(corrupted_sets(ds, eval_sets["test"], spec.corruptions, seeds["corruption"]))
    precision = evaluation_precision(device, ds.task)
    training_precision = spec.precision or default_precision(device, ds.task)
    training_dtype = autocast_dtype(training_precision)
    build = ModelBuilder(spec, ds, device, precision is not None or training_dtype is not None)
    make_model = own_init_stream(build, seeds["init"]) if own_init else build
    likelihood = Categorical() if ds.task == "classification" else Gaussian(float(ds.noise_std))
    problem = Problem(train_x, train_y, likelihood, make_model, generator, device, ds.augment, training_dtype)
    method = methods.get_method(spec.method)
    setup_s = time.perf_counter() - start_wall
    return PreparedTrial(
        spec, device, seeds, ds, problem, method, eval_sets, full_precision_sets, robustness, precision,
        training_precision, build, setup_s, started_cpu,
    )  # fmt: skip
