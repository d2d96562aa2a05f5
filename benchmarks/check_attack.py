"""An independent check of the white-box attack on posterior model averages (issue 26, item 4b).

On grids/mnist_5k.yaml the white-box PGD accuracy of the model average of SGLD, SGHMC and HMC at ε = 0.05
came out far below SGD's (0.19 / 0.29 / 0.18 against 0.78) while their transfer accuracy was above SGD's.
This script trains the grid's seed-0 trials of a few methods exactly as the grid does (``TrialRun`` of the
grid's own specs, lone path), keeps every posterior sample, and attacks the first ``--examples`` test
images at ε = 0.05 (pixel units) with

* ursa-ray's own PGD-10 (``ursa_ray.evaluation.adversarial.craft``) on the M kept samples' average, as a
  trial does;
* torchattacks' PGD (Madry et al. 2018; α = ε/4, 10 steps, random start; independent code: its own loop,
  plain autograd) on a module that returns log p̄(·|x) of the same M samples, in float32 and in float64
  (``nn.CrossEntropyLoss`` of log p̄ is −log p̄(y|x), the loss ursa-ray ascends), and on the average of all
  S samples;
* torchattacks' APGD-DLR (Croce & Hein 2020; step-size free, scale invariant: robust to gradient masking)
  on the M-sample average;
* torchattacks' PGD on each kept sample alone.

Each is scored under the attacked M-sample average and under the average of all S samples; single samples
under themselves and under the M-sample average.  To see whether a result is a property of the
predictive or of the attack it also prints, for the M-sample average and for single samples, the margin
m = log p̄(y|x) − maxₖ≠y log p̄(k|x), ‖∇ₓ m‖₁ in pixel space, the first-order ε = m / ‖∇ₓ m‖₁ an example
needs to flip, and the share of ‖∇ₓ m‖₁ on the pixels that are constant over the training set (MNIST's
border: no training image constrains their first-layer weights, which a sampler leaves at prior noise);
and PGD-10 allowed to change only the other pixels.

Needs torchattacks, which is no dependency of ursa-ray (install it next to it; its pinned ``requests`` is
not needed for the attacks used here):

    pip install --no-deps torchattacks==3.5.1
    python benchmarks/check_attack.py [--methods sgd sgld sghmc hmc deep_ensemble] [--examples 300]

One torch thread.  The findings are in docs/adversarial.md ("Is the model average really this fragile?").
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch
import torchattacks
from torch import nn

from ursa_ray.evaluation.adversarial import (
    ModelAverage,
    PixelScale,
    craft,
    kept_sample_indices,
)
from ursa_ray.grid import load_grid
from ursa_ray.spec import TrialSpec
from ursa_ray.trial import TrialRun

EPSILON = 0.05
GRID = Path(__file__).resolve().parents[1] / "grids" / "mnist_5k.yaml"


class LogMeanProbability(nn.Module):
    """log p̄(·|x) = logsumexp_s log softmax f(x; θₛ) − log S of ``networks``, taking pixels in [0, 1]
    (normalised with the dataset's mean and std on the way in), in ``dtype``."""

    def __init__(self, networks: list[nn.Module], scale: PixelScale, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.networks = nn.ModuleList(copy.deepcopy(n).to(dtype).eval().requires_grad_(False) for n in networks)
        self.mean, self.std, self.dtype = scale.mean[0], scale.std[0], dtype

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = (pixels.to(self.dtype) - self.mean) / self.std
        per_sample = torch.stack([n(x).log_softmax(dim=-1) for n in self.networks])
        return torch.logsumexp(per_sample, dim=0) - math.log(len(self.networks))


def accuracy(model: nn.Module, pixels: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(pixels).argmax(dim=1) == y).double().mean())


class OnPixels(nn.Module):
    """``model`` on pixels changed only where ``varying`` (the others kept at the clean ``pixels``): an
    attack through it perturbs only those pixels."""

    def __init__(self, model: nn.Module, pixels: torch.Tensor, varying: torch.Tensor):
        super().__init__()
        self.model, self.clean, self.varying = model, pixels, varying

    def forward(self, adversarial: torch.Tensor) -> torch.Tensor:
        return self.model(torch.where(self.varying, adversarial, self.clean))


def margin_gradient(
    model: nn.Module, pixels: torch.Tensor, y: torch.Tensor, constant: torch.Tensor
) -> dict[str, float]:
    """Over the correctly classified examples, medians of the margin m = log p̄(y|x) − maxₖ≠y log p̄(k|x),
    of ‖∇ₓ m‖₁ (pixel space), of the first-order ε = m / ‖∇ₓ m‖₁ (the L∞ radius at which the linearised
    margin reaches 0), and the mean share of ‖∇ₓ m‖₁ on the ``constant`` pixels (constant over the training
    set)."""
    x = pixels.clone().double().requires_grad_(True)
    log_p = model(x).double()
    true = log_p.gather(1, y[:, None]).squeeze(1)
    other = log_p.masked_fill(nn.functional.one_hot(y, log_p.shape[1]).bool(), -math.inf).amax(dim=1)
    margin = true - other
    (grad,) = torch.autograd.grad(margin.sum(), x)
    l1 = grad.abs().flatten(1)
    right = margin.detach() > 0
    margin, norm = margin.detach()[right], l1.sum(dim=1)[right]
    return {
        "margin": float(margin.median()),
        "grad_l1": float(norm.median()),
        "eps": float((margin / norm).median()),
        "on_constant": float((l1[right][:, constant.flatten()].sum(dim=1) / norm).mean()),
    }


def first_layer_weights(network: nn.Module, constant: torch.Tensor) -> tuple[float, float]:
    """Root mean square of the first linear layer's weights on the constant and on the other pixels."""
    weight = next(m for m in network.modules() if isinstance(m, nn.Linear)).weight.detach()
    on = constant.flatten()
    return float(weight[:, on].pow(2).mean().sqrt()), float(weight[:, ~on].pow(2).mean().sqrt())


def posterior_samples(spec: TrialSpec) -> tuple[list[nn.Module], TrialRun]:
    """Every sample of the trial's stream (deep copies), trained as the grid's trial is."""
    spec = dataclasses.replace(spec, transfer_source=False, corruptions={**spec.corruptions, "types": []})
    run = TrialRun(spec, torch.device("cpu"))
    samples = [copy.deepcopy(p).eval() for p in run.method.sample_posterior(run.problem, spec.config, run.stats)]
    return samples, run


def check(spec: TrialSpec, examples: int, seed: int, transfer_pixels: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
    """One method's row of the table, and the examples torchattacks' PGD-10 crafted on its M-sample average."""
    start = time.perf_counter()
    samples, run = posterior_samples(spec)
    scale = PixelScale(run.ds.pixel_mean, run.ds.pixel_std)
    x, y = run.eval_sets["test"][0][:examples], run.eval_sets["test"][1][:examples]
    pixels = scale.to_pixels(x).clamp(0, 1)
    constant = run.problem.x.std(dim=0) == 0  # pixels no training image changes (MNIST's border)
    attack_samples = spec.adversarial["attack_samples"]
    kept = [samples[i] for i in kept_sample_indices(len(samples), attack_samples)]
    average_m, average_s = LogMeanProbability(kept, scale), LogMeanProbability(samples, scale)
    average_m64 = LogMeanProbability(kept, scale, torch.float64)

    def scored(adversarial: torch.Tensor) -> str:
        return f"{accuracy(average_m, adversarial, y):.3f} / {accuracy(average_s, adversarial, y):.3f}"

    def pgd(model: nn.Module, steps: int = 10) -> torch.Tensor:
        torch.manual_seed(seed)
        return torchattacks.PGD(model, eps=EPSILON, alpha=EPSILON / 4, steps=steps, random_start=True)(pixels, y)

    ours = ModelAverage(len(samples), attack_samples, seed=run.seeds["attack"])
    for sample in samples:
        ours.observe(sample)
    crafted = craft(ours, x, y, scale, ["pgd"], [EPSILON], steps=10, seed=run.seeds["attack"])
    ours_pixels = crafted.sets[f"pgd_eps{EPSILON:g}"].pixels
    ta_m, ta_m64, ta_s = pgd(average_m), pgd(average_m64).float(), pgd(average_s)
    ta_m50 = pgd(average_m64, steps=50).float()
    torch.manual_seed(seed)
    apgd = torchattacks.APGD(average_m64, norm="Linf", eps=EPSILON, steps=50, loss="dlr", seed=seed)(pixels, y)
    singles, singles_under_m = [], []
    for network in kept:
        alone = LogMeanProbability([network], scale)
        adversarial = pgd(alone)
        singles.append(accuracy(alone, adversarial, y))
        singles_under_m.append(accuracy(average_m, adversarial, y))
    varying = ~constant.expand_as(pixels)
    restricted = torch.where(varying, pgd(OnPixels(average_m64, pixels, varying)).float(), pixels)
    of_m = margin_gradient(average_m64, pixels, y, constant)
    of_one = [margin_gradient(LogMeanProbability([n], scale, torch.float64), pixels, y, constant) for n in kept]
    one = {k: float(np.median([o[k] for o in of_one])) for k in of_m}
    w_constant, w_varying = first_layer_weights(kept[-1], constant)
    row = {
        "method": spec.method,
        "S / M": f"{len(samples)} / {len(kept)}",
        "clean": scored(pixels),
        "ursa PGD-10": scored(ours_pixels),
        "torchattacks PGD-10 f32": scored(ta_m),
        "f64": scored(ta_m64),
        "PGD-50 f64": scored(ta_m50),
        "APGD-DLR-50": scored(apgd),
        "PGD-10 on all S": f"- / {accuracy(average_s, ta_s, y):.3f}",
        "one sample alone: own / M avg": f"{np.mean(singles):.3f} / {np.mean(singles_under_m):.3f}",
        "SGD's examples": scored(transfer_pixels if transfer_pixels is not None else ta_m),
        "PGD-10, varying pixels only": scored(restricted),
        "margin: M avg / one": f"{of_m['margin']:.2f} / {one['margin']:.2f}",
        "‖∇m‖₁: M avg / one": f"{of_m['grad_l1']:.0f} / {one['grad_l1']:.0f}",
        "first-order ε: M avg / one": f"{of_m['eps']:.4f} / {one['eps']:.4f}",
        "‖∇m‖₁ share on constant pixels: M avg / one": f"{of_m['on_constant']:.2f} / {one['on_constant']:.2f}",
        "layer-1 weight RMS: constant / varying pixels": f"{w_constant:.3f} / {w_varying:.3f}",
        "s": f"{time.perf_counter() - start:.0f}",
    }
    return row, ta_m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["sgd", "sgld", "sghmc", "hmc", "deep_ensemble"])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    specs = {
        s.method: s
        for s in load_grid(GRID).trial_specs()
        if s.dataset == "mnist_5k" and s.seed == args.seed and s.method in args.methods
    }
    rows, transfer_pixels = [], None  # SGD's examples (sgd first in --methods), scored by every method
    for method in args.methods:
        row, crafted = check(specs[method], args.examples, args.seed, transfer_pixels)
        if method == "sgd":
            transfer_pixels = crafted
        rows.append(row)
        print(row, flush=True)
    columns = list(rows[0])
    print(
        f"\nε = {EPSILON}, first {args.examples} mnist_5k test images, seed {args.seed}; accuracy under the attacked "
        "M-sample average / under all S samples (attacks on the M-sample average unless named)\n"
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
