"""Stochastic-gradient MCMC: SGLD, SGHMC and their cyclical variants cSGLD and cSGHMC.

Target.  The (tempered) posterior π_T(θ) ∝ exp(−U(θ)/T) with the full-data potential

    U(θ) = −Σ_{i=1..N} log p(y_i | x_i, θ) − log N(θ; 0, prior_std² I),

estimated on a mini-batch B by Ũ(θ) = −(N/|B|) Σ_{i∈B} log p(y_i | x_i, θ) + ‖θ‖² / (2 prior_std²)
(the likelihood scaled by N, the prior on every parameter, biases included).  T = 1 is the
true posterior; T < 1 sharpens it (variance × T for a Gaussian posterior); T = 0 switches the noise off.

Step size.  ``lr`` is the *per-example* learning rate, the scale of SGD on the mean loss and of
URSABench's published settings.  The step on U is η = lr / N, so η∇Ũ = lr·∇[−mean_B log p] +
(lr / (N prior_std²))·θ, which is how the update is computed (one backward pass of the mean loss and
the prior's gradient added analytically).

Updates (ξ ~ N(0, I) fresh every step):

* SGLD (Welling & Teh 2011):     θ ← θ − η∇Ũ(θ) + √(2ηT)·ξ
* SGHMC (Chen et al. 2014), in the (η, α) form of their §3.3 with friction α and no gradient-noise
  estimate (β̂ = 0):              v ← (1 − α)·v − η∇Ũ(θ) + √(2αηT)·ξ;   θ ← θ + v,   v₀ = 0.
  With an explicit mass M, friction C and time step ε this is η = ε²/M, α = εC/M, v = (ε/M)·r.
  Starting from v₀ = 0 the first step is a plain gradient step plus noise (downhill in expectation).
  URSABench's faults -- noise never added, noise scaled √(2αη)/N, a first SGHMC step moving uphill --
  each have a test in ``tests/test_sgmcmc.py``.
* cSGLD / cSGHMC (Zhang et al. 2020): the same updates with the cyclical cosine step size
  α_k = (lr/2)·(cos(π·mod(k−1, ⌈K/M⌉)/⌈K/M⌉) + 1) over K = M·epochs_per_cycle·⌈N/B⌉ steps, M cycles.
  Within a cycle, steps with mod(k−1, C)/C < ``exploration`` are noise-free (SGD, or SGD with momentum
  1 − α); the rest sample.  ``samples_per_cycle`` samples are taken at the end of each cycle, one per
  epoch (closer together if the sampling stage is shorter than that), the last at the cycle's last step.

Samples.  SGLD/SGHMC run ``epochs`` epochs in all, the first ``burn_in_epochs`` of them burn-in, and
take exactly ``n_samples`` samples evenly spaced over the remaining steps, the last at the final step
(with 1 sample per epoch when epochs = burn_in_epochs + n_samples, URSABench's setting).  Each sample is
the live network (a view: consumed before the next step).  ``stats`` gets ``n_samples`` and
``grad_evals`` (mini-batch gradient evaluations so far).  A non-finite loss or parameter raises
FloatingPointError (checked before every sample and at the end of every epoch, or of every few epochs
when they are shorter than 32 steps).

Structure.  The update is written once, on a (C, P) state of C chains (:class:`LangevinUpdate`, ``init`` and
``update``, as normal-computing/posteriors writes a sampler), and so is the loop (:func:`sample_chains`): a lone
chain is C = 1 with the network's own forward pass (:class:`LangevinChain`), batched chains and seeds take
their gradients from stacked networks (:class:`LangevinCopies`).

Constraints.  ``burn_in_epochs < epochs`` and at most one sample per post-burn-in step (SGLD, SGHMC:
:data:`CHAIN_CONSTRAINTS`), at most one sample per sampling step of a cycle (cSGLD, cSGHMC:
:data:`CYCLE_CONSTRAINTS`); grid validation checks what it can before any trial, :meth:`_SGMCMC.plan` all
of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.methods._sgmcmc_kernels import (
    FlatModel,
    GaussianNoise,
    constant_lr,
    cosine_lr,
    cyclical_lr,
    langevin_noise_std,
    momentum_step_,
    warm_up_kernels,
)
from ursa_ray.methods._training import autocast_body
from ursa_ray.methods.base import (
    Constraint,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    SamplePlan,
    check_constraints,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, batched_nll, can_batch, copy_generators
from ursa_ray.methods.chains import ChainTrace, warm_up_diagnostics


def _common(lr: float, prior_std: float) -> tuple[Hyperparameter, ...]:
    return (
        Hyperparameter(
            "lr", float, lr, "per-example step size: the step on the N-scaled potential U is lr / N", low=0.0
        ),
        Hyperparameter("prior_std", float, prior_std, "std of the Gaussian prior N(0, prior_std² I)", low=1e-6),
        Hyperparameter(
            "temperature",
            float,
            1.0,
            "posterior temperature T: target ∝ exp(−U/T), the whole posterior (prior included) tempered; "
            "1 = Bayes posterior, 0 = no noise",
            low=0.0,
        ),
        Hyperparameter("batch_size", int, 128, "mini-batch size", low=1),
    )


def _alpha(default: float) -> Hyperparameter:
    return Hyperparameter(
        "alpha", float, default, "friction α: the velocity keeps (1 − α) per step", low=1e-4, high=1.0
    )


def _chain(schedule_default: str) -> tuple[Hyperparameter, ...]:
    return (
        Hyperparameter("epochs", int, 150, "epochs in all, burn-in included", low=1),
        Hyperparameter("burn_in_epochs", int, 50, "epochs before the first sample", low=0),
        Hyperparameter(
            "n_samples",
            int,
            100,
            "samples per chain, evenly spaced over the post-burn-in steps (last at the end)",
            low=1,
        ),
        Hyperparameter(
            "n_chains", int, 1, "chains run side by side (batched), their samples pooled; > 1 adds R̂ and ESS", low=1
        ),
        Hyperparameter(
            "schedule",
            str,
            schedule_default,
            "step size: constant, or cosine annealing from lr to lr/2 over the run (URSABench)",
            choices=("constant", "cosine"),
        ),
    )


def _cycles(epochs_per_cycle: int, samples_per_cycle: int) -> tuple[Hyperparameter, ...]:
    return (
        Hyperparameter("n_cycles", int, 10, "cycles M of the cyclical step size", low=1),
        Hyperparameter("epochs_per_cycle", int, epochs_per_cycle, "epochs per cycle", low=1),
        Hyperparameter(
            "exploration", float, 0.8, "fraction of each cycle run noise-free (exploration stage)", low=0.0, high=0.99
        ),
        Hyperparameter("samples_per_cycle", int, samples_per_cycle, "samples taken at the end of each cycle", low=1),
    )


def _steps_per_epoch(n_train: int, config: Mapping[str, Any]) -> int:
    """Mini-batches per epoch of ``n_train`` examples (the last one may be smaller)."""
    return math.ceil(n_train / config["batch_size"])


def _cycle(n_train: int, config: Mapping[str, Any]) -> tuple[int, int]:
    """(steps per cycle, in-cycle index of the first sampling step) of a cyclical sampler."""
    cycle = config["epochs_per_cycle"] * _steps_per_epoch(n_train, config)
    return cycle, math.ceil(config["exploration"] * cycle)


def _burn_in_below_epochs(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """The burn-in leaves at least one epoch to sample in (any ``n_train``)."""
    if config["burn_in_epochs"] < config["epochs"]:
        return None
    return f"burn_in_epochs must be below epochs ({config['epochs']}); got burn_in_epochs={config['burn_in_epochs']}"


def _samples_fit_after_burn_in(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """At most one sample per post-burn-in step (checked when ``n_train`` is known)."""
    if n_train is None:
        return None
    per_epoch = _steps_per_epoch(n_train, config)
    sampling = max(0, config["epochs"] - config["burn_in_epochs"]) * per_epoch
    if config["n_samples"] <= sampling:
        return None
    return (
        f"n_samples must be at most the {sampling} post-burn-in steps ((epochs − burn_in_epochs) × {per_epoch} "
        f"steps per epoch of {n_train} examples at batch_size {config['batch_size']}); got n_samples={config['n_samples']}"
    )


def _samples_fit_cycle(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """At most one sample per sampling step of a cycle (checked when ``n_train`` is known)."""
    if n_train is None:
        return None
    cycle, first_noisy = _cycle(n_train, config)
    if config["samples_per_cycle"] <= cycle - first_noisy:
        return None
    return (
        f"samples_per_cycle must be at most the {cycle - first_noisy} sampling steps of a cycle ({cycle} steps: "
        f"epochs_per_cycle × {_steps_per_epoch(n_train, config)} steps per epoch of {n_train} examples at batch_size "
        f"{config['batch_size']}, the first {first_noisy} noise-free at exploration {config['exploration']}); "
        f"got samples_per_cycle={config['samples_per_cycle']}"
    )


CHAIN_CONSTRAINTS = (
    Constraint(("burn_in_epochs", "epochs"), "burn_in_epochs < epochs", _burn_in_below_epochs),
    Constraint(
        ("n_samples", "epochs", "burn_in_epochs", "batch_size"),
        "n_samples ≤ (epochs − burn_in_epochs) · ⌈N / batch_size⌉ (N training examples)",
        _samples_fit_after_burn_in,
    ),
)
"""SGLD's and SGHMC's rules: a burn-in shorter than the run, and no more samples than post-burn-in steps."""

CYCLE_CONSTRAINTS = (
    Constraint(
        ("samples_per_cycle", "epochs_per_cycle", "exploration", "batch_size"),
        "samples_per_cycle ≤ C − ⌈exploration · C⌉, C = epochs_per_cycle · ⌈N / batch_size⌉ steps per cycle",
        _samples_fit_cycle,
    ),
)
"""cSGLD's and cSGHMC's rule: no more samples per cycle than the cycle's sampling steps."""


