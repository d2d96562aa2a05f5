"""The torchvision-backed datasets, loaded from small files written in each dataset's real on-disk format
(IDX, CIFAR pickles, SVHN .mat, STL10 binaries) through the same DatasetSpec.load as real data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ursa_ray.data import get_dataset, registry, vision
from ursa_ray.data._vision_files import (
    write_cifar10,
    write_cifar100,
    write_mnist_family,
    write_stl10_test,
    write_svhn_test,
)
from ursa_ray.data.base import DatasetMissing

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(1, 3, 1, 1)
CIFAR_STD = np.array([0.2023, 0.1994, 0.2010], dtype=np.float32).reshape(1, 3, 1, 1)
N_PER_CLASS = 20  # MNIST family and CIFAR10 training sets
N_SVHN, N_STL = 7, 4


def _labels(n_classes: int, per_class: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(n_classes), per_class)).astype(np.uint8)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Every dataset under one data root; returns the arrays written, keyed by dataset."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    written: dict = {"root": root}
    for i, name in enumerate(("mnist", "fashion_mnist", "kmnist")):
        train_y, test_y = _labels(10, N_PER_CLASS, rng), _labels(10, 1, rng)
        train_x = rng.integers(0, 256, (len(train_y), 28, 28), dtype=np.uint8)
        test_x = rng.integers(0, 256, (len(test_y), 28, 28), dtype=np.uint8)
        test_x[0] = 255  # a constant white image: normalises to (1 - 0.1307) / 0.3081
        test_x[1] = 0
        test_x[2] = 40 * i  # tells the three sets apart
        write_mnist_family(root, name, train_x, train_y, test_x, test_y)
        written[name] = (train_x, train_y, test_x, test_y)
    cifars = (("cifar10", write_cifar10, 10, N_PER_CLASS), ("cifar100", write_cifar100, 100, 2))
    for name, writer, n_classes, per_class in cifars:
        train_y, test_y = _labels(n_classes, per_class, rng), _labels(n_classes, 1, rng)
        train_x = rng.integers(0, 256, (len(train_y), 3, 32, 32), dtype=np.uint8)
        test_x = rng.integers(0, 256, (len(test_y), 3, 32, 32), dtype=np.uint8)
        test_x[0] = np.array([10, 128, 250], dtype=np.uint8).reshape(3, 1, 1)  # one value per channel
        writer(root, train_x, train_y, test_x, test_y)
        written[name] = (train_x, train_y, test_x, test_y)
    svhn_x = rng.integers(0, 256, (N_SVHN, 3, 32, 32), dtype=np.uint8)
    svhn_y = rng.integers(1, 11, N_SVHN)
    write_svhn_test(root, svhn_x, svhn_y)
    written["svhn"] = svhn_x
    stl_x = rng.integers(0, 256, (N_STL, 3, 96, 96), dtype=np.uint8)
    stl_x[0] = 0
    stl_x[0, :, :48, :] = np.array([255, 100, 30], dtype=np.uint8).reshape(3, 1, 1)  # top half lit, per channel
    write_stl10_test(root, stl_x, rng.integers(1, 11, N_STL))
    written["stl10"] = stl_x
    return written


@pytest.fixture(autouse=True)
def skip_checksums(monkeypatch):
    monkeypatch.setenv("URSA_SKIP_CHECKSUMS", "1")


def load(name: str, root: Path, ood: tuple[str, ...] = ()):
    spec = get_dataset(name)
    spec.check(root, ood)
    return spec.load({}, ood, root, False, 0)


def mnist_normalised(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD)[:, None]


def cifar_normalised(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) / 255.0 - CIFAR_MEAN) / CIFAR_STD


def test_registry_lists_the_vision_datasets():
    names = set(registry())
    expected = {
        "mnist",
        "fashion_mnist",
        "kmnist",
        "cifar10",
        "cifar100",
        "mnist_imbalanced",
        "cifar10_imbalanced",
        "cifar100_imbalanced",
    }
    assert expected <= names
    assert set(get_dataset("mnist").ood_sets) == {"fashion_mnist", "kmnist"}
    assert set(get_dataset("cifar100_imbalanced").ood_sets) == {"svhn", "stl10"}
    assert all(get_dataset(n).check is not None and get_dataset(n).task == "classification" for n in expected)


def test_mnist_shapes_values_labels_and_ood(files):
    data = load("mnist", files["root"], ("fashion_mnist", "kmnist"))
    train_x, train_y, test_x, test_y = files["mnist"]
    assert data.input_shape == (1, 28, 28) and data.n_outputs == 10 and data.task == "classification"
    assert data.train_x.dtype == torch.float32 and data.train_x.shape == (200, 1, 28, 28)
    assert data.train_y.dtype == torch.int64 and data.train_y.tolist() == train_y.tolist()
    assert data.test_y.tolist() == test_y.tolist()
    np.testing.assert_allclose(data.train_x.numpy(), mnist_normalised(train_x), atol=1e-5)
    assert torch.allclose(data.test_x[0], torch.tensor(2.82149), atol=1e-4)  # (1 - 0.1307) / 0.3081
    assert torch.allclose(data.test_x[1], torch.tensor(-0.42421), atol=1e-4)  # -0.1307 / 0.3081
    assert data.augment is None
    assert set(data.ood) == {"fashion_mnist", "kmnist"}
    for name, level in (("fashion_mnist", 40), ("kmnist", 80)):
        ood = data.ood[name]
        assert ood.shape == (10, 1, 28, 28) and ood.dtype == torch.float32
        np.testing.assert_allclose(ood.numpy(), mnist_normalised(files[name][2]), atol=1e-5)  # the test split
        assert torch.allclose(ood[2], torch.tensor((level / 255 - MNIST_MEAN) / MNIST_STD))


def test_kmnist_in_domain(files):
    data = load("kmnist", files["root"], ("mnist",))
    np.testing.assert_allclose(data.train_x.numpy(), mnist_normalised(files["kmnist"][0]), atol=1e-5)
    np.testing.assert_allclose(data.ood["mnist"].numpy(), mnist_normalised(files["mnist"][2]), atol=1e-5)
    assert data.cost_matrix is None


def test_cifar10_with_svhn_and_stl10(files, monkeypatch):
    monkeypatch.setattr(vision, "SVHN_TEST_SIZE", 5)  # URSABench keeps the first 10,000; 5 of our 7 here
    data = load("cifar10", files["root"], ("svhn", "stl10"))
    train_x, train_y, test_x, test_y = files["cifar10"]
    assert data.input_shape == (3, 32, 32) and data.n_outputs == 10
    assert data.train_x.shape == (200, 3, 32, 32) and data.train_x.dtype == torch.float32
    assert data.train_y.tolist() == train_y.tolist()  # the five batches, in order
    assert data.test_y.tolist() == test_y.tolist()
    np.testing.assert_allclose(data.train_x.numpy(), cifar_normalised(train_x), atol=1e-5)
    np.testing.assert_allclose(data.test_x.numpy(), cifar_normalised(test_x), atol=1e-5)
    # pixel values 10, 128, 250 in the R, G, B planes, by hand: (v/255 - mean_c) / std_c
    for channel, value in enumerate((-2.23522, 0.09910, 2.65618)):
        assert torch.allclose(data.test_x[0, channel], torch.tensor(value), atol=1e-4)
    # SVHN: the first images of the test split, normalised with the CIFAR statistics
    assert data.ood["svhn"].shape == (5, 3, 32, 32)
    np.testing.assert_allclose(data.ood["svhn"].numpy(), cifar_normalised(files["svhn"][:5]), atol=1e-5)
    # STL10: 96 -> 32, CIFAR statistics, orientation kept (the lit top half stays on top)
    stl = data.ood["stl10"]
    assert stl.shape == (N_STL, 3, 32, 32) and stl.dtype == torch.float32
    lit = (np.array([255, 100, 30], dtype=np.float32).reshape(3, 1, 1) / 255 - CIFAR_MEAN[0]) / CIFAR_STD[0]
    dark = -CIFAR_MEAN[0] / CIFAR_STD[0]
    np.testing.assert_allclose(stl[0, :, :15].numpy(), np.broadcast_to(lit, (3, 15, 32)), atol=1e-4)
    np.testing.assert_allclose(stl[0, :, 17:].numpy(), np.broadcast_to(dark, (3, 15, 32)), atol=1e-4)
    # the resize agrees with PIL's bilinear Resize(32) that URSABench applied, within one grey level
    from PIL import Image

    for i in range(1, N_STL):
        hwc = np.transpose(files["stl10"][i], (1, 2, 0))
        pil = np.asarray(Image.fromarray(hwc).resize((32, 32), Image.BILINEAR)).transpose(2, 0, 1)[None]
        np.testing.assert_allclose(stl[i : i + 1].numpy(), cifar_normalised(pil), atol=1.01 / 255 / 0.1994)


def test_cifar100_labels_and_important_classes(files):
    data = load("cifar100", files["root"])
    assert data.n_outputs == 100 and data.train_y.tolist() == files["cifar100"][1].tolist()
    costs = data.cost_matrix
    assert costs.shape == (100, 100)
    for c in (58, 69, 85):  # pickup_truck, rocket, tank
        assert costs[c].sum() == pytest.approx(99 * 1.0)
    assert costs[0, 1] == pytest.approx(0.1) and costs.diagonal().abs().sum() == 0


def _expected_cost(n: int, important: tuple[int, ...], cost: float) -> torch.Tensor:
    expected = torch.full((n, n), 0.1)
    expected[list(important)] = cost
    expected.fill_diagonal_(0.0)
    return expected


@pytest.mark.parametrize(
    "name, n_classes, per_class, important, kept, cost",
    [
        ("mnist_imbalanced", 10, N_PER_CLASS, (3, 7), 1, 100.0),  # ceil(1% of 20)
        ("cifar10_imbalanced", 10, N_PER_CLASS, (0, 1, 8, 9), 2, 1.0),  # 10% of 20
        ("cifar100_imbalanced", 100, 2, (58, 69, 85), 1, 1.0),  # ceil(10% of 2)
    ],
)
def test_imbalanced_variants(files, name, n_classes, per_class, important, kept, cost):
    data = load(name, files["root"])
    source = name.removesuffix("_imbalanced")
    train_x, train_y, _, test_y = files[source]
    counts = torch.bincount(data.train_y, minlength=n_classes)
    for c in range(n_classes):
        assert counts[c] == (kept if c in important else per_class)
    assert len(data.train_x) == len(data.train_y) == n_classes * per_class - len(important) * (per_class - kept)
    # the first examples of each important class are the ones kept, with their images
    keep = np.ones(len(train_y), dtype=bool)
    for c in important:
        keep[np.flatnonzero(train_y == c)[kept:]] = False
    assert data.train_y.tolist() == train_y[keep].tolist()
    normalised = mnist_normalised if source == "mnist" else cifar_normalised
    np.testing.assert_allclose(data.train_x.numpy(), normalised(train_x[keep]), atol=1e-5)
    assert data.test_y.tolist() == test_y.tolist()  # the test set stays balanced
    assert torch.equal(data.cost_matrix, _expected_cost(n_classes, important, cost))
    assert (data.augment is None) == (source == "mnist")


def test_balanced_sets_carry_the_same_cost_matrix(files):
    assert torch.equal(load("mnist", files["root"]).cost_matrix, _expected_cost(10, (3, 7), 100.0))


# ---------------------------------------------------------------------------------------------- missing


def test_missing_dataset_is_one_line_naming_dataset_and_path(tmp_path):
    with pytest.raises(DatasetMissing) as error:
        get_dataset("cifar10").check(tmp_path, ())
    message = str(error.value)
    assert "\n" not in message and "'cifar10'" in message
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in message
    assert "download: true" in message and str(tmp_path) in message
    with pytest.raises(DatasetMissing, match="'mnist'.*MNIST/raw/train-images-idx3-ubyte"):
        get_dataset("mnist_imbalanced").load({}, (), tmp_path, False, 0)


def test_missing_ood_set_is_named(files, tmp_path):
    write_cifar10(tmp_path, *files["cifar10"])
    get_dataset("cifar10").check(tmp_path, ())  # the in-domain set alone is complete
    with pytest.raises(DatasetMissing, match=r"'svhn'.*test_32x32\.mat"):
        get_dataset("cifar10").check(tmp_path, ("svhn",))
    with pytest.raises(DatasetMissing, match=r"'stl10'.*stl10_binary.test_X\.bin"):
        get_dataset("cifar10").load({}, ("stl10",), tmp_path, False, 0)
    with pytest.raises(ValueError, match="no OOD set"):
        get_dataset("cifar10").check(tmp_path, ("kmnist",))


def test_download_flag_fetches_nothing_when_files_are_present(files):
    data = get_dataset("cifar10").load({}, ("svhn", "stl10"), files["root"], True, 0)  # no network here
    assert data.train_x.shape == (200, 3, 32, 32) and set(data.ood) == {"svhn", "stl10"}
    assert load("fashion_mnist", files["root"]).train_x.shape == (200, 1, 28, 28)


def test_dataset_and_spec_pickle(files):
    import pickle

    data = pickle.loads(pickle.dumps(load("cifar10_imbalanced", files["root"])))
    assert isinstance(data.augment, vision.RandomCropFlip)
    spec = pickle.loads(pickle.dumps(get_dataset("cifar10_imbalanced")))
    assert spec.load({}, (), files["root"], False, 0).train_y.tolist() == data.train_y.tolist()


def test_checksums_are_verified_unless_skipped(files, monkeypatch):
    monkeypatch.delenv("URSA_SKIP_CHECKSUMS")
    root = files["root"]
    with pytest.raises(DatasetMissing, match="'cifar10'.*data_batch_1 does not match torchvision's MD5"):
        get_dataset("cifar10").check(root, ())
    with pytest.raises(DatasetMissing, match="'cifar100'.*MD5"):  # torchvision's own check, through load
        get_dataset("cifar100").load({}, (), root, False, 0)
    get_dataset("mnist").check(root, ("kmnist",))  # torchvision keeps no checksums of the unpacked MNIST files


# ---------------------------------------------------------------------------------------------- augmentation


def _augment() -> vision.RandomCropFlip:
    return vision.RandomCropFlip(tuple((-CIFAR_MEAN / CIFAR_STD).flatten().tolist()))


def test_augmentation_is_a_seeded_crop_and_flip():
    x = torch.randn(64, 3, 32, 32)
    augment = _augment()
    out = augment(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out, augment(x, torch.Generator().manual_seed(1)))
    assert not torch.equal(out, augment(x, torch.Generator().manual_seed(2)))
    assert not torch.equal(out, x)
    # each output is a 32 x 32 window of the image padded with black, possibly mirrored
    fill = torch.tensor(augment.fill).view(3, 1, 1)
    padded = fill.expand(64, 3, 40, 40).clone()
    padded[:, :, 4:36, 4:36] = x
    shifts, flips = set(), set()
    for i in range(64):
        found = [
            (dy, dx, flip)
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
            if torch.equal(out[i], (lambda w: w.flip(-1) if flip else w)(padded[i, :, dy : dy + 32, dx : dx + 32]))
        ]
        assert len(found) == 1, i
        shifts.add(found[0][:2])
        flips.add(found[0][2])
    assert flips == {False, True} and len(shifts) > 20


def test_augmentation_keeps_memory_format():
    x = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    out = _augment()(x, torch.Generator().manual_seed(0))
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_cifar_augment_pads_with_normalised_black(files):
    data = load("cifar10", files["root"])
    assert isinstance(data.augment, vision.RandomCropFlip)
    np.testing.assert_allclose(data.augment.fill, (-CIFAR_MEAN / CIFAR_STD).flatten(), rtol=1e-6)
    assert math.isclose(data.augment.fill[0], -0.4914 / 0.2023, rel_tol=1e-6)
