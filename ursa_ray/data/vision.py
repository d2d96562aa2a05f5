"""URSABench's image benchmarks, read through torchvision's dataset classes from the data root.

In-domain sets and the OOD sets paired with them:

- ``mnist``, ``fashion_mnist``, ``kmnist`` (1 × 28 × 28, 60,000 train / 10,000 test): each takes the
  other two as OOD sets (their test splits); ``mnist`` → FashionMNIST and KMNIST is URSABench's pairing.
  Pixels in [0, 1] normalised with mean 0.1307, std 0.3081 (the MNIST values, used for the whole
  family, as URSABench did); no augmentation.
- ``cifar10``, ``cifar100`` (3 × 32 × 32, 50,000 / 10,000): OOD ``svhn`` (the first 10,000 images of
  the SVHN test split) and ``stl10`` (the 8,000 STL10 test images resized 96 → 32 by antialiased
  bilinear interpolation, all classes kept; OOD sets carry no labels).  Every CIFAR and OOD image is
  normalised with URSABench's per-channel CIFAR constants, mean (0.4914, 0.4822, 0.4465) and std
  (0.2023, 0.1994, 0.2010), for CIFAR100 too (URSABench used the same transform for both).  Training
  mini-batches get a random 32 × 32 crop of the image padded by 4 pixels of black, and a horizontal flip
  with probability 1/2 (:class:`RandomCropFlip`, applied to a batch on the trial's device).

Decision-task variants (Cobb et al. 2018 as URSABench sets them; the first ⌈fraction·n⌉ training
examples of each important class are kept, the test set stays balanced; cost 0.1 off the diagonal and
the given cost in the important rows):

- ``mnist_imbalanced``: digits 3 and 7 at 1%, cost 100;
- ``cifar10_imbalanced``: airplane, automobile, ship, truck (0, 1, 8, 9) at 10%, cost 1.0;
- ``cifar100_imbalanced``: pickup_truck, rocket, tank (58, 69, 85), URSABench's choice, at 10%, cost 1.0.

The balanced ``mnist``, ``cifar10`` and ``cifar100`` carry the same cost matrix as their imbalanced
variants (as ``digits`` does), so the decision cost is reported for them too.

Files live under the data root where torchvision puts them: ``MNIST/raw``, ``FashionMNIST/raw``,
``KMNIST/raw`` (the unpacked IDX files), ``cifar-10-batches-py``, ``cifar-100-python``,
``test_32x32.mat`` (SVHN) and ``stl10_binary`` (only ``test_X.bin`` and ``test_y.bin`` are needed).
``download: true`` lets torchvision fetch what is missing.  torchvision verifies the MD5 checksums of
the CIFAR, SVHN and STL10 files; setting the environment variable ``URSA_SKIP_CHECKSUMS=1`` makes it
accept any file that is present (for the small generated files of the tests).  Whole sets are converted
to float tensors once per load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data._decision import cost_matrix, imbalance
from ursa_ray.data.base import AttackBudget, Dataset, DatasetMissing, DatasetSpec

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
CROP_PADDING = 4
SVHN_TEST_SIZE = 10_000
IMAGE_SIZE = 32
SKIP_CHECKSUMS_ENV = "URSA_SKIP_CHECKSUMS"


def skip_checksums() -> bool:
    return os.environ.get(SKIP_CHECKSUMS_ENV, "").strip().lower() in ("1", "true", "yes")


# --------------------------------------------------------------------------------------------------
# Raw sources: which torchvision class reads them and where its files are.


@dataclass(frozen=True)
class _Source:
    name: str
    torchvision_class: str
    kind: str  # "mnist" | "cifar" | "svhn" | "stl10"


_SOURCES = {
    s.name: s
    for s in (
        _Source("mnist", "MNIST", "mnist"),
        _Source("fashion_mnist", "FashionMNIST", "mnist"),
        _Source("kmnist", "KMNIST", "mnist"),
        _Source("cifar10", "CIFAR10", "cifar"),
        _Source("cifar100", "CIFAR100", "cifar"),
        _Source("svhn", "SVHN", "svhn"),
        _Source("stl10", "STL10", "stl10"),
    )
}

_classes: dict[tuple[str, bool], type] = {}

MNIST_ATTACK_BUDGET = AttackBudget(epsilons=(0.05, 0.1, 0.2, 0.3), reference=0.1)
"""The standard MNIST range (Madry et al. 2018 train and test at 0.3); the robustness composite at 0.1."""
CIFAR_ATTACK_BUDGET = AttackBudget(epsilons=(2 / 255, 4 / 255, 8 / 255, 16 / 255), reference=8 / 255)
"""The standard CIFAR range in 8-bit pixel levels; the robustness composite at Madry et al.'s budget 8/255."""
ATTACK_BUDGETS = {"mnist": MNIST_ATTACK_BUDGET, "cifar": CIFAR_ATTACK_BUDGET}
"""By source kind: the MNIST-like and CIFAR sets' ε."""