StepPlan = tuple[int, Callable[[int], float], Callable[[int], bool], list[int]]
"""(total steps, step → lr, step → noisy?, sorted 1-based steps after which a sample is taken):
:meth:`_SGMCMC.plan`."""


class _SGMCMC(Method):
    """One class for the four samplers; ``momentum`` selects SGHMC, ``cyclical`` the cSG variants.  On a
    network that cannot be batched the chains run one after another (:meth:`sample_posterior`)."""

    chains_in_turn_when_unbatchable = True

    def __init__(
        self,
        name: str,
        description: str,
        hyperparameters: tuple[Hyperparameter, ...],
        *,
        momentum: bool,
        cyclical: bool,
    ):
        self.name = name
        self.description = description
        self.hyperparameters = hyperparameters
        self.constraints = CYCLE_CONSTRAINTS if cyclical else CHAIN_CONSTRAINTS
        self.momentum = momentum
        self.cyclical = cyclical

    def sample_plan(self, config: Mapping[str, Any], problem: Problem) -> SamplePlan:
        """S = ``n_samples`` per chain of C = ``n_chains`` (SGLD, SGHMC); S = ``n_cycles`` ×
        ``samples_per_cycle`` of one chain (cSGLD, cSGHMC)."""
        if self.cyclical:
            return SamplePlan(config["n_cycles"] * config["samples_per_cycle"])
        return SamplePlan(config["n_samples"], config["n_chains"])

    def warm_up(self, device: torch.device) -> None:
        """Compile the noise and momentum kernels on ``device`` and import ArviZ (the R̂ of ``n_chains``;
        about 2 s), see :class:`~ursa_ray.methods.base.Method`."""
        warm_up_kernels(device)
        warm_up_diagnostics()

    def plan(self, n_train: int, config: Mapping[str, Any]) -> StepPlan:
        """(total steps, step → lr, step → noisy?, sorted 1-based steps after which a sample is taken).

        ValueError when ``config`` violates one of the method's constraints for ``n_train`` examples.
        """
        check_constraints(self, config, n_train)
        steps_per_epoch = _steps_per_epoch(n_train, config)
        lr = config["lr"]
        if not self.cyclical:
            epochs, burn_in, n = config["epochs"], config["burn_in_epochs"], config["n_samples"]
            total = epochs * steps_per_epoch
            sampling = total - burn_in * steps_per_epoch
            spacing = sampling // n
            samples = [total - (n - 1 - j) * spacing for j in range(n)]
            schedule = cosine_lr if config["schedule"] == "cosine" else constant_lr
            return total, (lambda k: schedule(lr, k, total)), (lambda k: True), samples
        cycle, first_noisy = _cycle(n_train, config)  # first_noisy: in-cycle index of the first sampling step
        total = config["n_cycles"] * cycle
        sampling = cycle - first_noisy
        per_cycle = config["samples_per_cycle"]
        spacing = min(steps_per_epoch, sampling // per_cycle)
        samples = [
            (c + 1) * cycle - (per_cycle - 1 - j) * spacing for c in range(config["n_cycles"]) for j in range(per_cycle)
        ]
        return total, (lambda k: cyclical_lr(lr, k, cycle)), (lambda k: k % cycle >= first_noisy), samples

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        n_chains = config.get("n_chains", 1)
        if n_chains == 1:
            yield from self._one_chain(problem, config, stats)
            return
        first = problem.make_model()
        if can_batch(first, problem):
            for item in self._chains([problem], config, [stats], first):
                yield item[0]
            return
        # too large to batch: the chains one after another, each with its own generator
        trace = ChainTrace(problem.x, n_chains)
        stats["grad_evals"] = 0.0
        pooled = 0
        for c, generator in enumerate(copy_generators(problem, n_chains)):
            own: dict[str, float] = {}
            chain_problem = dataclasses.replace(problem, generator=generator)
            if c == 0:
                chain_problem = dataclasses.replace(chain_problem, make_model=_once(first, problem.make_model))
                first = None  # the chain holds it from here
            for predictor in self._one_chain(chain_problem, config, own):
                trace.record(c, predictor)
                pooled += 1
                stats["n_samples"] = pooled
                yield predictor
            stats["grad_evals"] += own["grad_evals"]
        stats.update(trace.summary())

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """Networks trained side by side per seed: the chains."""
        return config.get("n_chains", 1)

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's ``n_chains`` chains as one batched computation; each item holds one sample per
        problem (at each sampling step, chain 1's, then chain 2's, ...)."""
        yield from self._chains(problems, config, stats, None)

    def _one_chain(self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]) -> Iterator[Predictor]:
        """One chain on the problem's own generator, the network's own forward pass (:class:`LangevinChain`):
        :func:`sample_chains` with C = 1."""
        plan = self.plan(problem.n_train, config)
        chain = LangevinChain(problem.make_model(), problem, config, momentum=self.momentum)
        for (model,) in sample_chains(chain, problem.minibatches, [problem], config, plan, [stats]):
            yield model

    def _chains(
        self,
        problems: Sequence[Problem],
        config: Mapping[str, Any],
        stats: Sequence[dict[str, float]],
        first: torch.nn.Module | None,
    ) -> Iterator[list[Predictor]]:
        """C = ``n_chains`` chains per problem as batched copies (:class:`LangevinCopies`) through
        :func:`sample_chains`.  One chain per problem uses the problem's own generator (the single-chain
        stream, :meth:`_one_chain`); more use :func:`~ursa_ray.methods.batched.copy_generators`."""
        n_chains = config.get("n_chains", 1)
        plan = self.plan(problems[0].n_train, config)
        owners = [k for k in range(len(problems)) for _ in range(n_chains)]
        generators = [
            g
            for problem in problems
            for g in ([problem.generator] if n_chains == 1 else copy_generators(problem, n_chains))
        ]
        models = [first if (first is not None and c == 0) else problems[k].make_model() for c, k in enumerate(owners)]
        chains = LangevinCopies(models, generators, problems[0], config, momentum=self.momentum)
        data = CopyData.from_problems([problems[k] for k in owners], generators, [None] * len(owners))
        yield from sample_chains(chains, data.minibatches, problems, config, plan, stats)


def _once(model: torch.nn.Module, make_model: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """``make_model`` that returns ``model`` on its first call (a network already built), fresh ones after."""
    built = [model]
    return lambda: built.pop() if built else make_model()


def sample_chains(
    chains: LangevinChain | LangevinCopies,
    minibatches: Callable[[int], Iterable[tuple[Tensor, Tensor]]],
    problems: Sequence[Problem],
    config: Mapping[str, Any],
    plan: StepPlan,
    stats: Sequence[dict[str, float]],
) -> Iterator[list[nn.Module]]:
    """The one SG-MCMC loop, of a lone chain (:class:`LangevinChain`, C = 1) and of batched copies
    (:class:`LangevinCopies`): whole epochs of ``minibatches(batch_size)``, step k at the plan's lr and noise.

    ``chains.networks`` are C = len(networks) / len(problems) chains of each problem, problem k's chain c at
    k·C + c.  At each of the plan's sampling steps it yields C items, chain 1's network of every problem,
    then chain 2's, ... (live views of the chains, consumed before the next step), and sets each problem's
    ``stats``: ``n_samples`` and ``grad_evals`` (mini-batch gradient evaluations of all its chains), with
    C > 1 also R̂ and ESS at the end (:class:`~ursa_ray.methods.chains.ChainTrace`).  Finiteness is checked
    before every sample and at the end of every epoch (of every few epochs when they are under 32 steps).
    """
    total, lr_at, noisy_at, sample_steps = plan
    networks = chains.networks
    n_chains = len(networks) // len(problems)
    traces = [ChainTrace(problem.x, n_chains) for problem in problems] if n_chains > 1 else []
    for one in stats:
        one["n_samples"] = 0
        one["grad_evals"] = 0.0
    step = next_sample = checked = 0
    epochs = total // _steps_per_epoch(problems[0].n_train, config)
    chains.train(True)
    for epoch in range(epochs):
        for xb, yb in minibatches(config["batch_size"]):
            loss = chains.step(xb, yb, lr_at(step), noisy_at(step))
            step += 1
            if next_sample < len(sample_steps) and step == sample_steps[next_sample]:
                chains.check_finite(loss, f"at step {step} (epoch {epoch + 1})")
                checked = step
                next_sample += 1
                chains.train(False)
                for c in range(n_chains):
                    item = [networks[k * n_chains + c] for k in range(len(problems))]
                    for trace, predictor in zip(traces, item):
                        trace.record(c, predictor)
                    for one in stats:
                        one["n_samples"] = (next_sample - 1) * n_chains + c + 1
                        one["grad_evals"] = float(step * n_chains)
                    yield item
                chains.train(True)
        if step - checked >= 32 or epoch == epochs - 1:  # every epoch, unless epochs are tiny
            chains.check_finite(loss, f"in epoch {epoch + 1}")
            checked = step
    for one, trace in zip(stats, traces or [None] * len(stats)):
        one["grad_evals"] = float(step * n_chains)
        if trace is not None:
            one.update(trace.summary())


@dataclasses.dataclass
class LangevinState:
    """C SG-MCMC chains: positions θ (C, P), SGHMC's velocities v (C, P) (None for SGLD), chain c's noise
    stream ``noise[c]``, and the steps taken."""

    theta: Tensor
    velocity: Tensor | None
    noise: list[GaussianNoise]
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class LangevinUpdate:
    """The SGLD (``friction`` None) or SGHMC update of the module docstring on a (C, P) state, written once
    for a lone chain (C = 1) and batched copies: :meth:`init` and :meth:`update`, the shape of a sampler in
    normal-computing/posteriors (``init(params)``, ``update(state, batch)``), with the gradient of the
    mini-batch's mean loss passed in (each caller has its own forward pass) and the step size with it (the
    schedule is the plan's).

    ``decay`` = 1 / (N·prior_std²): the prior's gradient θ/σ² times η = lr/N, per unit lr."""

    n_train: int
    decay: float
    temperature: float
    friction: float | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], n_train: int, *, momentum: bool) -> LangevinUpdate:
        """From ``prior_std``, ``temperature`` and, for SGHMC (``momentum``), ``alpha``."""
        friction = config["alpha"] if momentum else None
        return cls(n_train, 1.0 / (n_train * config["prior_std"] ** 2), config["temperature"], friction)

    def init(self, theta: Tensor, generators: Sequence[torch.Generator]) -> LangevinState:
        """The state at positions ``theta`` (C, P; updated in place from here on), velocities 0; chain c's
        noise key is drawn from ``generators[c]`` once, here (:class:`GaussianNoise`)."""
        noise = [GaussianNoise(theta[c], generator) for c, generator in enumerate(generators)]
        velocity = None if self.friction is None else torch.zeros_like(theta)
        return LangevinState(theta, velocity, noise)

    def update(self, state: LangevinState, grad: Tensor, lr: float, noisy: bool = True) -> LangevinState:
        """One step of every chain at per-example step size ``lr`` (η = lr / N) from ``grad`` (C, P), the
        gradient of the mini-batch's mean negative log-likelihood (the prior's share is added here), with the
        Langevin noise when ``noisy``.  In place on ``state.theta`` and ``state.velocity`` (posteriors'
        ``inplace=True``: the networks are views of θ); returns ``state``."""
        theta, velocity = state.theta, state.velocity
        friction = 1.0 if self.friction is None else self.friction
        sigma = langevin_noise_std(lr / self.n_train, self.temperature, friction) if noisy else 0.0
        decay = lr * self.decay
        with torch.no_grad():
            if velocity is None:
                # θ ← θ − η∇Ũ + √(2ηT)ξ with η = lr/N (the prior's share of ∇Ũ as the shrink)
                if sigma > 0.0:
                    for c, noise in enumerate(state.noise):
                        noise.add_to_(theta[c], sigma, shrink=1.0 - decay, grad=grad[c], lr=lr)
                else:
                    theta.mul_(1.0 - decay).add_(grad, alpha=-lr)
            else:
                # v ← (1−α)v − η∇Ũ + √(2αηT)ξ ;  θ ← θ + v
                keep = 1.0 - self.friction
                for c, noise in enumerate(state.noise):
                    if sigma > 0.0:
                        noise.momentum_step_(theta[c], velocity[c], grad[c], sigma, keep, lr, decay)
                    else:
                        momentum_step_(theta[c], velocity[c], grad[c], keep, lr, decay)
        state.steps += 1
        return state


