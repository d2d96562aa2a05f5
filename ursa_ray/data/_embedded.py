"""The shape both embedded datasets share (scikit-learn's digits, ``mnist_5k``): ten classes of grayscale
digit images in [0, 1], a fixed train/test split, OOD sets built from arrays, and URSABench's decision task
on an imbalanced copy (digits 3 and 7 kept at 10% of their training examples, cost 100 for errors on them
and 0.1 otherwise; the balanced set carries the same cost matrix)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data._decision import cost_matrix, imbalance
from ursa_ray.data.base import Dataset, standardise

IMPORTANT = (3, 7)
IMBALANCE_FRACTION = 0.1
IMPORTANT_COST = 100.0


def rotated(images: np.ndarray) -> np.ndarray:
    """Each N × H × W image turned by 90°."""
    return np.rot90(images, k=1, axes=(1, 2)).copy()


def uniform_noise(like: np.ndarray) -> np.ndarray:
    """Uniform [0, 1] pixel noise, one image per image of ``like`` (seed 0: the same for every trial)."""
    return np.random.default_rng(0).uniform(0.0, 1.0, size=like.shape).astype(np.float32)


def digit_images_dataset(
    name: str,
    split: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    mean: float,
    std: float,
    ood: Mapping[str, np.ndarray],
    imbalanced: bool,
) -> Dataset:
    """The :class:`Dataset` of ``split`` = (x_train, x_test, y_train, y_test), N × H × W pixels in [0, 1],
    standardised with ``mean`` and ``std`` as are the ``ood`` images; ``imbalanced``: the decision-task copy
    (named ``NAME_imbalanced``)."""
    x_train, x_test, y_train, y_test = split

    def images(a: np.ndarray) -> Tensor:
        return standardise(torch.from_numpy(np.ascontiguousarray(a)).unsqueeze(1), mean, std)

    train_x, train_y = images(x_train), torch.from_numpy(y_train).long()
    if imbalanced:
        train_x, train_y = imbalance(train_x, train_y, IMPORTANT, IMBALANCE_FRACTION)
    return Dataset(
        name=f"{name}_imbalanced" if imbalanced else name,
        task="classification",
        input_shape=(1, *x_train.shape[1:]),
        n_outputs=10,
        train_x=train_x,
        train_y=train_y,
        test_x=images(x_test),
        test_y=torch.from_numpy(y_test).long(),
        ood={ood_name: images(pixels) for ood_name, pixels in ood.items()},
        cost_matrix=cost_matrix(10, IMPORTANT, IMPORTANT_COST),
        pixel_mean=(mean,),
        pixel_std=(std,),
    )
