"""Cost of PGD on the model average against its floor, measured side by side in one run (ratios, no asserts).

PGD-K on M posterior samples does K·M forward passes and K·M backward passes to the input, one sample and
one chunk at a time (:meth:`ursa_ray.evaluation.adversarial.ModelAverage.attack_loss`).  Its floor is
K·M forward + backward passes of the network on the same batch: ``cross_entropy(net(x), y)`` and
``autograd.grad`` to the input, the weights frozen (an attack needs no weight gradients).  Target: PGD-K
÷ floor ≤ 1.3, with K = 10 and M = 20 (the defaults) on

* digits: the 360 test digits (1 × 8 × 8), MLP 64-200-200-10;
* MNIST-sized: 512 random 1 × 28 × 28 images (one attack chunk, ``ATTACK_BATCH``), MLP 784-200-200-10.

The M samples are M independently initialised networks, as a deep ensemble's or SG-MCMC's are.  Printed
beside the target, for context: the floor run over the M different networks in turn (what distinct weights
cost by themselves: M × parameters no longer stay in cache), a second copy of the floor (the measurement's
own spread), and PGD on a single sample (M = 1, as for SGD) against K floor passes.

The variants are timed whole and interleaved (each repeat runs each once, in an order rotated every
repeat).  Two ratios are printed: of the best (minimum) times, since other processes only ever add time,
and the median over repeats of the ratio within a repeat.  torch runs on one thread and times are
per-thread CPU time, which other processes competing for the cores hardly disturb.

    python benchmarks/bench_adversarial.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from torch import nn

from ursa_ray.data.vision import MNIST_MEAN, MNIST_STD
from ursa_ray.evaluation.adversarial import ATTACK_BATCH, ModelAverage, PixelScale, pgd
from ursa_ray.models.mlp import build_mlp

K, M = 10, 20
from bench_samplers import interleaved  # noqa: E402 - the samplers' timing: per-thread CPU time, rotated order


def ratio_line(label: str, num: list[float], den: list[float], target: str, den_scale: float = 1.0) -> str:
    best = min(num) / (min(den) * den_scale)
    paired = statistics.median(a / (b * den_scale) for a, b in zip(num, den, strict=True))
    return f"  {label:<52s} {best:6.3f}   {paired:17.3f}   {target}"


def section(title: str, pixels: torch.Tensor, y: torch.Tensor, scale: PixelScale, repeats: int) -> None:
    shape = tuple(pixels.shape[1:])
    torch.manual_seed(0)
    networks = [build_mlp(shape, 10).eval() for _ in range(M)]
    for network in networks:
        network.requires_grad_(False)
    average, single = ModelAverage(M, M), ModelAverage(1, 1)
    for network in networks:
        average.observe(network)
    single.observe(networks[0])
    x = scale.to_inputs(pixels)

    def floor_passes(nets: list[nn.Module]) -> None:
        for _ in range(K):
            for net in nets:
                xr = x.detach().requires_grad_(True)
                loss = nn.functional.cross_entropy(net(xr), y, reduction="sum")
                torch.autograd.grad(loss, xr)

    variants = {
        "floor": lambda: floor_passes(networks[:1] * M),
        "floor copy": lambda: floor_passes(networks[:1] * M),
        "floor, M networks": lambda: floor_passes(networks),
        "pgd": lambda: pgd(average, pixels, y, scale, [0.1], steps=K),
        "pgd M=1": lambda: pgd(single, pixels, y, scale, [0.1], steps=K),
    }
    for run in variants.values():
        run()
    times = interleaved(variants, repeats)
    n, passes = pixels.shape[0], K * M
    print(
        f"[{title}: batch {n}, MLP {'-'.join(map(str, [shape[-1] * shape[-2], 200, 200, 10]))}, "
        f"K = {K}, M = {M}, {repeats} repeats]"
    )
    print(
        f"  floor fwd+bwd {min(times['floor']) / passes * 1e3:7.3f} ms a pass; "
        f"PGD {min(times['pgd']) / passes * 1e3:7.3f} ms a pass"
    )
    print(f"  {'':<52s} {'best':>6s}   {'median of repeats':>17s}")
    print(ratio_line("PGD-K on M samples / K·M floor passes", times["pgd"], times["floor"], "target <= 1.3"))
    print(ratio_line("floor over the M networks / floor", times["floor, M networks"], times["floor"], "context"))
    print(
        ratio_line(
            "PGD-K on M samples / floor over the M networks", times["pgd"], times["floor, M networks"], "context"
        )
    )
    print(ratio_line("floor copy / floor", times["floor copy"], times["floor"], "1"))
    print(ratio_line("PGD-K on 1 sample / K floor passes", times["pgd M=1"], times["floor"], "context", 1 / M))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, CPU time")
    from ursa_ray.data.digits import load_digits_dataset

    digits = load_digits_dataset({}, (), Path("unused"), False, 0)
    scale = PixelScale(digits.pixel_mean, digits.pixel_std)
    section("digits", scale.to_pixels(digits.test_x).clamp(0, 1), digits.test_y, scale, 4 if args.quick else 15)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(ATTACK_BATCH, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (ATTACK_BATCH,), generator=generator)
    section("MNIST-sized", pixels, labels, PixelScale((MNIST_MEAN,), (MNIST_STD,)), 3 if args.quick else 8)


if __name__ == "__main__":
    main()
