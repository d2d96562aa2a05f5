"""Sequence classification from the embedded digit images, read row by row: ``digits_seq`` (scikit-learn's
8 × 8 digits as 8 steps of 8 features) and ``mnist_5k_seq`` (``mnist_5k``'s 28 × 28 digits as 28 steps of
28, the "sequential MNIST" row-by-row setup).  Same images, splits and normalisation as ``digits`` and
``mnist_5k`` (:mod:`ursa_ray.data.digits`, :mod:`ursa_ray.data.mnist_5k`); inputs have shape (T, F).

OOD sets, no download:

- ``NAME_reversed``: each test digit read bottom row first;
- ``NAME_doubled``: each test digit read with every row twice (2T steps: the same digit, another length;
  recurrent models only);
- ``noise_seq``: uniform [0, 1] pixel noise sequences, one per test digit (seed 0).

``NAME_imbalanced`` are the decision-task copies (digits 3 and 7 kept at 10%, cost 100 for errors on them).
These datasets have no pixels for the image attacks and corruptions (``pixel_mean`` is None), so a trial
skips them.

Sequences of varying length are padded with NaN steps (:func:`pad_sequences`), which the recurrent models
skip (:mod:`ursa_ray.models.rnn`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data import digits, mnist_5k
from ursa_ray.data._decision import cost_matrix, imbalance
from ursa_ray.data._embedded import IMBALANCE_FRACTION, IMPORTANT, IMPORTANT_COST, uniform_noise
from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.data.vision import MNIST_MEAN, MNIST_STD

SOURCES = ("digits_seq", "mnist_5k_seq")


def ood_set_names(name: str) -> tuple[str, ...]:
    return (f"{name}_reversed", f"{name}_doubled", "noise_seq")


def pad_sequences(sequences: list[np.ndarray], length: int | None = None) -> np.ndarray:
    """(N, T, F) float32 from N arrays of shape (T_i, F): each padded with NaN steps to T = ``length`` or the
    longest T_i.  A NaN step is padding to a recurrent model (its state is carried over it)."""
    t = length or max(len(s) for s in sequences)
    out = np.full((len(sequences), t, sequences[0].shape[1]), np.nan, dtype=np.float32)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return out


def _ood(name: str, ood_name: str, test_images: np.ndarray) -> np.ndarray:
    if ood_name == f"{name}_reversed":
        return test_images[:, ::-1].copy()
    if ood_name == f"{name}_doubled":
        return np.repeat(test_images, 2, axis=1)
    if ood_name == "noise_seq":
        return uniform_noise(test_images)
    raise ValueError(f"{name} has no OOD set {ood_name!r}; known: {list(ood_set_names(name))}")


def load_sequence_digits(
    name: str,
    options: Mapping[str, Any],
    ood_names: tuple[str, ...],
    root: Path,
    download: bool,
    seed: int,
    *,
    imbalanced: bool = False,
) -> Dataset:
    """The images of ``name``'s source (rows as time steps), normalised as the source normalises them."""
    if name == "digits_seq":
        x_train, x_test, y_train, y_test = digits._split()
        mean, std = float(x_train.mean()), float(x_train.std())
    else:
        x_train, x_test, y_train, y_test = mnist_5k.split()
        mean, std = MNIST_MEAN, MNIST_STD

    def sequences(a: np.ndarray) -> Tensor:
        return torch.from_numpy(((np.ascontiguousarray(a) - mean) / std).astype(np.float32))

    train_x, train_y = sequences(x_train), torch.from_numpy(y_train).long()
    if imbalanced:
        train_x, train_y = imbalance(train_x, train_y, IMPORTANT, IMBALANCE_FRACTION)
    return Dataset(
        name=f"{name}_imbalanced" if imbalanced else name,
        task="classification",
        input_shape=tuple(x_train.shape[1:]),
        n_outputs=10,
        train_x=train_x,
        train_y=train_y,
        test_x=sequences(x_test),
        test_y=torch.from_numpy(y_test).long(),
        ood={o: sequences(_ood(name, o, x_test)) for o in ood_names},
        cost_matrix=cost_matrix(10, IMPORTANT, IMPORTANT_COST),
    )


DATASETS = tuple(
    DatasetSpec(
        name=f"{name}_imbalanced" if imbalanced else name,
        task="classification",
        description=(
            f"{name}: {'8x8 digits as 8 steps of 8' if name == 'digits_seq' else 'mnist_5k as 28 steps of 28'}"
            + (" with digits 3 and 7 kept at 10% (decision task)" if imbalanced else " (embedded, no download)")
        ),
        load=partial(load_sequence_digits, name, imbalanced=imbalanced),
        ood_sets=ood_set_names(name),
        decision_task=imbalanced,
        images=False,
    )
    for name in SOURCES
    for imbalanced in (False, True)
)
