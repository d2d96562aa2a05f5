"""Speed of the samplers against plain PyTorch, measured side by side in one run (ratios, no asserts).

* SGLD and SGHMC epoch time ÷ a plain ``torch.optim.SGD`` epoch on the same model, batch size and data
  (target ≤ 1.2), on (a) digits-sized data, 1437 × 64 inputs, MLP 64-200-200-10, and (b) 60,000 random
  MNIST-sized examples, MLP 784-200-200-10; all variants draw their mini-batches from the same
  ``problem.minibatches`` (shuffle + gather).
* A plain SGD epoch ÷ the matmul floor: multiply-adds per example × N × 2 FLOP × 3 (forward, and the two
  backward products) ÷ the dense float32 matmul rate torch reaches here (best of several 2048² products).
  Target within 2.5×.
* HMC full-batch gradient evaluations per second ÷ plain full-batch forward + backward passes per second
  of the same ``nn.Module`` (target ≥ 0.9).
* For context, the cost of one N(0, I) draw of all parameters, which SGLD/SGHMC pay every step and plain
  SGD does not: torch's ``normal_`` (MT19937, what ``GaussianNoise`` falls back to without numba) beside
  the Philox kernel the samplers use on the CPU (``ursa_ray/methods/_philox_gaussian.py``); SGLD at
  temperature 0 (the same loop without the draw); and a second copy of plain SGD, whose ratio to the
  first shows how far the measurement itself strays.

The SG-MCMC variants run side by side: each in a thread, taking turns of a few dozen steps (five epochs
of the digits data, 40 steps of the MNIST-sized) in an order shuffled every round, only one running at a
time (:class:`TakeTurns`).  A burst of load on the shared machine then falls on all variants alike
instead of on whichever ran that second, while each step still follows its own variant's previous one,
as in a real run.  A variant's time for a run is the time of its turns: all its work (set-up, shuffles
and gathers, steps) and none of its waiting.  HMC's variants are timed whole, interleaved (each repeat
runs each once, back to back).  Three ratios are printed: of the best (minimum) times, since other
processes only ever add time; the median over repeats of the ratio within a repeat; and, for the SG-MCMC
epochs, the ratio of the median step time (from a mini-batch handed out to the next one asked for) over
every step of every repeat.
By default torch runs on one thread (a trial with ``cpu: 1``) and times are per-thread CPU time, which
other processes competing for the cores hardly disturb; with ``--threads N`` (N > 1) they are
wall-clock times.

    python benchmarks/bench_samplers.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from ursa_ray.methods import get_method
from ursa_ray.methods._philox_gaussian import add_standard_normal
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise
from ursa_ray.methods.base import Categorical, Problem, resolve_config
from ursa_ray.models.mlp import build_mlp


class TakeTurns:
    """Variants in threads that take turns, ``steps`` steps at a time, in rounds: each round every variant
    still running takes a turn, in an order shuffled afresh each round, so a burst of load on the machine
    falls on all of them alike and none always follows the same other.  A thread blocks outside its turn,
    so one variant runs at a time; ``times[name]`` sums the ``clock`` time of its turns, which hold all of
    its work (set-up, shuffles and gathers, steps, wrap-up) and none of its waiting.

    Turns of one step would leave every step the caches of another variant; that flatters the samplers
    (measured here, two runs each: MNIST-sized SGLD/SGHMC ratios 0.02–0.09 lower than with 60-step turns),
    so turns are long enough for a variant's steps to follow its own, as in a real run."""

    def __init__(self, names: list[str], steps: int, seed: int = 0):
        self.times = dict.fromkeys(names, 0.0)
        self._running = list(names)
        self._steps = steps
        self._taken = 0
        self._holder: str | None = None
        self._since = 0.0
        self._random = random.Random(seed)
        self._round: list[str] = []
        self._condition = threading.Condition()
        self._new_round()

    def _new_round(self) -> None:
        self._round = self._random.sample(self._running, len(self._running))

    def _pass_turn(self) -> None:
        """End the turn of the variant at the head of the round (called from its thread)."""
        name = self._round.pop(0)
        self.times[name] += clock() - self._since
        self._holder = None
        self._taken = 0
        if not self._round and self._running:
            self._new_round()
        self._condition.notify_all()

    def wait(self, name: str) -> None:
        """Block until it is ``name``'s turn (at once while it holds the turn)."""
        with self._condition:
            self._condition.wait_for(lambda: self._round[0] == name)
            if self._holder != name:
                self._holder, self._since = name, clock()

    def step_done(self) -> None:
        with self._condition:
            self._taken += 1
            if self._taken == self._steps:
                self._pass_turn()

    def finish(self, name: str) -> None:
        """``name`` has returned: its turn, if it holds it, ends, and it takes no more."""
        with self._condition:
            self._running.remove(name)
            if self._holder == name:
                self._pass_turn()
            elif name in self._round:
                self._round.remove(name)
                if not self._round and self._running:
                    self._new_round()
                self._condition.notify_all()


