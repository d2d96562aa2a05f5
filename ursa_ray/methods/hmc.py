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

HMC trains in float32 whatever ``problem.training_precision`` says (the other methods' mixed precision,
:mod:`~ursa_ray.methods._training`).  With the potential's network under bfloat16 autocast, U carries a
rounding error that the Metropolis-Hastings test sees: on the 256-example Bayesian linear regression of
``tests/exact_blr.py`` (CPU autocast) U_bf16 − U differed by 0.14 nats (std over exact posterior draws),
an error growing like √N with the training set; the dual averaging then shrank ε from 0.027 to 10⁻⁴ and
the chain's marginal stds came out at 1–3 % of the exact ones, where float32 passes the exact-posterior
check.  ``tests/test_mixed_training.py`` checks that HMC ignores the setting.

The state is one flat parameter vector per chain, the rows of a (C, P) tensor (:func:`run_chains`); the
leapfrog updates are in-place (C, P) operations with a per-row step size.  One chain's potential is the
flat-vector evaluation of :func:`make_potential` (the network's parameters views of a second flat vector
into which each evaluation copies the position); several chains of one small network -- ``n_chains`` of
one problem, or the chains of several problems in :meth:`HMC.sample_posterior_batched` -- share one
``vmap``'d forward and backward pass (:func:`stacked_potential`).  Every chain keeps its own random
streams, step size, dual averaging and Metropolis-Hastings test, so it samples what it would alone.

``n_chains`` = C > 1 runs C chains of the problem, each from its own ``problem.make_model()`` and with
its own generator (:func:`~ursa_ray.methods.batched.copy_generators`), and pools their samples: each
post-burn-in iteration yields chain 1's state, then chain 2's, ...  ``stats`` then sums ``grad_evals``
and ``divergences`` over the chains, averages ``accept_rate``, ``burn_in_accept_rate`` and ``step_size``,
and adds the rank-normalised split-R̂ and bulk ESS of the chains' outputs on the first training inputs
(:class:`~ursa_ray.methods.chains.ChainTrace`: ``n_chains``, ``rhat_max``, ``ess_bulk_min``).
``stats``: ``n_samples`` (all chains'), ``grad_evals`` (full-batch gradients), ``accept_rate`` (fraction of
post-burn-in proposals accepted), ``burn_in_accept_rate``, ``divergences`` and the final ``step_size``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from ursa_ray.methods._sgmcmc_kernels import FlatModel
from ursa_ray.methods.base import (
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    flat_parameters,
    load_flat_parameters,
    sample_networks_storage,
)
from ursa_ray.methods.batched import MAX_BATCHED_PARAMETERS, StackedNetworks, copy_generators
from ursa_ray.methods.chains import ChainTrace


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


BatchedPotential = Callable[[Tensor], tuple[Tensor, Tensor]]
"""q (C, P) ↦ (∇U_c(q_c)/T rows (C, P) in q's dtype, U_c(q_c)/T (C,) float64): C chains' potentials."""


def squared_norms(rows: Tensor) -> Tensor:
    """‖v_c‖² of every row of ``rows`` (C, P) as float64 (C,): each float32 coordinate cast exactly to
    float64 and squared there, as :func:`squared_norm` does for one vector."""
    wide = rows.to(torch.float64)
    return wide.square_().sum(1)


def looped_potential(
    problems: Sequence[Problem], models: Sequence[nn.Module], prior_std: float, temperature: float
) -> BatchedPotential:
    """C chains' potentials evaluated one after another, each by its own :func:`make_potential` (the
    flat-vector evaluation, the cheapest for one chain): the unbatched path, and the fallback for networks
    that cannot be stacked."""
    potentials = [make_potential(p, m, prior_std, temperature) for p, m in zip(problems, models, strict=True)]
    if len(potentials) == 1:
        (only,) = potentials

        def one(q: Tensor) -> tuple[Tensor, Tensor]:
            grad, value = only(q[0])
            return grad.unsqueeze(0), value.unsqueeze(0)

        return one

    def each(q: Tensor) -> tuple[Tensor, Tensor]:
        results = [potential(row) for potential, row in zip(potentials, q, strict=True)]
        return torch.stack([g for g, _ in results]), torch.stack([u for _, u in results])

    return each


