"""Writers for the on-disk formats torchvision reads, for tests: small files laid out exactly as the real
downloads are, so that tests load them through the same code as real data.

Each writer takes the arrays to store (uint8 images in N × C × H × W order, integer labels in the
dataset's own convention, e.g. SVHN's 10 for the digit 0, STL10's 1–10) and writes them where
torchvision's class looks for them under ``root``.  The files cannot match torchvision's published MD5
checksums; load them with ``URSA_SKIP_CHECKSUMS=1`` (see :mod:`ursa_ray.data.vision`).
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

MNIST_FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes: magic 0x0000 08 <ndim>, big-endian int32 sizes, then the data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def write_mnist_family(
    root: Path,
    name: str,
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
) -> Path:
    """``root/<MNIST|FashionMNIST|KMNIST>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (images N × 28 × 28)."""
    raw = Path(root) / MNIST_FOLDERS[name] / "raw"
    for prefix, images, labels in (("train", train_images, train_labels), ("t10k", test_images, test_labels)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return raw


def _pickle(path: Path, entry: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)


def _rows(images: np.ndarray) -> np.ndarray:
    """N × 3 × 32 × 32 → N × 3072 rows: the red plane, then green, then blue, each row-major."""
    return np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), -1)


def write_cifar10(
    root: Path, train_images: np.ndarray, train_labels: np.ndarray, test_images: np.ndarray, test_labels: np.ndarray
) -> Path:
    """``root/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}``; training data split in 5."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for i, index in enumerate(np.array_split(np.arange(len(train_images)), 5), start=1):
        _pickle(
            folder / f"data_batch_{i}",
            {
                "batch_label": f"training batch {i} of 5",
                "labels": [int(v) for v in train_labels[index]],
                "data": _rows(train_images[index]),
                "filenames": [f"train_{j}.png" for j in index],
            },
        )
    _pickle(
        folder / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": [int(v) for v in test_labels],
            "data": _rows(test_images),
            "filenames": [f"test_{j}.png" for j in range(len(test_images))],
        },
    )
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _pickle(folder / "batches.meta", {"num_cases_per_batch": 10000, "label_names": names, "num_vis": 3072})
    return folder


CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()


def write_cifar100(
    root: Path, train_images: np.ndarray, train_labels: np.ndarray, test_images: np.ndarray, test_labels: np.ndarray
) -> Path:
    """``root/cifar-100-python/{train, test, meta}`` with fine labels (coarse labels written as 0)."""
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for split, images, labels in (("train", train_images, train_labels), ("test", test_images, test_labels)):
        _pickle(
            folder / split,
            {
                "filenames": [f"{split}_{j}.png" for j in range(len(images))],
                "batch_label": f"{split} batch",
                "fine_labels": [int(v) for v in labels],
                "coarse_labels": [0] * len(labels),
                "data": _rows(images),
            },
        )
    _pickle(folder / "meta", {"fine_label_names": list(CIFAR100_CLASSES), "coarse_label_names": ["superclass"] * 20})
    return folder


def write_svhn_test(root: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """``root/test_32x32.mat``: X of shape 32 × 32 × 3 × N (uint8), y of shape N × 1 (10 for the digit 0)."""
    from scipy.io import savemat

    path = Path(root) / "test_32x32.mat"
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.ascontiguousarray(np.transpose(np.asarray(images, dtype=np.uint8), (2, 3, 1, 0)))
    savemat(path, {"X": x, "y": np.asarray(labels, dtype=np.uint8).reshape(-1, 1)})
    return path


def write_stl10_test(root: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """``root/stl10_binary/test_X.bin`` (N × 3 × 96 × 96 bytes, each channel column-major) and ``test_y.bin``
    (one byte per image, classes 1–10)."""
    folder = Path(root) / "stl10_binary"
    folder.mkdir(parents=True, exist_ok=True)
    images = np.asarray(images, dtype=np.uint8)
    (folder / "test_X.bin").write_bytes(np.ascontiguousarray(np.transpose(images, (0, 1, 3, 2))).tobytes())
    (folder / "test_y.bin").write_bytes(np.asarray(labels, dtype=np.uint8).tobytes())
    return folder