def _torchvision_class(source: _Source) -> type:
    """torchvision's class for ``source``, or a subclass that changes only which files it verifies.

    STL10: only the test files are required and verified (torchvision's own check also wants the
    2.6 GB unlabeled and the training files, which the test split does not read).  With
    ``URSA_SKIP_CHECKSUMS`` set the MD5 sums in the file lists are dropped, so that torchvision's
    integrity check tests only that each file exists.  Reading is always torchvision's code.
    """
    skip = skip_checksums()
    key = (source.torchvision_class, skip)
    if key in _classes:
        return _classes[key]
    import torchvision.datasets as tvd

    base = getattr(tvd, source.torchvision_class)
    attrs: dict[str, Any] = {}
    if skip and source.kind == "cifar":
        attrs["train_list"] = [[f, None] for f, _ in base.train_list]
        attrs["test_list"] = [[f, None] for f, _ in base.test_list]
        attrs["meta"] = {**base.meta, "md5": None}
    if skip and source.kind == "svhn":
        attrs["split_list"] = {k: [url, f, None] for k, (url, f, _) in base.split_list.items()}
    if source.kind == "stl10":
        if skip:
            attrs["test_list"] = [[f, None] for f, _ in base.test_list]

        def _check_integrity(self) -> bool:
            from torchvision.datasets.utils import check_integrity

            files = self.test_list if self.split == "test" else self.train_list + self.test_list
            return all(check_integrity(os.path.join(self.root, self.base_folder, f), md5) for f, md5 in files)

        attrs["_check_integrity"] = _check_integrity
    cls = type(base.__name__, (base,), {**attrs, "__module__": __name__}) if attrs else base
    _classes[key] = cls
    return cls


