"""What a dataset hands to a trial: tensors on the CPU, ready to move to the trial's device once."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ursa_ray.methods.base import Augment, Hyperparameter


class DatasetMissing(FileNotFoundError):
    """Raised before any trial starts when a dataset's files are not under the data root."""


@dataclass
class Dataset:
    """An in-domain training and test set, with its out-of-distribution sets.

    ``task`` is ``"classification"`` (``n_outputs`` classes, integer labels) or ``"regression"``
    (``n_outputs`` = 1, float targets, ``noise_std`` the known observation noise).  ``test_y`` holds the
    labels, or for regression the noise-free truth.  ``test_info`` carries extra per-test-point columns
    (regression: ``in_distribution``).  ``cost_matrix[true, decision]`` defines the decision task where
    the dataset has one.  ``feature_map`` is the true feature map G of a synthetic regression problem
    (inputs → n × p features), for the anchor model and for models linear in G.  ``pixel_mean`` and
    ``pixel_std`` (one value per channel; image datasets only) are the normalisation every image tensor
    of the dataset went through, x = (pixel − mean) / std with pixels in [0, 1]: attacks and corruptions
    work in pixel space and map back with them.  ``test_y_observed`` (regression read from files): ``test_y``
    holds noisy observations, not the noise-free truth, so the test set is scored with the predictive
    metrics and writes no per-point rows.
    """

    name: str
    task: str
    input_shape: tuple[int, ...]
    n_outputs: int
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    ood: dict[str, Tensor] = field(default_factory=dict)
    augment: Augment | None = None
    noise_std: float | None = None
    cost_matrix: Tensor | None = None
    pixel_mean: tuple[float, ...] | None = None
    pixel_std: tuple[float, ...] | None = None
    test_info: dict[str, Tensor] = field(default_factory=dict)
    feature_map: Callable[[Tensor], Tensor] | None = None
    test_y_observed: bool = False


@dataclass(frozen=True)
class AttackBudget:
    """The ε (pixel units, images in [0, 1]) of the adversarial attacks on a dataset's images: ``epsilons``,
    crafted when the grid gives none, and ``reference``, the ε of the robustness composite (accuracy under
    PGD), always crafted too."""

    epsilons: tuple[float, ...]
    reference: float


@dataclass(frozen=True)
class DatasetSpec:
    """A named in-domain dataset: its task, the OOD sets it can be paired with, and its loader.

    ``load(options, ood_names, data_root, download, seed)`` returns a :class:`Dataset` whose ``ood`` dict holds
    the requested OOD sets, normalised with the in-domain statistics.  ``check(data_root, ood_names)``
    raises :class:`DatasetMissing` (naming the dataset, the path looked at and how to get it) when files
    are absent; it is called before any trial starts.  ``options`` are extra settings a grid may give,
    ``sweep`` names the option a regression grid sweeps as its complexity.  ``decision_task`` marks a
    training set made for URSABench's decision task (an imbalanced copy): its cells count only in the
    ``decision_cost`` composite, never in the in-domain ones.  ``seed`` is the trial's seed:
    classification splits ignore it (they are fixed); a regression repetition draws its noise from it.
    """

    name: str
    task: str
    description: str
    load: Callable[[Mapping[str, Any], tuple[str, ...], Path, bool, int], Dataset]
    ood_sets: tuple[str, ...] = ()
    options: tuple[Hyperparameter, ...] = ()
    check: Callable[[Path, tuple[str, ...]], None] | None = None
    sweep: str | None = None
    decision_task: bool = False
    images: bool = True
    """Whether the inputs are images, which adversarial attacks need ε for (False: sequences, graphs)."""
    attack_budget: AttackBudget | None = None
    """The ε its images are attacked at by default (None: a grid that attacks it must give ε, and no set of
    its attacks is the robustness composite's)."""
    torchvision: bool = False
    """Whether ``load`` imports torchvision (its dataset readers, ``ImageFolder``): a worker imports it before a
    trial's timings start (:func:`ursa_ray.trial.warm_up_worker`)."""


def data_root(grid_value: str | None) -> Path:
    """The data root: ``URSA_DATA`` if set, else the grid's ``data_root``, else ``~/.ursa_ray/data``."""
    chosen = Path(os.environ.get("URSA_DATA") or grid_value or "~/.ursa_ray/data").expanduser()
    try:
        return chosen.resolve()
    except RuntimeError:  # a symlink loop (Python 3.11): the dataset's check then says its files are not there
        return chosen.absolute()


def standardise(x: Tensor, mean: float, std: float) -> Tensor:
    return ((x - mean) / std).to(torch.float32)