def stacked_potential(
    stacked: StackedNetworks, problems: Sequence[Problem], prior_std: float, temperature: float
) -> BatchedPotential:
    """C chains' potentials as one batched computation: one ``vmap(functional_call)`` forward of every
    copy on its own problem's whole training set (the inputs shared, not stacked, when the copies' problems
    have the same ones), each copy's negative log-likelihood summed in float64 as :func:`make_potential`
    does, and one backward pass of Σ_c U_c (∂/∂q_c of the sum is copy c's own gradient)."""
    first = problems[0].x
    shared = all(p.x is first or (p.x.shape == first.shape and bool(torch.equal(p.x, first))) for p in problems)
    x = problems[0].x if shared else torch.stack([p.x for p in problems])
    y = torch.stack([p.y for p in problems])
    log_prob, template = problems[0].likelihood.log_prob, stacked.template
    precision = 1.0 / prior_std**2

    def nll(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return -log_prob(functional_call(template, params, (x,)), y).sum(dtype=torch.float64)

    nlls = vmap(nll, in_dims=(0, None if shared else 0, 0))

    def grad_and_value(q: Tensor) -> tuple[Tensor, Tensor]:
        q = q.detach().requires_grad_(True)
        with torch.enable_grad():
            values = nlls(stacked.parameters_of(q), x, y)
            (grad,) = torch.autograd.grad(values.sum(), q)
        with torch.no_grad():
            q = q.detach()
            grad = grad.add_(q, alpha=precision)
            values = values.detach() + 0.5 * precision * squared_norms(q)
            if temperature != 1.0:
                grad.div_(temperature)
                values = values / temperature
        return grad, values

    return grad_and_value


def stackable(models: Sequence[nn.Module], problems: Sequence[Problem]) -> bool:
    """Whether chains of ``models`` can share one batched potential (:func:`stacked_potential`): more than
    one chain, no buffers, no channels-last parameters (a stacked row is split in logical order), at most
    :data:`~ursa_ray.methods.batched.MAX_BATCHED_PARAMETERS` parameters, every problem with the same
    number of training examples on one device and the same likelihood (the stacked potential uses one)."""
    params = list(models[0].parameters())
    return (
        len(models) > 1
        and not list(models[0].buffers())
        and all(p.is_contiguous() for p in params)
        and sum(p.numel() for p in params) <= MAX_BATCHED_PARAMETERS
        and len({(p.n_train, p.x.device, p.likelihood) for p in problems}) == 1
    )


def run_chains(
    potential: BatchedPotential,
    models: Sequence[nn.Module],
    seeds: Sequence[int],
    config: Mapping[str, Any],
    chain_stats: Sequence[dict[str, float]],
    publish: Callable[[Tensor], None],
) -> Iterator[int]:
    """C HMC chains (see the module docstring) advanced together, chain c from its model's parameters.

    Chain c draws its momenta from a generator seeded with ``seeds[c]`` on the parameters' device and its
    jitter and accept uniforms from a CPU generator seeded with ``seeds[c] + 1``, in the order a chain run
    alone draws them; its step size, step-size search, dual averaging and Metropolis-Hastings test are its
    own.  The leapfrog updates are (C, P) tensor operations with a per-row step size; ``potential``
    evaluates every chain at once.  After each post-burn-in iteration ``publish(θ)`` puts the (C, P) states
    into the models, ``chain_stats[c]`` is updated and the iteration's index (from 0) is yielded."""
    n_chains = len(models)
    theta = torch.stack([flat_parameters(m) for m in models])
    device, dtype = theta.device, theta.dtype
    mass, n_leapfrog, jitter = config["mass"], config["n_leapfrog"], config["step_jitter"]
    burn_in = config["burn_in"]
    gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    uniforms = [torch.Generator().manual_seed(s + 1) for s in seeds]  # CPU draws for jitter and accept tests

    grad, u = potential(theta)
    grad_evals = [1] * n_chains
    if not (bool(torch.isfinite(u).all()) and bool(torch.isfinite(grad).all())):
        raise FloatingPointError(f"the potential at the initial parameters is {u.tolist()}")
    momentum = torch.empty_like(theta)
    everyone = [True] * n_chains

    def uniform(c: int) -> float:
        return float(torch.rand((), generator=uniforms[c], dtype=torch.float64))

    def transition(eps: list[float], steps: int, active: list[bool]) -> tuple[Tensor, Tensor, Tensor, list[float]]:
        """One HMC proposal of every chain from (θ, ∇U, U) with its own ε; the new states and the acceptance
        probabilities.  Inactive chains draw no momentum and their results are meaningless."""
        for c in range(n_chains):
            if active[c]:
                momentum[c].normal_(generator=gens[c])
            else:
                momentum[c].zero_()
        momentum.mul_(math.sqrt(mass))
        h0 = u + squared_norms(momentum) / (2 * mass)
        eps_t = torch.tensor(eps, dtype=torch.float64, device=device).unsqueeze(1)
        drift = (eps_t / mass).to(dtype)
        kick, half_kick = (-eps_t).to(dtype), (-0.5 * eps_t).to(dtype)
        q = theta.clone()
        p = torch.addcmul(momentum, grad, half_kick)
        g_new, u_new = grad, u
        for i in range(steps):
            q.addcmul_(p, drift)
            g_new, u_new = potential(q)
            p.addcmul_(g_new, kick if i < steps - 1 else half_kick)
        for c in range(n_chains):
            grad_evals[c] += steps if active[c] else 0
        h1 = u_new + squared_norms(p) / (2 * mass)
        probs = [
            acceptance_probability(a, b) if on else 0.0
            for a, b, on in zip(h0.tolist(), h1.tolist(), active, strict=True)
        ]
        return q, g_new, u_new, probs

    eps = [float(config["step_size"])] * n_chains
    adapters = None
    if config["adapt_step_size"] and burn_in > 0:
        eps = initial_step_sizes(eps, transition)
        adapters = [DualAveraging(e, config["target_accept"]) for e in eps]

    accepted = {"burn_in": [0] * n_chains, "sampling": [0] * n_chains}
    divergences = [0] * n_chains
    for it in range(burn_in + config["n_samples"]):
        burning = it < burn_in
        eps_it = [e * (1.0 + jitter * (2.0 * uniform(c) - 1.0)) for c, e in enumerate(eps)] if jitter > 0 else eps
        q, g_new, u_new, probs = transition(list(eps_it), n_leapfrog, everyone)
        finite = torch.isfinite(u_new).tolist()
        accept = []
        for c in range(n_chains):
            if probs[c] == 0.0 and not finite[c]:
                divergences[c] += 1
            accept.append(uniform(c) < probs[c])
            accepted["burn_in" if burning else "sampling"][c] += accept[c]
        if all(accept):
            theta, grad, u = q, g_new, u_new
        elif any(accept):
            mask = torch.tensor(accept, device=device)
            theta = torch.where(mask.unsqueeze(1), q, theta)
            grad = torch.where(mask.unsqueeze(1), g_new, grad)
            u = torch.where(mask, u_new, u)
        if burning and adapters is not None:
            eps = [adapter.update(prob) for adapter, prob in zip(adapters, probs, strict=True)]
            if it == burn_in - 1:
                eps = [adapter.final_step_size for adapter in adapters]
        if not burning:
            if not bool(torch.isfinite(theta).all()):
                raise FloatingPointError("HMC state became non-finite")
            publish(theta)
            done = it - burn_in + 1
            for c, stats in enumerate(chain_stats):
                stats["grad_evals"] = float(grad_evals[c])
                stats["accept_rate"] = accepted["sampling"][c] / done
                stats["burn_in_accept_rate"] = accepted["burn_in"][c] / max(burn_in, 1)
                stats["divergences"] = float(divergences[c])
                stats["step_size"] = eps[c]
            yield it - burn_in
    for c, stats in enumerate(chain_stats):
        stats["grad_evals"] = float(grad_evals[c])


def initial_step_sizes(
    eps: list[float], transition: Callable[[list[float], int, list[bool]], tuple[Tensor, Tensor, Tensor, list[float]]]
) -> list[float]:
    """Hoffman & Gelman (2014), Algorithm 4, for every chain at once: double or halve each chain's ε until
    its one-step acceptance crosses 1/2.  A chain whose search has ended draws nothing more."""
    eps = list(eps)
    _, _, _, probs = transition(eps, 1, [True] * len(eps))
    direction = [1.0 if prob > 0.5 else -1.0 for prob in probs]
    found: list[float | None] = [None] * len(eps)
    for _ in range(100):
        active = [f is None for f in found]
        if not any(active):
            break
        new_eps = [e * 2.0**d for e, d in zip(eps, direction, strict=True)]
        _, _, _, probs = transition(new_eps, 1, active)
        for c, on in enumerate(active):
            if not on:
                continue
            d, prob = direction[c], probs[c]
            if (d > 0 and prob <= 0.5) or (d < 0 and prob > 0.5):
                found[c] = new_eps[c] if d < 0 else eps[c]
            else:
                eps[c] = new_eps[c]
    return [e if f is None else f for e, f in zip(eps, found, strict=True)]


def _chain_stats_summary(chains: Sequence[dict[str, float]], into: dict[str, float]) -> None:
    """One problem's stats from its chains': gradient evaluations and divergences summed, acceptance rates
    and step sizes averaged."""
    for key in ("grad_evals", "divergences"):
        if key in chains[0]:
            into[key] = float(sum(c[key] for c in chains))
    for key in ("accept_rate", "burn_in_accept_rate", "step_size"):
        if key in chains[0]:
            into[key] = sum(c[key] for c in chains) / len(chains)


class HMC(Method):
    name = "hmc"
    description = "full-batch HMC: leapfrog + Metropolis-Hastings, dual-averaging step size during burn-in"
    hyperparameters = (
        Hyperparameter("step_size", float, 2e-4, "leapfrog step ε (initial value when adapted)", low=1e-12),
        Hyperparameter("n_leapfrog", int, 40, "leapfrog steps per trajectory (path length L·ε)", low=1),
        Hyperparameter("n_samples", int, 100, "post-burn-in iterations, one sample each (per chain)", low=1),
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
        Hyperparameter(
            "n_chains",
            int,
            1,
            "independent chains (own initialisation and random streams), run as one batched computation; "
            "their samples are pooled (n_chains · n_samples in all)",
            low=1,
        ),
    )
    posterior_storage = staticmethod(sample_networks_storage)  # the S kept states

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        for predictors in self._run([problem], config, [stats]):
            yield predictors[0]

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """Networks run side by side per seed: the chains."""
        return config["n_chains"]

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """``n_chains`` chains per problem, all of them one batched computation (:func:`run_chains` with
        :func:`stacked_potential`); every chain draws what it would in :meth:`sample_posterior`."""
        yield from self._run(problems, config, stats)

    def _run(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """The chains of every problem: with one chain, the chain's seed is drawn from the problem's generator
        after its model is built (as a lone chain always did); with C > 1, the chains' generators come from
        :func:`~ursa_ray.methods.batched.copy_generators` and each chain's seed from its own generator.
        Each post-burn-in iteration yields, chain after chain, one list of that chain's predictor per problem."""
        n_chains = config["n_chains"]
        models: list[nn.Module] = []
        seeds: list[int] = []
        for problem in problems:
            if n_chains == 1:
                models.append(problem.make_model())
                seeds.append(int(torch.randint(0, 2**62, (1,), generator=problem.generator)))
            else:
                generators = copy_generators(problem, n_chains)
                models.extend(problem.make_model() for _ in range(n_chains))
                seeds.extend(int(torch.randint(0, 2**62, (1,), generator=g)) for g in generators)
        for model in models:
            model.eval()
        copies = [problem for problem in problems for _ in range(n_chains)]
        prior_std, temperature = config["prior_std"], config["temperature"]
        if stackable(models, copies):
            stacked = StackedNetworks(models)
            potential = stacked_potential(stacked, copies, prior_std, temperature)

            def publish(theta: Tensor) -> None:
                stacked.theta.data.copy_(theta)

        else:
            potential = looped_potential(copies, models, prior_std, temperature)

            def publish(theta: Tensor) -> None:
                for model, row in zip(models, theta, strict=True):
                    load_flat_parameters(model, row)

        chain_stats = list(stats) if n_chains == 1 else [{} for _ in copies]
        traces = [ChainTrace(problem.x, n_chains) for problem in problems] if n_chains > 1 else []
        for one in stats:
            one["n_samples"] = 0
        for it in run_chains(potential, models, seeds, config, chain_stats, publish):
            if n_chains > 1:
                for k, one in enumerate(stats):
                    _chain_stats_summary(chain_stats[k * n_chains : (k + 1) * n_chains], one)
                    for j in range(n_chains):
                        traces[k].record(j, models[k * n_chains + j])
            for j in range(n_chains):
                for one in stats:
                    one["n_samples"] = it * n_chains + j + 1
                yield [models[k * n_chains + j] for k in range(len(problems))]
        if n_chains > 1:
            for k, one in enumerate(stats):
                _chain_stats_summary(chain_stats[k * n_chains : (k + 1) * n_chains], one)
                one.update(traces[k].summary())


METHODS = (HMC(),)
