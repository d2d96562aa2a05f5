"""``two_moons``: scikit-learn's ``make_moons``, generated (no files), a two-class problem in the plane.

1,000 training and 500 test points, drawn once (random_state 0: the same split for every trial).  Inputs
are the 2 coordinates scaled to [0, 1] by the training range (the "pixels" the adversarial attacks work
in), then standardised per coordinate.  OOD set ``far_ring``: 500 points on a ring of radius 3 to 4
around the moons, far from every training point.  Not images: a grid turns the common corruptions off
(``corruptions: {types: []}``) and gives the attacks their ε (``adversarial: {epsilons: [...]}``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.methods.base import Hyperparameter

N_TRAIN, N_TEST = 1000, 500
OPTIONS = (Hyperparameter("noise", float, 0.2, "standard deviation of the noise on the moons", low=0.0),)


def _far_ring(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    angle, radius = rng.uniform(0, 2 * math.pi, n), rng.uniform(3.0, 4.0, n)
    return np.stack([0.5 + radius * np.cos(angle), 0.25 + radius * np.sin(angle)], axis=1)


def load_two_moons(
    options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int
) -> Dataset:
    """The dataset protocol's ``load``: files (``root``, ``download``) and the trial ``seed`` are not used."""
    from sklearn.datasets import make_moons

    noise = options.get("noise", OPTIONS[0].default)
    x, y = make_moons(N_TRAIN + N_TEST, noise=noise, random_state=0)
    low, high = x[:N_TRAIN].min(axis=0), x[:N_TRAIN].max(axis=0)
    pixels_train = (x[:N_TRAIN] - low) / (high - low)
    mean, std = pixels_train.mean(axis=0), pixels_train.std(axis=0)

    def inputs(points: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((points - low) / (high - low) - mean) / std).float()

    return Dataset(
        name="two_moons",
        task="classification",
        input_shape=(2,),
        n_outputs=2,
        train_x=inputs(x[:N_TRAIN]),
        train_y=torch.from_numpy(y[:N_TRAIN]).long(),
        test_x=inputs(x[N_TRAIN:]),
        test_y=torch.from_numpy(y[N_TRAIN:]).long(),
        ood={name: inputs(_far_ring(N_TEST)) for name in ood_names},  # far_ring, the only OOD set
        pixel_mean=tuple(float(m) for m in mean),
        pixel_std=tuple(float(s) for s in std),
    )


TWO_MOONS = DatasetSpec(
    name="two_moons",
    task="classification",
    description="scikit-learn's make_moons (generated): 1,000 train / 500 test points in the plane",
    load=load_two_moons,
    ood_sets=("far_ring",),
    options=OPTIONS,
)