def _expected_files(source: _Source, root: Path) -> list[tuple[Path, str | None]]:
    """The files torchvision reads for ``source`` (both splits; the test split only for SVHN and STL10),
    with the MD5 sum it verifies (None where it verifies none)."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, source.torchvision_class)
    if source.kind == "mnist":
        processed = root / source.torchvision_class / "processed"
        legacy = [processed / cls.training_file, processed / cls.test_file]
        if all(p.is_file() for p in legacy):  # torchvision still reads its old processed .pt files
            return [(p, None) for p in legacy]
        raw = root / source.torchvision_class / "raw"
        return [(raw / os.path.splitext(os.path.basename(url))[0], None) for url, _ in cls.resources]
    if source.kind == "cifar":
        folder = root / cls.base_folder
        files = [(folder / f, md5) for f, md5 in cls.train_list + cls.test_list]
        return files + [(folder / cls.meta["filename"], cls.meta["md5"])]
    if source.kind == "svhn":
        _, filename, md5 = cls.split_list["test"]
        return [(root / filename, md5)]
    return [(root / cls.base_folder / f, md5) for f, md5 in cls.test_list]


def _how_to_get(source: _Source, root: Path) -> str:
    return (
        f"set download: true in the grid on a machine with internet, or place torchvision's "
        f"{source.torchvision_class} files under {root} (the data root: URSA_DATA or the grid's data_root)"
    )


def _check_source(source: _Source, root: Path, verify: bool = True) -> None:
    """Raise :class:`DatasetMissing` if a file torchvision needs is absent or (with ``verify``, unless
    ``URSA_SKIP_CHECKSUMS`` is set) fails its MD5 sum."""
    from torchvision.datasets.utils import check_md5  # torchvision only where image data is used

    verify = verify and not skip_checksums()
    for path, md5 in _expected_files(source, root):
        if not path.is_file():
            raise DatasetMissing(f"dataset {source.name!r} not found: no file {path}; {_how_to_get(source, root)}")
        if verify and md5 is not None and not check_md5(path, md5):
            raise DatasetMissing(
                f"dataset {source.name!r}: {path} does not match torchvision's MD5 checksum (corrupt or partial "
                f"download); delete it and {_how_to_get(source, root)} (or set {SKIP_CHECKSUMS_ENV}=1 to accept it)"
            )


def _read(source: _Source, root: Path, train: bool, download: bool) -> tuple[Tensor, Tensor, Any]:
    """One split as (uint8 images N × C × H × W, int64 labels, the torchvision dataset object)."""
    if download:
        root.mkdir(parents=True, exist_ok=True)
    cls = _torchvision_class(source)
    try:
        if source.kind in ("mnist", "cifar"):
            ds = cls(str(root), train=train, download=download)
        else:
            ds = cls(str(root), split="test", download=download)
    except Exception as err:  # torchvision raises RuntimeError, download errors come as URLError etc.
        if not download:
            _check_source(source, root)  # names the file that is missing or fails its checksum
        reason = " ".join(str(err).split())
        raise DatasetMissing(
            f"dataset {source.name!r} could not be read from {root} by torchvision ({reason}); "
            f"{_how_to_get(source, root)}"
        ) from err
    if source.kind == "mnist":
        images, labels = ds.data.unsqueeze(1), ds.targets
    elif source.kind == "cifar":
        images, labels = torch.from_numpy(ds.data).permute(0, 3, 1, 2), torch.as_tensor(ds.targets)
    elif source.kind == "svhn":
        images = torch.from_numpy(np.ascontiguousarray(ds.data[:SVHN_TEST_SIZE]))
        labels = torch.from_numpy(ds.labels[:SVHN_TEST_SIZE])
    else:
        images, labels = torch.from_numpy(np.ascontiguousarray(ds.data)), torch.from_numpy(ds.labels)
    return images, labels.long(), ds


def _normalise(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...], chunk: int = 2048) -> Tensor:
    """uint8 N × C × H × W → float32 ((x / 255 − mean) / std), resized to 32 × 32 if larger (antialiased
    bilinear), in chunks so that a 96 × 96 set is never held as floats at full size."""
    n, c, h, w = images.shape
    size = (IMAGE_SIZE, IMAGE_SIZE) if (c == 3 and (h, w) != (IMAGE_SIZE, IMAGE_SIZE)) else (h, w)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    out = torch.empty((n, c, *size), dtype=torch.float32)
    for start in range(0, n, chunk):
        x = images[start : start + chunk].to(torch.float32).div_(255.0)
        if size != (h, w):
            x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        out[start : start + chunk] = (x - mean_t) / std_t
    return out


# --------------------------------------------------------------------------------------------------
# Training augmentation.


class RandomCropFlip:
    """Random crop of the image padded by ``padding`` pixels of ``fill`` (per channel, the normalised
    value of black), then a horizontal flip with probability 1/2; one draw per image, all vectorised.

    The offsets and flips are drawn from the given generator (on the generator's device), so the same
    generator state gives the same batch.  The batch keeps its shape, dtype, device and memory format.
    Drawn on the CPU for a batch on a GPU, they travel in one copy from pinned memory that does not wait
    for the GPU (a plain copy would synchronise the stream at every training step).
    """

    def __init__(self, fill: tuple[float, ...], padding: int = CROP_PADDING) -> None:
        self.fill = tuple(float(v) for v in fill)
        self.padding = int(padding)

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        b, c, h, w = x.shape
        p = self.padding
        offsets = torch.randint(0, 2 * p + 1, (2, b), generator=generator, device=generator.device)
        flip = torch.rand(b, generator=generator, device=generator.device) < 0.5
        draws = torch.cat([offsets, flip[None]])  # one transfer
        if draws.device.type == "cpu" and x.device.type == "cuda":
            draws = draws.pin_memory().to(x.device, non_blocking=True)
        offsets, flip = draws[:2].to(x.device), draws[2].to(x.device, torch.bool)
        padded = x.new_empty((b, h + 2 * p, w + 2 * p, c))  # channels last, so the gather below is one index
        padded.copy_(torch.tensor(self.fill, dtype=x.dtype, device=x.device).expand_as(padded))
        padded[:, p : p + h, p : p + w, :] = x.permute(0, 2, 3, 1)
        rows = offsets[0, :, None] + torch.arange(h, device=x.device)
        columns = torch.arange(w, device=x.device).expand(b, w)
        columns = torch.where(flip[:, None], w - 1 - columns, columns) + offsets[1, :, None]
        batch = torch.arange(b, device=x.device)[:, None, None]
        cropped = padded[batch, rows[:, :, None], columns[:, None, :]]  # b × h × w × c
        out = torch.empty_like(x)
        out.copy_(cropped.permute(0, 3, 1, 2))
        return out

    def __repr__(self) -> str:
        return f"RandomCropFlip(padding={self.padding}, fill={self.fill})"


# --------------------------------------------------------------------------------------------------
# The datasets.


@dataclass(frozen=True)
class _Config:
    name: str
    source: str
    ood_sets: tuple[str, ...]
    description: str
    important: tuple[int, ...] = ()
    important_names: tuple[str, ...] = ()
    important_cost: float = 0.0
    fraction: float | None = None  # None: the balanced training set


def _statistics(source: _Source) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if source.kind == "mnist":
        return (MNIST_MEAN,), (MNIST_STD,)
    return CIFAR_MEAN, CIFAR_STD


def _load(
    config: _Config, options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int
) -> Dataset:
    unknown = [n for n in ood_names if n not in config.ood_sets]
    if unknown:
        raise ValueError(f"dataset {config.name!r} has no OOD set {unknown}; known: {list(config.ood_sets)}")
    root = Path(root)
    source = _SOURCES[config.source]
    mean, std = _statistics(source)
    train_images, train_y, train_set = _read(source, root, True, download)
    test_images, test_y, _ = _read(source, root, False, download)
    if config.important_names:
        names = tuple(train_set.classes[i] for i in config.important)
        if names != config.important_names:
            raise ValueError(f"{config.name}: classes {config.important} are {names}, not {config.important_names}")
    if config.fraction is not None:
        train_images, train_y = imbalance(train_images, train_y, config.important, config.fraction)
    train_x = _normalise(train_images, mean, std)
    del train_images
    ood = {}
    for name in ood_names:
        images, _, _ = _read(_SOURCES[name], root, False, download)
        ood[name] = _normalise(images, mean, std)
    n_classes = len(train_set.classes)
    return Dataset(
        name=config.name,
        task="classification",
        input_shape=tuple(train_x.shape[1:]),
        n_outputs=n_classes,
        train_x=train_x,
        train_y=train_y,
        test_x=_normalise(test_images, mean, std),
        pixel_mean=tuple(mean),
        pixel_std=tuple(std),
        test_y=test_y,
        ood=ood,
        augment=RandomCropFlip(tuple(-m / s for m, s in zip(mean, std))) if source.kind == "cifar" else None,
        cost_matrix=cost_matrix(n_classes, config.important, config.important_cost) if config.important else None,
    )


def _check(config: _Config, root: Path, ood_names: tuple[str, ...]) -> None:
    unknown = [n for n in ood_names if n not in config.ood_sets]
    if unknown:
        raise ValueError(f"dataset {config.name!r} has no OOD set {unknown}; known: {list(config.ood_sets)}")
    for name in (config.source, *ood_names):
        _check_source(_SOURCES[name], Path(root))


MNIST_IMPORTANT, MNIST_FRACTION, MNIST_COST = (3, 7), 0.01, 100.0
CIFAR10_IMPORTANT, CIFAR_FRACTION, CIFAR_COST = (0, 1, 8, 9), 0.1, 1.0
CIFAR10_IMPORTANT_NAMES = ("airplane", "automobile", "ship", "truck")
CIFAR100_IMPORTANT, CIFAR100_IMPORTANT_NAMES = (58, 69, 85), ("pickup_truck", "rocket", "tank")

_MNIST_OOD = ("fashion_mnist", "kmnist")
_CIFAR_OOD = ("svhn", "stl10")
_MNIST_DECISION = dict(important=MNIST_IMPORTANT, important_cost=MNIST_COST)
_CIFAR10_DECISION = dict(
    important=CIFAR10_IMPORTANT, important_names=CIFAR10_IMPORTANT_NAMES, important_cost=CIFAR_COST
)
_CIFAR100_DECISION = dict(
    important=CIFAR100_IMPORTANT, important_names=CIFAR100_IMPORTANT_NAMES, important_cost=CIFAR_COST
)

_CONFIGS = (
    _Config("mnist", "mnist", _MNIST_OOD, "MNIST digits (torchvision), 60,000 train / 10,000 test", **_MNIST_DECISION),
    _Config("fashion_mnist", "fashion_mnist", ("mnist", "kmnist"), "FashionMNIST (torchvision), 60,000 / 10,000"),
    _Config("kmnist", "kmnist", ("mnist", "fashion_mnist"), "Kuzushiji-MNIST (torchvision), 60,000 / 10,000"),
    _Config("cifar10", "cifar10", _CIFAR_OOD, "CIFAR10 (torchvision), 50,000 / 10,000, crop+flip", **_CIFAR10_DECISION),
    _Config(
        "cifar100", "cifar100", _CIFAR_OOD, "CIFAR100 (torchvision), 50,000 / 10,000, crop+flip", **_CIFAR100_DECISION
    ),
    _Config(
        "mnist_imbalanced",
        "mnist",
        _MNIST_OOD,
        "MNIST with digits 3 and 7 kept at 1% of their training examples; cost 100 on them (decision task)",
        fraction=MNIST_FRACTION,
        **_MNIST_DECISION,
    ),
    _Config(
        "cifar10_imbalanced",
        "cifar10",
        _CIFAR_OOD,
        "CIFAR10 with classes 0, 1, 8, 9 kept at 10% of their training examples; cost 1.0 on them (decision task)",
        fraction=CIFAR_FRACTION,
        **_CIFAR10_DECISION,
    ),
    _Config(
        "cifar100_imbalanced",
        "cifar100",
        _CIFAR_OOD,
        "CIFAR100 with pickup_truck, rocket, tank kept at 10% of their training examples; cost 1.0 (decision task)",
        fraction=CIFAR_FRACTION,
        **_CIFAR100_DECISION,
    ),
)

DATASETS = tuple(
    DatasetSpec(
        name=c.name,
        task="classification",
        description=c.description,
        load=partial(_load, c),
        ood_sets=c.ood_sets,
        check=partial(_check, c),
        decision_task=c.fraction is not None,
        attack_budget=ATTACK_BUDGETS[_SOURCES[c.source].kind],
        torchvision=True,
    )
    for c in _CONFIGS
)
