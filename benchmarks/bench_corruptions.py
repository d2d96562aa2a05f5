"""Corrupting a CIFAR-sized test set at every corruption type and severity ÷ one evaluation pass of ResNet50
over the same images on the same device (target < 1).

The test set is ``--n`` random 3 × 32 × 32 images (10,000, CIFAR10's test set, by default), normalised with
the CIFAR statistics and kept on the device, as a trial keeps its sets.  Corruption: every (type, severity)
of :data:`ursa_ray.evaluation.corruptions.CORRUPTIONS` × 1–5 through :func:`corrupt` (un-normalise, corrupt,
clip, normalise).  Evaluation: the CIFAR ResNet50 of ``ursa_ray/models/resnet.py`` prepared and run as a
trial runs it (``ursa_ray.trial.predict``, 2,048 images a batch; on a GPU channels-last with the body under
bfloat16 autocast and a float32 output layer).  Each side is warmed up on a small batch first, so neither
pays one-off costs; a GPU is synchronised before every clock reading.  Prints seconds per corruption type,
both totals and their ratio.

    python benchmarks/bench_corruptions.py [--n 10000] [--device auto|cpu|cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch

from ursa_ray.data.vision import CIFAR_MEAN, CIFAR_STD
from ursa_ray.evaluation.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from ursa_ray.evaluation.precision import evaluation_precision, keep_output_layer_float32
from ursa_ray.models.resnet import build_resnet50
from ursa_ray.trial import predict

N_CLASSES = 10
WARM_UP_IMAGES = 64


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def corrupt_all(images: torch.Tensor) -> dict[str, float]:
    """Seconds per corruption type for all five severities of ``images``."""
    seconds = {}
    for corruption in CORRUPTIONS:
        synchronise(images.device)
        start = time.perf_counter()
        for severity in SEVERITIES:
            corrupt(images, corruption, severity, 0, CIFAR_MEAN, CIFAR_STD)
        synchronise(images.device)
        seconds[corruption] = time.perf_counter() - start
    return seconds


def evaluation_pass(images: torch.Tensor) -> float:
    """Seconds of one pass of an (untrained) CIFAR ResNet50 over ``images``, prepared as a trial does."""
    device = images.device
    model = build_resnet50(tuple(images.shape[1:]), N_CLASSES).to(device).eval()
    precision = evaluation_precision(device, "classification")
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if precision is not None:
        keep_output_layer_float32(model, N_CLASSES)
    predict(model, images[:WARM_UP_IMAGES], precision)
    synchronise(device)
    start = time.perf_counter()
    predict(model, images, precision)
    synchronise(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="test images (default 10,000)")
    parser.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator(device=device).manual_seed(0)
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
    pixels = torch.rand((args.n, 3, 32, 32), generator=generator, device=device)
    images = (pixels - mean) / std
    del pixels

    corrupt_all(images[:WARM_UP_IMAGES])
    per_type = corrupt_all(images)
    corruption_s = sum(per_type.values())
    evaluation_s = evaluation_pass(images)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"device: {name}; n = {args.n} images of 3 x 32 x 32")
    for corruption, seconds in per_type.items():
        print(f"  {corruption:18s} 5 severities: {seconds:8.3f} s")
    print(f"corrupting, {len(CORRUPTIONS)} types x {len(SEVERITIES)} severities: {corruption_s:.3f} s")
    print(f"one ResNet50 evaluation pass: {evaluation_s:.3f} s")
    print(f"ratio corrupting / evaluation pass: {corruption_s / evaluation_s:.3f} (target < 1)")


if __name__ == "__main__":
    main()
