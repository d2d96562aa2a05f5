"""How fast this host is right now: milliseconds per batched full-batch gradient of four MLP 64-200-200-10
copies on 1,257 digits-sized examples (the quickstart reference's step, ``torch.func.vmap`` over
``functional_call``), the mean of 50 after 5 warm-ups, on ``--threads`` torch threads (default 1).

On a shared host the same step's time moves with the hour (docs/performance.md, "The machine": 14.5 to 27 ms
on one thread on the 2-core machine); read it before and after a wall-clock measurement and compare timings only
at similar readings.

    python benchmarks/host_speed.py [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.func import functional_call, vmap

N_EXAMPLES, N_COPIES, SIZES = 1_257, 4, (64, 200, 200, 10)


def gradient_step_ms(repeats: int = 50) -> float:
    """Mean milliseconds of one batched gradient (forward, NLL summed in float64, backward) over ``repeats``."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N_EXAMPLES, SIZES[0], generator=generator)
    y = torch.randint(0, SIZES[-1], (N_COPIES, N_EXAMPLES), generator=generator)
    layers = [torch.nn.Linear(a, b) for a, b in zip(SIZES[:-1], SIZES[1:], strict=False)]
    net = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
    stacked = {k: v.detach().expand(N_COPIES, *v.shape).clone() for k, v in net.named_parameters()}

    def nll(params: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        logits = functional_call(net, params, (x,))
        return -torch.distributions.Categorical(logits=logits).log_prob(labels).sum(dtype=torch.float64)

    def step() -> None:
        params = {k: v.requires_grad_(True) for k, v in stacked.items()}
        torch.autograd.grad(vmap(nll)(params, y).sum(), list(params.values()))

    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"host speed: {gradient_step_ms():.2f} ms per batched gradient ({args.threads} torch thread(s))")


if __name__ == "__main__":
    main()