class LangevinChain:
    """One SGLD chain (``momentum`` False) or SGHMC chain on ``model``'s parameters: :class:`LangevinUpdate`
    on the (1, P) state of the network's flat parameters (:class:`FlatModel`), the gradient from the
    network's own forward pass.  The lone chain of :func:`sample_chains` and the teacher of posterior
    distillation (:mod:`ursa_ray.methods.distillation`).

    ``config`` supplies ``prior_std``, ``temperature`` and, for SGHMC, ``alpha``.  The noise key is drawn
    from ``problem.generator`` once, here.  ``model`` must be in training mode while it steps.  The forward
    pass runs in ``problem.training_precision`` (:func:`~ursa_ray.methods._training.autocast_body`); θ, its
    gradient, the velocity and the injected noise stay in the parameters' dtype (float32 master weights).
    """

    def __init__(self, model: torch.nn.Module, problem: Problem, config: Mapping[str, Any], *, momentum: bool):
        self.model = model
        self.networks = [model]
        self.flat = FlatModel(model)
        self.rule = LangevinUpdate.from_config(config, problem.n_train, momentum=momentum)
        self.state = self.rule.init(self.flat.theta.view(1, -1), [problem.generator])
        self.nll = problem.likelihood.nll
        self.device, self.precision = problem.device, problem.training_precision

    @property
    def steps(self) -> int:
        return self.state.steps

    def step(self, xb: Tensor, yb: Tensor, lr: float, noisy: bool = True) -> Tensor:
        """One update on the mini-batch (``xb``, ``yb``) at per-example step size ``lr`` (η = lr / N), with the
        Langevin noise when ``noisy``; returns the mini-batch's mean loss (detached)."""
        with torch.enable_grad():
            with autocast_body(self.device, self.precision):
                loss = self.nll(self.model(xb).float(), yb)
            self.flat.zero_grad()
            loss.backward()
        if self.state.steps == 0:
            self.flat.check_grad_views()
        self.rule.update(self.state, self.flat.grad.view(1, -1), lr, noisy)
        return loss.detach()

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    def check_finite(self, loss: Tensor, where: str) -> None:
        """Raise FloatingPointError when the loss or any parameter is NaN or infinite."""
        self.flat.check_finite(loss, where)


