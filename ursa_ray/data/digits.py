"""The embedded default: scikit-learn's digits (1,797 real 8×8 handwritten digits shipped with it).

Split: a fixed stratified 80/20 train/test split (seed 0, the same for every trial; the search phase
carves its validation set out of the training part).  Pixels 0–16 are scaled to [0, 1] and standardised
with the training mean and std.  OOD sets need no download and are built from the test images:

- ``digits_inverted``: 1 − pixel (white digits become black on white);
- ``digits_rotated``: each test image rotated by 90°;
- ``noise``: uniform [0, 1] pixel noise, one image per test image.

``digits_imbalanced`` is the decision task: digits 3 and 7 kept at 10% of their training examples
(≈14 each; 1% as for MNIST would leave one), cost 100 for errors on them, 0.1 otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ursa_ray.data._embedded import digit_images_dataset, rotated, uniform_noise
from ursa_ray.data.base import AttackBudget, Dataset, DatasetSpec

OOD_SETS = ("digits_inverted", "digits_rotated", "noise")
# scikit-learn's digits count the set pixels of 4×4 blocks of a 32×32 bitmap: 17 levels, one level 1/16 of the
# [0, 1] range.  ε = ½, 1, 2 and 4 levels, up to a quarter of the range (near MNIST's 0.2–0.3).  Over it PGD
# takes the quickstart's SGD MLP 64-200-200-10 from 0.97 clean accuracy to 0.92, 0.80, 0.28 and 0.00: the
# whole curve, as the MNIST and CIFAR ranges give for undefended networks (docs/adversarial.md).  The
# robustness composite at one pixel level.
ATTACK_BUDGET = AttackBudget(epsilons=(1 / 32, 1 / 16, 1 / 8, 1 / 4), reference=1 / 16)


@cache
def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    return tuple(train_test_split(images, digits.target, test_size=0.2, stratify=digits.target, random_state=0))


def _ood(name: str, test_images: np.ndarray) -> np.ndarray:
    if name == "digits_inverted":
        return 1.0 - test_images
    if name == "digits_rotated":
        return rotated(test_images)
    if name == "noise":
        return uniform_noise(test_images)
    raise KeyError(name)


def load_digits_dataset(
    options: Mapping[str, Any],
    ood_names: tuple[str, ...],
    root: Path,
    download: bool,
    seed: int,
    *,
    imbalanced: bool = False,
) -> Dataset:
    split = _split()
    x_train, x_test = split[0], split[1]
    mean, std = float(x_train.mean()), float(x_train.std())
    ood = {name: _ood(name, x_test) for name in ood_names}
    return digit_images_dataset("digits", split, mean, std, ood, imbalanced)


def _load_imbalanced(
    options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int
) -> Dataset:
    return load_digits_dataset(options, ood_names, root, download, seed, imbalanced=True)


DATASETS = (
    DatasetSpec(
        name="digits",
        task="classification",
        description="scikit-learn's 8x8 digits (embedded, no download); 1,437 train / 360 test",
        load=load_digits_dataset,
        ood_sets=OOD_SETS,
        attack_budget=ATTACK_BUDGET,
    ),
    DatasetSpec(
        name="digits_imbalanced",
        task="classification",
        description="digits with classes 3 and 7 kept at 10% of their training examples (decision task)",
        load=_load_imbalanced,
        ood_sets=OOD_SETS,
        decision_task=True,
        attack_budget=ATTACK_BUDGET,
    ),
)
