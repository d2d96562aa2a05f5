"""Common corruptions (ursa_ray.evaluation.corruptions): seeded determinism, severity ordering, the
normalised pixel range, the three image shapes of the repository's datasets, agreement with the library
operations they stand in for, a trained model's accuracy falling with severity, and Ovadia et al.'s
summaries on a hand case."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as nnf
import torchvision.transforms.v2.functional as tvf

from analysis.corruption_shift import severity_summary
from ursa_ray.data import get_dataset
from ursa_ray.data.digits import _split
from ursa_ray.data.vision import CIFAR_MEAN, CIFAR_STD, MNIST_MEAN, MNIST_STD
from ursa_ray.evaluation.corruptions import (
    CORRUPTIONS,
    RANDOM_CORRUPTIONS,
    SEVERITIES,
    corrupt,
    corrupt_pixels,
    corruption_parameter,
    validate_corruptions,
)
from ursa_ray.models.mlp import build_mlp

N_IMAGES = 48


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small batches gain nothing from threads, and on a busy two-core runner threads contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def digits_statistics() -> tuple[float, float]:
    """The mean and std the digits dataset standardises with (the Dataset does not carry them)."""
    x_train = _split()[0]
    return float(x_train.mean()), float(x_train.std())


def pixel_batches() -> dict[str, tuple[torch.Tensor, tuple[float, ...], tuple[float, ...]]]:
    """Real digit images in pixel space, at the three shapes, with each shape's normalisation:
    digits (N, 1, 8, 8); MNIST-shaped (N, 1, 28, 28), the digits resized; CIFAR-shaped (N, 3, 32, 32),
    the digits resized and coloured (a random ink and background colour per image)."""
    digits = torch.from_numpy(_split()[1][:N_IMAGES]).unsqueeze(1)
    generator = torch.Generator().manual_seed(0)
    large = nnf.interpolate(digits, size=32, mode="bilinear", align_corners=False)
    ink, paper = torch.rand((2, N_IMAGES, 3, 1, 1), generator=generator)
    mean, std = digits_statistics()
    return {
        "digits": (digits, (mean,), (std,)),
        "mnist": (nnf.interpolate(digits, size=28, mode="bilinear", align_corners=False), (MNIST_MEAN,), (MNIST_STD,)),
        "cifar": ((large * ink + (1 - large) * paper).clamp(0, 1), CIFAR_MEAN, CIFAR_STD),
    }


BATCHES = pixel_batches()


def normalise(pixels: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    return (pixels - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def test_validate_corruptions_names_the_bad_value_and_the_allowed_ones():
    validate_corruptions(CORRUPTIONS, SEVERITIES)
    with pytest.raises(ValueError, match=r"unknown corruption 'fog'; allowed: gaussian_noise, shot_noise"):
        validate_corruptions(["contrast", "fog"], [1])
    for bad in (0, 6, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match=rf"severity {bad!r} is not an integer 1-5; allowed: 1, 2, 3, 4, 5"):
            validate_corruptions(["contrast"], [3, bad])
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt_pixels(BATCHES["mnist"][0], "snow", 1, 0)
    with pytest.raises(ValueError, match="severity 0"):
        corrupt_pixels(BATCHES["mnist"][0], "contrast", 0, 0)


def test_set_and_table():
    assert len(CORRUPTIONS) == 10 and len(set(CORRUPTIONS)) == 10
    random = {"gaussian_noise", "shot_noise", "impulse_noise", "elastic_transform", "rotate", "shear"}
    assert set(RANDOM_CORRUPTIONS) == random
    # spot checks against the papers' tables (CIFAR-10-C for RGB, MNIST-C for grayscale)
    assert corruption_parameter("gaussian_noise", 1, 3) == 0.04 and corruption_parameter("gaussian_noise", 5, 1) == 0.38
    assert corruption_parameter("jpeg_compression", 5, 3) == 40 and corruption_parameter("jpeg_compression", 1, 1) == 25
    assert corruption_parameter("contrast", 5, 3) == 0.15 and corruption_parameter("shot_noise", 3, 1) == 12
    with pytest.raises(ValueError, match="1 \\(grayscale\\) or 3 \\(RGB\\) channels, got 2"):
        corrupt_pixels(torch.rand(2, 2, 8, 8), "contrast", 1, 0)


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_deterministic_for_a_seed(corruption):
    pixels = BATCHES["mnist"][0]
    first = corrupt_pixels(pixels, corruption, 3, seed=7)
    torch.manual_seed(123)  # the global generator plays no part
    assert torch.equal(first, corrupt_pixels(pixels.clone(), corruption, 3, seed=7))
    other = corrupt_pixels(pixels, corruption, 3, seed=8)
    if corruption in RANDOM_CORRUPTIONS:
        assert not torch.equal(first, other)
    else:
        assert torch.equal(first, other)


def test_global_generator_untouched():
    state = torch.get_rng_state()
    for corruption in RANDOM_CORRUPTIONS:
        corrupt_pixels(BATCHES["digits"][0], corruption, 2, seed=0)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("shape", list(BATCHES))
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_severity_orders_the_change_and_output_stays_in_the_normalised_range(corruption, shape):
    pixels, mean, std = BATCHES[shape]
    images = normalise(pixels, mean, std)
    low = normalise(torch.zeros(1, len(mean), 1, 1), mean, std)
    high = normalise(torch.ones(1, len(mean), 1, 1), mean, std)
    changes = []
    for severity in SEVERITIES:
        out = corrupt(images, corruption, severity, seed=0, mean=mean, std=std)
        assert out.shape == images.shape and out.dtype == images.dtype and out.device == images.device
        assert torch.isfinite(out).all()
        assert (out >= low - 1e-5).all() and (out <= high + 1e-5).all()
        changes.append((out - images).mul(torch.tensor(std).view(1, -1, 1, 1)).abs().mean().item())
    assert all(b >= a - 1e-7 for a, b in zip(changes, changes[1:])), changes  # non-decreasing in pixel units
    assert changes[-1] > changes[0] > 0, changes


def test_corrupt_is_corrupt_pixels_between_unnormalise_and_normalise():
    pixels, mean, std = BATCHES["cifar"]
    images = normalise(pixels, mean, std)
    expected = normalise(corrupt_pixels(pixels, "shot_noise", 2, seed=3), mean, std)
    assert torch.allclose(corrupt(images, "shot_noise", 2, seed=3, mean=mean, std=std), expected, atol=1e-5)
    expected = normalise(corrupt_pixels(pixels, "contrast", 2, 0), mean, std)
    assert torch.allclose(corrupt(images, "contrast", 2, 0, mean, std), expected, atol=1e-5)
    with pytest.raises(ValueError, match="mean must have 1 or 3 values"):
        corrupt(images, "contrast", 1, 0, mean=(0.5, 0.5), std=std)
    with pytest.raises(ValueError, match="std must be positive"):
        corrupt(images, "contrast", 1, 0, mean=mean, std=(0.2, 0.0, 0.2))


def test_noise_follows_its_formula_with_the_same_draws_at_every_severity():
    pixels = BATCHES["cifar"][0]
    (out1, sigma1), (out5, sigma5) = (
        (corrupt_pixels(pixels, "gaussian_noise", s, 0), corruption_parameter("gaussian_noise", s, 3)) for s in (1, 5)
    )
    unclipped = (out1 > 0) & (out1 < 1) & (out5 > 0) & (out5 < 1)
    z1, z5 = (out1 - pixels)[unclipped] / sigma1, (out5 - pixels)[unclipped] / sigma5
    assert torch.allclose(z1, z5, atol=1e-4)
    assert 0.9 < z1.std().item() < 1.1
    gray = torch.full((64, 3, 32, 32), 0.5)
    amount = corruption_parameter("impulse_noise", 5, 3)
    out = corrupt_pixels(gray, "impulse_noise", 5, 0)
    assert abs((out == 0).float().mean().item() - amount / 2) < 0.005  # pepper
    assert abs((out == 1).float().mean().item() - amount / 2) < 0.005  # salt
    mild = corrupt_pixels(gray, "impulse_noise", 1, 0)
    assert ((out != gray) | (mild == gray)).all()  # severity 1's corrupted values are among severity 5's
    photons = corruption_parameter("shot_noise", 5, 3)
    out = corrupt_pixels(gray, "shot_noise", 5, 0)  # Poisson(λ/2)/λ: mean 1/2, variance 1/(2λ)
    assert out.mean().item() == pytest.approx(0.5, abs=0.005)
    assert out.var().item() == pytest.approx(0.5 / photons, rel=0.05)


def test_blur_equals_torchvisions_gaussian_blur():
    for shape, sigma in (("mnist", 6.0), ("cifar", 1.0), ("digits", 6.0 * 8 / 28)):  # severity 5, scaled
        pixels = BATCHES[shape][0]
        radius = min(int(np.ceil(4 * sigma)), pixels.shape[-1] - 1)
        reference = tvf.gaussian_blur(pixels, [2 * radius + 1] * 2, [sigma, sigma])
        assert torch.allclose(corrupt_pixels(pixels, "gaussian_blur", 5, 0), reference, atol=1e-5), shape


def test_brightness_raises_the_hsv_value():
    x = torch.tensor([0.2, 0.4, 0.8]).view(1, 3, 1, 1)  # V = 0.8 → 0.9: every channel × 0.9/0.8
    out = corrupt_pixels(x, "brightness", 3, 0)  # b = 0.15 for RGB
    assert torch.allclose(out.flatten(), torch.tensor([0.2, 0.4, 0.8]) * 0.95 / 0.8)
    black = corrupt_pixels(torch.zeros(1, 1, 8, 8), "brightness", 2, 0)
    assert torch.allclose(black, torch.full_like(black, 0.2))  # grayscale: x + b


def test_jpeg_is_close_to_libjpeg():
    for shape in BATCHES:
        pixels = BATCHES[shape][0]
        for severity in SEVERITIES:
            quality = corruption_parameter("jpeg_compression", severity, pixels.shape[1])
            ours = corrupt_pixels(pixels, "jpeg_compression", severity, 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29's codecs
                libjpeg = tvf.jpeg((pixels * 255).round().to(torch.uint8), int(quality)).float() / 255
            compression_error = (libjpeg - pixels).abs().mean().item()
            bound = 0.25 if pixels.shape[1] == 3 else 0.03
            assert (ours - libjpeg).abs().mean().item() < bound * compression_error, (shape, quality)


def test_corruption_lowers_a_trained_models_accuracy():
    torch.manual_seed(0)
    ds = get_dataset("digits").load({}, (), None, False, 0)
    mean, std = digits_statistics()
    assert torch.allclose(normalise(torch.from_numpy(_split()[1]).unsqueeze(1), (mean,), (std,)), ds.test_x)
    model = build_mlp((1, 8, 8), 10, [200, 200])
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = torch.Generator().manual_seed(0)
    for _ in range(10):
        for batch in torch.randperm(len(ds.train_x), generator=order).split(64):
            optimiser.zero_grad()
            nnf.cross_entropy(model(ds.train_x[batch]), ds.train_y[batch]).backward()
            optimiser.step()
    model.eval()

    def accuracy(x: torch.Tensor) -> float:
        with torch.no_grad():
            return (model(x).argmax(1) == ds.test_y).float().mean().item()

    clean = accuracy(ds.test_x)
    assert clean > 0.93
    for corruption in CORRUPTIONS:
        mild, severe = (accuracy(corrupt(ds.test_x, corruption, s, 0, mean, std)) for s in (1, 5))
        assert severe < mild - 0.02, (corruption, mild, severe)


def test_severity_summary_hand_case():
    values = pd.DataFrame(
        {
            "method": ["sgd"] * 8 + ["swag"] * 4,
            "corruption": ["contrast", "rotate", "shot_noise", "shear"] * 3,
            "severity": [1] * 4 + [5] * 4 + [1] * 4,
            "accuracy": [0.9, 0.8, 0.7, 0.6, 0.5, 0.1, 0.3, 0.2, 1.0, 1.0, 0.5, 0.5],
            "ece": [0.01, 0.02, 0.03, 0.04, 0.2, 0.4, 0.3, 0.1, 0.0, 0.0, 0.0, 0.0],
        }
    )
    summary = severity_summary(values, ["accuracy", "ece"], by=["method"])
    summary = summary.set_index(["method", "severity", "metric"])
    statistics = ["mean", "min", "q25", "median", "q75", "max"]
    row = summary.loc[("sgd", 1, "accuracy")]
    # values 0.6, 0.7, 0.8, 0.9: quartiles at positions 0.75, 1.5, 2.25 between order statistics
    assert row["n_corruptions"] == 4
    assert row[statistics].tolist() == pytest.approx([0.75, 0.6, 0.675, 0.75, 0.825, 0.9])
    row = summary.loc[("sgd", 5, "ece")]  # 0.1, 0.2, 0.3, 0.4
    assert row[statistics].tolist() == pytest.approx([0.25, 0.1, 0.175, 0.25, 0.325, 0.4])
    row = summary.loc[("swag", 1, "accuracy")]  # 0.5, 0.5, 1.0, 1.0
    assert row[["mean", "q25", "median", "q75"]].tolist() == pytest.approx([0.75, 0.5, 0.75, 1.0])
    assert len(summary) == 3 * 2
    with pytest.raises(ValueError, match="more than one row"):
        severity_summary(pd.concat([values, values.iloc[:1]]), ["accuracy"], by=["method"])
    with pytest.raises(ValueError, match="missing columns \\['nll'\\]"):
        severity_summary(values, ["nll"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_the_gpu_deterministic_and_close_to_the_cpu():
    pixels, mean, std = BATCHES["cifar"]
    images = normalise(pixels, mean, std)
    for corruption in CORRUPTIONS:
        on_gpu = corrupt(images.cuda(), corruption, 5, 0, mean, std)
        assert on_gpu.device.type == "cuda"
        assert torch.equal(on_gpu, corrupt(images.cuda(), corruption, 5, 0, mean, std))
        if corruption not in RANDOM_CORRUPTIONS:  # no draws: the same images up to rounding
            cpu = corrupt(images, corruption, 5, 0, mean, std)
            assert (on_gpu.cpu() - cpu).abs().mean().item() < 1e-3, corruption