class LangevinCopies:
    """:class:`LangevinUpdate` on C copies trained as one batched computation
    (:class:`~ursa_ray.methods.batched.StackedNetworks`): one forward and backward pass of all copies, then
    each copy's update on its own row of θ with its own noise stream (keyed from the copy's generator,
    before its first mini-batch, as :class:`LangevinChain` keys a lone chain).  The forward pass runs in
    ``problem.training_precision``, as :class:`LangevinChain`'s."""

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        generators: Sequence[torch.Generator],
        problem: Problem,
        config: Mapping[str, Any],
        *,
        momentum: bool,
    ):
        self.stacked = StackedNetworks(models)
        self.networks = self.stacked.models
        self.rule = LangevinUpdate.from_config(config, problem.n_train, momentum=momentum)
        self.state = self.rule.init(self.stacked.theta, generators)
        self.nll = batched_nll(problem.likelihood)
        self.device, self.precision = problem.device, problem.training_precision

    def step(self, xb: Tensor, yb: Tensor, lr: float, noisy: bool = True) -> Tensor:
        """One update of every copy on its own mini-batch (``xb`` (C, B, ...), ``yb`` (C, B)); returns the
        copies' mean losses (C,), detached."""
        self.stacked.zero_grad()
        with torch.enable_grad():
            with autocast_body(self.device, self.precision):
                losses = self.nll(self.stacked(xb).float(), yb)
            losses.sum().backward()
        self.rule.update(self.state, self.stacked.theta.grad, lr, noisy)
        return losses.detach()

    def train(self, mode: bool = True) -> None:
        self.stacked.train(mode)

    def check_finite(self, losses: Tensor, where: str) -> None:
        """Raise FloatingPointError when a copy's loss or any parameter is NaN or infinite."""
        if not bool(torch.isfinite(losses).all()):
            raise FloatingPointError(f"loss became {losses.tolist()} {where}")
        if not bool(torch.isfinite(self.stacked.theta).all()):
            raise FloatingPointError(f"parameters became non-finite {where}")


