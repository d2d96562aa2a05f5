"""Full-batch Hamiltonian Monte Carlo (Neal 2011) with dual-averaging step-size adaptation.

Target π_T(θ) ∝ exp(−U(θ)/T), U(θ) = −Σ_{i=1..N} log p(y_i | x_i, θ) + ‖θ‖² / (2 prior_std²) on the
whole training set (resident on the device; ``problem.augment`` is not applied -- HMC needs one fixed
target): ``temperature`` T tempers the whole posterior, prior included.  Momentum r ~ N(0, m I) with a
scalar ``mass`` m, H(θ, r) = U(θ)/T + ‖r‖²/(2m).  Each iteration draws r, runs ``n_leapfrog`` leapfrog
steps of size ε (jittered uniformly in ε·[1 − j, 1 + j], Neal §5.4.2.2), and accepts the end point with
probability min(1, exp(H₀ − H₁)) (a non-finite H₁ -- a divergent trajectory -- is a rejection).  During
the ``burn_in`` iterations, when ``adapt_step_size`` is set, ε is tuned by the dual averaging of Hoffman
& Gelman (2014, Alg. 5; γ = 0.05, t₀ = 10, κ = 0.75, μ = log 10ε₀) towards the acceptance probability
``target_accept``, after an initial search doubling or halving ε until a one-step acceptance crosses 1/2
(their Alg. 4); sampling uses the averaged ε̄.  Every post-burn-in iteration yields one sample (the
current state, repeated on rejection).

H is accumulated in float64 (:func:`make_potential`, :func:`hamiltonian`): the per-example
log-likelihoods (float32, from the network) are summed in float64, and ‖θ‖² and ‖r‖² are sums of exact
float64 squares of the float32 coordinates.  With 2×10⁵ parameters ‖r‖²/2 is about 10⁵, where float32's
spacing is 0.008, and float32 sums moved the log acceptance ratio H₀ − H₁ by up to about 0.04.  Gradients
and the leapfrog updates stay float32.

The state is one flat parameter vector; the network's parameters are views of a second flat vector into
which each evaluation copies the position (:func:`make_potential`), and the leapfrog updates are
in-place vector operations.
``stats``: ``n_samples``, ``grad_evals`` (full-batch gradients), ``accept_rate`` (fraction of
post-burn-in proposals accepted), ``burn_in_accept_rate``, ``divergences`` and the final ``step_size``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from ursa_ray.methods._sgmcmc_kernels import FlatModel
from ursa_ray.methods.base import (
    Hyperparameter,
    Predictor,
    Problem,
    flat_parameters,
    load_flat_parameters,
    sample_networks_storage,
)


def make_potential(
    problem: Problem, model: torch.nn.Module, prior_std: float, temperature: float
) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """θ ↦ (∇U(θ)/T, U(θ)/T) for a flat parameter vector θ (order of ``model.parameters()``); the
    gradient has θ's dtype, the value is a float64 scalar.

    The parameters of ``model`` are re-seated as views of one flat vector (:class:`FlatModel`); an
    evaluation copies θ into it, runs the network on the whole training set, sums the per-example
    negative log-likelihoods in float64 and back-propagates that sum into the flat gradient, then adds the
    prior's θ/σ² to the gradient and ‖θ‖²/(2σ²) (:func:`squared_norm`, float64) to the value.  Measured
    on the digits MLP (full batch, one CPU thread, best of 25 interleaved rounds) the flat-vector
    evaluation costs 1.01× a plain ``nn.Module`` forward + backward pass, against 1.10× for
    ``torch.func.functional_call`` on views of θ with ``torch.autograd.grad`` (more with
    ``torch.func.grad_and_value``), so it is what HMC uses.  Summing the per-example terms in float64
    rather than taking the fused float32 loss changed that cost by less than the timing noise (5 %).
    """
    flat = FlatModel(model)
    x, y, log_prob = problem.x, problem.y, problem.likelihood.log_prob
    precision = 1.0 / prior_std**2

    def grad_and_value(theta: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            flat.theta.copy_(theta)
        flat.zero_grad()
        with torch.enable_grad():
            nll = -log_prob(model(x), y).sum(dtype=torch.float64)
            nll.backward()
        with torch.no_grad():
            grad = flat.grad.add(theta, alpha=precision)
            value = nll.detach() + 0.5 * precision * squared_norm(theta)
            if temperature != 1.0:
                grad.div_(temperature)
                value = value / temperature
        return grad, value

    return grad_and_value


def squared_norm(vector: Tensor) -> Tensor:
    """‖v‖² = Σ v_i² as a float64 scalar: each float32 coordinate is cast (exactly) to float64 first, so
    every square is exact and only the float64 sum rounds."""
    wide = vector.to(torch.float64)
    return wide.dot(wide)


def hamiltonian(potential: Tensor, momentum: Tensor, mass: float) -> Tensor:
    """H(θ, r) = U(θ)/T + ‖r‖²/(2m), float64, from the float64 ``potential`` U(θ)/T of
    :func:`make_potential` and the momentum r."""
    return potential + squared_norm(momentum) / (2 * mass)


def acceptance_probability(h_start: Tensor, h_end: Tensor) -> float:
    """The Metropolis-Hastings acceptance probability min(1, exp(H₀ − H₁)) of a trajectory from H₀ to
    H₁ (Neal 2011); 0 when H₁ is not finite (a divergent trajectory)."""
    log_ratio = float(h_start - h_end)
    return 0.0 if not math.isfinite(log_ratio) else math.exp(min(0.0, log_ratio))


class DualAveraging:
    """Hoffman & Gelman (2014), Algorithm 5: adapts log ε so the mean acceptance tends to ``target``."""

    def __init__(self, step_size: float, target: float, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75):
        self.mu = math.log(10.0 * step_size)
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.h_bar = 0.0
        self.log_eps_bar = 0.0
        self.m = 0

    def update(self, accept_prob: float) -> float:
        """Record one iteration's acceptance probability; return the next step size."""
        self.m += 1
        m = self.m
        w = 1.0 / (m + self.t0)
        self.h_bar = (1.0 - w) * self.h_bar + w * (self.target - accept_prob)
        log_eps = self.mu - math.sqrt(m) / self.gamma * self.h_bar
        eta = m ** (-self.kappa)
        self.log_eps_bar = eta * log_eps + (1.0 - eta) * self.log_eps_bar
        return math.exp(log_eps)

    @property
    def final_step_size(self) -> float:
        return math.exp(self.log_eps_bar)