@dataclass
class StepTimedProblem(Problem):
    """A problem that hands out mini-batches only on its variant's turn (when given :class:`TakeTurns`) and
    records how long its consumer works on each (from handing one out to being asked for the next): the
    step, without the shuffle and gather that every variant shares."""

    step_times: list[float] = field(default_factory=list)
    turns: TakeTurns | None = None
    name: str = ""

    def minibatches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = super().minibatches(batch_size)
        while True:
            if self.turns is not None:
                self.turns.wait(self.name)
            batch = next(batches, None)
            if batch is None:
                break
            start = clock()
            yield batch
            self.step_times.append(clock() - start)
            if self.turns is not None:
                self.turns.step_done()


def make_problem(n: int, d: int, seed: int = 0) -> StepTimedProblem:
    data = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=data)
    y = torch.randint(0, 10, (n,), generator=data)
    generator = torch.Generator().manual_seed(seed + 1)

    def make_model() -> nn.Module:
        return build_mlp((d,), 10, [200, 200])

    return StepTimedProblem(
        x=x, y=y, likelihood=Categorical(), make_model=make_model, generator=generator, device=torch.device("cpu")
    )


def mult_adds_per_example(model: nn.Module) -> int:
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))


clock = time.thread_time


def matmul_flops_per_second(size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = clock()
        a @ b
        best = min(best, clock() - start)
    return 2 * size**3 / best


def sgd_epochs(problem: Problem, epochs: int, batch_size: int) -> None:
    """The plain PyTorch baseline: SGD on the mean cross-entropy."""
    model = problem.make_model()
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(epochs):
        for xb, yb in problem.minibatches(batch_size):
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()


def sampler_epochs(name: str, problem: Problem, epochs: int, batch_size: int, temperature: float = 1.0) -> None:
    method = get_method(name)
    overrides = {
        "lr": 1e-3,
        "epochs": epochs,
        "burn_in_epochs": epochs - 1,
        "n_samples": 1,
        "batch_size": batch_size,
        "temperature": temperature,
    }
    if name == "sghmc":
        overrides |= {"schedule": "constant"}
    for _ in method.sample_posterior(problem, resolve_config(method, overrides), {}):
        pass


def interleaved(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = clock()
            variants[name]()
            times[name].append(clock() - start)
    return times


def ratio_line(label: str, num: list[float], den: list[float], target: str, step_ratio: float | None = None) -> str:
    """Best-time ratio, the median over repeats of the ratio within a repeat, and (where given) the ratio of
    median step times."""
    best = min(num) / min(den)
    paired = statistics.median(a / b for a, b in zip(num, den))
    step = "" if step_ratio is None else f"{step_ratio:11.3f}"
    return f"  {label:<44s} {best:6.3f}   {paired:17.3f}   {step:>11s}   target {target}"


def draw_seconds(fill: Callable[[torch.Tensor, torch.Generator], object], n: int, repeats: int = 50) -> float:
    """Best-of-5 time of one ``fill(vector, generator)`` on an ``n``-vector."""
    noise, gen = torch.zeros(n), torch.Generator().manual_seed(0)
    fill(noise, gen)
    best = math.inf
    for _ in range(5):
        start = clock()
        for _ in range(repeats):
            fill(noise, gen)
        best = min(best, (clock() - start) / repeats)
    return best


def epochs_in_turns(
    variants: dict[str, Callable[[StepTimedProblem], object]],
    problem: StepTimedProblem,
    repeats: int,
    steps_per_turn: int,
) -> tuple[dict[str, list[float]], dict[str, list[list[float]]]]:
    """Run every variant ``repeats`` times, the variants of a repeat in :class:`TakeTurns`; returns each
    variant's time per repeat (everything it did, waiting aside) and its step times, one list per repeat."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    steps: dict[str, list[list[float]]] = {name: [] for name in variants}
    order = list(variants)
    for r in range(repeats):
        turns = TakeTurns(order, steps_per_turn, seed=r)
        problems = {name: dataclasses.replace(problem, step_times=[], turns=turns, name=name) for name in order}
        errors: list[BaseException] = []

        def run(name: str) -> None:
            try:
                turns.wait(name)  # set-up too runs in turn
                variants[name](problems[name])
            except BaseException as error:  # re-raised below, in the main thread
                errors.append(error)
            finally:
                turns.finish(name)

        threads = [threading.Thread(target=run, args=(name,)) for name in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        for name in order:
            times[name].append(turns.times[name])
            steps[name].append(problems[name].step_times)
    return times, steps


def sgmcmc_section(
    title: str, n: int, d: int, epochs: int, repeats: int, batch_size: int, steps_per_turn: int, flops: float
) -> None:
    problem = make_problem(n, d)
    model = problem.make_model()
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[{title}: N={n}, MLP {d}-200-200-10 ({n_params:,} parameters), batch {batch_size}, "
        f"{epochs} epoch(s) per run, {repeats} runs taking turns of {steps_per_turn} steps]"
    )
    for name in ("sgld", "sghmc"):  # warm-up (registry import, allocator)
        sampler_epochs(name, make_problem(min(n, 2048), d), 1, batch_size)
    times, step_times = epochs_in_turns(
        {
            "sgd": lambda p: sgd_epochs(p, epochs, batch_size),
            "sgd_copy": lambda p: sgd_epochs(p, epochs, batch_size),
            "sgld": lambda p: sampler_epochs("sgld", p, epochs, batch_size),
            "sghmc": lambda p: sampler_epochs("sghmc", p, epochs, batch_size),
            "sgld_t0": lambda p: sampler_epochs("sgld", p, epochs, batch_size, temperature=0.0),
        },
        problem,
        repeats,
        steps_per_turn,
    )
    steps_median = {name: statistics.median(t for run in runs for t in run) for name, runs in step_times.items()}
    sgd_epoch = min(times["sgd"]) / epochs
    floor = n * mult_adds_per_example(model) * 2 * 3 / flops
    steps = math.ceil(n / batch_size)
    draws = {"torch normal_": draw_seconds(lambda noise, gen: noise.normal_(generator=gen), n_params)}
    draws["Philox kernel"] = draw_seconds(lambda noise, gen: add_standard_normal(noise.numpy(), 1, 0, 1e-3), n_params)
    bits = GaussianNoise(torch.empty(1), torch.Generator()).bits
    print(f"  plain SGD epoch {sgd_epoch * 1e3:9.1f} ms; matmul floor {floor * 1e3:8.1f} ms")
    print(
        f"  one N(0,I) draw of all parameters (added in place), × {steps} steps, as a share of a plain SGD epoch "
        f"(the samplers use {bits} here):"
    )
    print("    " + "; ".join(f"{k} {t * 1e3:.3f} ms ({t * steps / sgd_epoch:.1%})" for k, t in draws.items()))
    print(f"  {'':<44s} {'best':>6s}   {'median of repeats':>17s}   {'median step':>11s}")
    for name, label, target in (
        ("sgld", "SGLD epoch / plain SGD epoch", "<= 1.2"),
        ("sghmc", "SGHMC epoch / plain SGD epoch", "<= 1.2"),
        ("sgld_t0", "(SGLD at T=0, no noise drawn) / plain SGD", "(context)"),
        ("sgd_copy", "(plain SGD, a second copy) / plain SGD", "(the noise)"),
    ):
        step_ratio = steps_median[name] / steps_median["sgd"]
        print(ratio_line(label, times[name], times["sgd"], target, step_ratio))
    print(
        f"  {'plain SGD epoch / matmul floor':<44s} {sgd_epoch / floor:6.3f}   "
        f"{statistics.median(times['sgd']) / epochs / floor:17.3f}   {'':>11s}   target <= 2.5"
    )


def hmc_section(title: str, n: int, d: int, passes: int, repeats: int) -> None:
    problem = make_problem(n, d)
    method = get_method("hmc")
    n_leapfrog = passes
    config = resolve_config(
        method,
        {
            "n_leapfrog": n_leapfrog,
            "burn_in": 0,
            "n_samples": 1,
            "adapt_step_size": False,
            "step_size": 1e-5,
            "prior_std": 1.0,
        },
    )
    stats: dict[str, float] = {}

    def run_hmc() -> None:
        for _ in method.sample_posterior(problem, config, stats):
            pass

    def plain() -> None:
        m = problem.make_model()
        m.eval()
        for _ in range(n_leapfrog + 1):
            m.zero_grad(set_to_none=True)
            loss = problem.likelihood.nll(m(problem.x), problem.y, reduction="sum")
            loss.backward()

    run_hmc()
    plain()
    times = interleaved({"hmc": run_hmc, "plain": plain}, repeats)
    assert stats["grad_evals"] == n_leapfrog + 1
    print(f"[{title}: full batch N={n}, MLP {d}-200-200-10, {n_leapfrog + 1} gradients per run]")
    print(
        f"  plain fwd+bwd {min(times['plain']) / (n_leapfrog + 1) * 1e3:9.1f} ms; "
        f"HMC gradient {min(times['hmc']) / (n_leapfrog + 1) * 1e3:9.1f} ms"
    )
    # both runs do n_leapfrog + 1 gradients, so (grads/s HMC) / (passes/s plain) = t_plain / t_hmc
    print(f"  {'':<44s} {'best':>6s}   {'median of repeats':>17s}")
    print(ratio_line("HMC grad evals/s / plain fwd+bwd passes/s", times["plain"], times["hmc"], ">= 0.9"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and epochs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; >1 times wall clock)")
    args = parser.parse_args()
    global clock
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    torch.manual_seed(0)
    kind = "CPU time" if args.threads == 1 else "wall-clock time"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {kind}")
    flops = matmul_flops_per_second()
    print(f"dense float32 matmul (2048²): {flops / 1e9:.1f} GFLOP/s")
    quick = args.quick
    sgmcmc_section(
        "digits-sized",
        1437,
        64,
        epochs=5 if quick else 10,
        repeats=3 if quick else 14,
        batch_size=128,
        steps_per_turn=60,
        flops=flops,
    )
    sgmcmc_section(
        "MNIST-sized",
        60000,
        784,
        epochs=1,
        repeats=2 if quick else 10,
        batch_size=128,
        steps_per_turn=40,
        flops=flops,
    )
    hmc_section("digits-sized", 1437, 64, passes=20 if quick else 40, repeats=3 if quick else 5)
    hmc_section("MNIST-sized", 10000 if quick else 60000, 784, passes=3, repeats=2 if quick else 3)


if __name__ == "__main__":
    main()