METHODS = (
    _SGMCMC(
        "sgld",
        "SGLD (Welling & Teh 2011): θ ← θ − η∇Ũ + √(2ηT)ξ, η = lr/N; samples after burn-in",
        _common(lr=0.1, prior_std=0.17) + _chain("constant"),
        momentum=False,
        cyclical=False,
    ),
    _SGMCMC(
        "sghmc",
        "SGHMC (Chen et al. 2014): v ← (1−α)v − η∇Ũ + √(2αηT)ξ, θ ← θ + v; samples after burn-in",
        _common(lr=0.03, prior_std=0.14) + (_alpha(0.1),) + _chain("cosine"),
        momentum=True,
        cyclical=False,
    ),
    _SGMCMC(
        "csgld",
        "cyclical SGLD (Zhang et al. 2020): cosine step-size cycles, SGD exploration then SGLD sampling",
        _common(lr=0.06, prior_std=0.18) + _cycles(epochs_per_cycle=21, samples_per_cycle=3),
        momentum=False,
        cyclical=True,
    ),
    _SGMCMC(
        "csghmc",
        "cyclical SGHMC (Zhang et al. 2020): cosine step-size cycles, momentum-SGD exploration then SGHMC",
        _common(lr=0.07, prior_std=0.33) + (_alpha(0.21),) + _cycles(epochs_per_cycle=22, samples_per_cycle=4),
        momentum=True,
        cyclical=True,
    ),
)
