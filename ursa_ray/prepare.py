"""A trial's data preparation: its random streams, its device, its data loaded and split, the common
corruptions of its test set, as the evaluation sets its probes observe (:mod:`ursa_ray.evaluation.probes`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray import data
from ursa_ray.evaluation.corruptions import corrupt

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
        f"corrupt:{kind}:{severity}": (corrupt(x, kind, severity, seed, ds.pixel_mean, ds.pixel_std), y)
        for kind in settings["types"]
        for severity in settings["severities"]
    }