class HMC:
    name = "hmc"
    description = "full-batch HMC: leapfrog + Metropolis-Hastings, dual-averaging step size during burn-in"
    hyperparameters = (
        Hyperparameter("step_size", float, 2e-4, "leapfrog step ε (initial value when adapted)", low=1e-12),
        Hyperparameter("n_leapfrog", int, 40, "leapfrog steps per trajectory (path length L·ε)", low=1),
        Hyperparameter("n_samples", int, 100, "post-burn-in iterations, one sample each", low=1),
        Hyperparameter("burn_in", int, 200, "iterations before the first sample (step-size adaptation)", low=0),
        Hyperparameter("prior_std", float, 0.1, "std of the Gaussian prior N(0, prior_std² I)", low=1e-6),
        Hyperparameter(
            "temperature",
            float,
            1.0,
            "posterior temperature T: target ∝ exp(−U/T), the whole posterior (prior included) tempered",
            low=1e-6,
        ),
        Hyperparameter("mass", float, 1.0, "scalar mass m: momentum ~ N(0, m I)", low=1e-12),
        Hyperparameter("adapt_step_size", bool, True, "dual-averaging adaptation of ε during burn-in"),
        Hyperparameter(
            "target_accept", float, 0.8, "acceptance probability aimed at by the adaptation", low=0.05, high=0.99
        ),
        Hyperparameter(
            "step_jitter", float, 0.1, "ε drawn uniformly from ε·[1 − j, 1 + j] each iteration", low=0.0, high=0.9
        ),
    )
    constraints = ()  # no rule between its hyperparameters beyond their own ranges
    posterior_storage = staticmethod(sample_networks_storage)  # the S kept states

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        model = problem.make_model()
        model.eval()
        potential = make_potential(problem, model, config["prior_std"], config["temperature"])
        theta = flat_parameters(model).clone()
        mass, n_leapfrog, jitter = config["mass"], config["n_leapfrog"], config["step_jitter"]
        seed = int(torch.randint(0, 2**62, (1,), generator=problem.generator))
        gen = torch.Generator(device=theta.device)
        gen.manual_seed(seed)
        uniforms = torch.Generator().manual_seed(seed + 1)  # CPU draws for jitter and accept tests

        grad, u = potential(theta)
        grad_evals = 1
        if not (bool(torch.isfinite(u)) and bool(torch.isfinite(grad).all())):
            raise FloatingPointError(f"the potential at the initial parameters is {u.item()}")
        momentum = torch.empty_like(theta)

        def uniform() -> float:
            return float(torch.rand((), generator=uniforms, dtype=torch.float64))

        def transition(eps: float, steps: int) -> tuple[Tensor, Tensor, Tensor, float]:
            """One HMC proposal from (θ, ∇U, U); returns the new state and the acceptance probability."""
            nonlocal grad_evals
            momentum.normal_(generator=gen).mul_(math.sqrt(mass))
            h0 = hamiltonian(u, momentum, mass)
            q = theta.clone()
            p = momentum.add(grad, alpha=-0.5 * eps)
            g_new, u_new = grad, u
            for i in range(steps):
                q.add_(p, alpha=eps / mass)
                g_new, u_new = potential(q)
                grad_evals += 1
                p.add_(g_new, alpha=-eps if i < steps - 1 else -0.5 * eps)
            return q, g_new, u_new, acceptance_probability(h0, hamiltonian(u_new, p, mass))

        eps = config["step_size"]
        adapter = None
        if config["adapt_step_size"] and config["burn_in"] > 0:
            eps = self._initial_step_size(eps, transition)
            adapter = DualAveraging(eps, config["target_accept"])

        accepted = {"burn_in": 0, "sampling": 0}
        divergences = 0
        total = config["burn_in"] + config["n_samples"]
        stats["n_samples"] = 0
        for it in range(total):
            burning = it < config["burn_in"]
            eps_it = eps * (1.0 + jitter * (2.0 * uniform() - 1.0)) if jitter > 0 else eps
            q, g_new, u_new, accept_prob = transition(eps_it, n_leapfrog)
            if accept_prob == 0.0 and not bool(torch.isfinite(u_new)):
                divergences += 1
            if uniform() < accept_prob:
                theta, grad, u = q, g_new, u_new
                accepted["burn_in" if burning else "sampling"] += 1
            if burning and adapter is not None:
                eps = adapter.update(accept_prob)
                if it == config["burn_in"] - 1:
                    eps = adapter.final_step_size
            if not burning:
                if not bool(torch.isfinite(theta).all()):
                    raise FloatingPointError("HMC state became non-finite")
                load_flat_parameters(model, theta)
                stats["n_samples"] = it - config["burn_in"] + 1
                stats["grad_evals"] = float(grad_evals)
                stats["accept_rate"] = accepted["sampling"] / (it - config["burn_in"] + 1)
                stats["burn_in_accept_rate"] = accepted["burn_in"] / max(config["burn_in"], 1)
                stats["divergences"] = float(divergences)
                stats["step_size"] = eps
                yield model
        stats["grad_evals"] = float(grad_evals)

    @staticmethod
    def _initial_step_size(
        eps: float, transition: Callable[[float, int], tuple[Tensor, Tensor, Tensor, float]]
    ) -> float:
        """Hoffman & Gelman (2014), Algorithm 4: double or halve ε until a one-step acceptance crosses 1/2."""
        _, _, _, prob = transition(eps, 1)
        direction = 1.0 if prob > 0.5 else -1.0
        for _ in range(100):
            new_eps = eps * 2.0**direction
            _, _, _, prob = transition(new_eps, 1)
            if (direction > 0 and prob <= 0.5) or (direction < 0 and prob > 0.5):
                return new_eps if direction < 0 else eps
            eps = new_eps
        return eps


METHODS = (HMC(),)
