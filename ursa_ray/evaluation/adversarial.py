"""Adversarial robustness of the posterior predictive (URSABench's future work; the threat model of
Vadera, Shukla, Jalaian & Marlin 2020b, "Assessing the adversarial robustness of Monte Carlo and
distillation methods for deep Bayesian neural network classification").

Threat model: a white-box attacker who knows the posterior predictive
p̄(y|x) = (1/M) Σₛ softmax f(x; θₛ) of M posterior samples and its gradient, and perturbs each test image
within an L∞ ball of radius ε *in pixel space* (pixels in [0, 1], before the dataset's per-channel
normalisation), so that one ε means the same for every dataset.  The loss maximised is the negative
log-likelihood of the true label under the model average, L(x) = −log p̄(y|x), with

    log p̄(y|x) = logsumexp_s log softmax f(x; θₛ)_y − log M.

* FGSM (Goodfellow, Shlens & Szegedy 2015): x' = Π(x + ε sign ∇ₓL(x)).
* PGD (Madry, Makelov, Schmidt, Tsipras & Vladu 2018): x₀ = Π(x + ε u), u ~ U[−1, 1]ᴰ (the random
  start), then K steps x_{k+1} = Π(x_k + α sign ∇ₓL(x_k)) with α = ε/4 (K = 10 by default); the last
  iterate is the adversarial example.

Π is the projection onto {x' : ‖x' − x‖∞ ≤ ε} ∩ [0, 1]ᴰ, per pixel a clip to [max(x − ε, 0), min(x + ε, 1)].
The attack un-normalises the dataset's inputs (:class:`PixelScale`), steps in pixel space and re-normalises
for the network; sign ∇ is the same in either space (the standard deviations are positive).

The samples are kept by :class:`ModelAverage`; :func:`craft` builds every (attack, ε) set, and
:class:`AdversarialPredictives` accumulates any predictor stream on them (the attacked model average for
white-box robustness; any method's posterior predictive for the transfer attack, crafted on a separately
trained SGD source network of the same model, dataset and seed, ``ursa_ray.trial.train_transfer_source``,
and passed between trials by :func:`examples_to_bytes`) and
computes, per set, the accuracy under attack, the attack success rate and the AUROCs of telling
adversarial from clean inputs by predictive entropy and by mutual information.  See docs/adversarial.md.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ursa_ray import data
from ursa_ray.data.base import AttackBudget
from ursa_ray.eval_sets import ATTACKS, attack_set
from ursa_ray.evaluation.metrics import ClassificationSummary, TemperedPredictive, accuracy, ood_detection
from ursa_ray.evaluation.predictions import SavedPredictive, prediction_table
from ursa_ray.evaluation.predictive import ClassificationPredictive
from ursa_ray.methods.base import memory_order, view_as_parameter

PGD_STEPS = 10
"""K, the number of PGD steps (each of size ε/4, so 8 steps cross the ball from any random start)."""
ATTACK_SAMPLES = 20
"""M, the posterior samples the attacker's model average keeps (``attack_samples``)."""
N_EXAMPLES = 1000
"""Test examples attacked (the first ``n_examples`` of the test set, or all of a smaller one)."""
ATTACK_BATCH = 512
"""Examples per forward and backward pass of the attack."""
_HEADROOM = 20.0
"""Largest log-weight a gradient enters the running sum with before the sum is rescaled (e^20 ≈ 5e8)."""

# --------------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class AdversarialSettings:
    """The grid's ``adversarial`` block.  ``epsilons`` None means the ε the dataset declares
    (:func:`default_epsilons`); its reference ε (:func:`reference_epsilon`) is always crafted too.
    ``transfer``: also evaluate every method on the examples crafted on an SGD source network of the same
    (model, dataset, seed) that no method saw (a black-box transfer attack; needs an ``sgd`` entry in the
    grid, whose trial trains the source)."""

    attacks: tuple[str, ...] = ATTACKS
    epsilons: tuple[float, ...] | None = None
    n_examples: int = N_EXAMPLES
    attack_samples: int = ATTACK_SAMPLES
    pgd_steps: int = PGD_STEPS
    transfer: bool = True

    def epsilons_for(self, dataset: str) -> tuple[float, ...]:
        """The grid's ε, else the dataset's declared ones; with its reference ε (none for a dataset that
        declares no :class:`~ursa_ray.data.base.AttackBudget`, which must then be given ε)."""
        budget = attack_budget(dataset)
        if self.epsilons is not None and budget is None:
            return self.epsilons
        chosen = self.epsilons if self.epsilons is not None else default_epsilons(dataset)
        return tuple(sorted({*chosen, budget.reference}))


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"adversarial.{field}: expected an integer >= 1, got {value!r}")
    return value


def validate_adversarial(settings: Mapping[str, object] | None) -> AdversarialSettings:
    """The checked settings of a grid's ``adversarial`` block (None: all defaults).

    Raises ValueError naming the field and what it allows: an unknown key or attack, an ε that is not a
    number in [0, 1] (pixel units), ``n_examples``, ``attack_samples`` or ``pgd_steps`` below 1, a
    ``transfer`` that is not a boolean.
    """
    if settings is None:
        return AdversarialSettings()
    if not isinstance(settings, Mapping):
        raise ValueError(f"adversarial: expected a mapping, got {type(settings).__name__}")
    allowed = tuple(AdversarialSettings.__dataclass_fields__)
    for key in settings:
        if key not in allowed:
            raise ValueError(f"adversarial.{key}: unknown key; allowed: {', '.join(allowed)}")
    out: dict[str, object] = {}
    if "attacks" in settings:
        attacks, allowed_attacks = settings["attacks"], ", ".join(ATTACKS)
        if not isinstance(attacks, (list, tuple)) or not attacks:
            raise ValueError(f"adversarial.attacks: expected a non-empty list of {allowed_attacks}, got {attacks!r}")
        for i, attack in enumerate(attacks):
            if attack not in ATTACKS:
                raise ValueError(f"adversarial.attacks[{i}]: unknown attack {attack!r}; allowed: {allowed_attacks}")
        if len(set(attacks)) != len(attacks):
            raise ValueError("adversarial.attacks: each attack may appear once")
        out["attacks"] = tuple(attacks)
    if "epsilons" in settings:
        epsilons = settings["epsilons"]
        if not isinstance(epsilons, (list, tuple)) or not epsilons:
            raise ValueError(f"adversarial.epsilons: expected a non-empty list of numbers, got {epsilons!r}")
        for i, eps in enumerate(epsilons):
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps <= 1:
                raise ValueError(f"adversarial.epsilons[{i}]: expected a number in [0, 1] (pixel units), got {eps!r}")
        out["epsilons"] = tuple(sorted({float(e) for e in epsilons}))
    for field in ("n_examples", "attack_samples", "pgd_steps"):
        if field in settings:
            out[field] = _positive_int(field, settings[field])
    if "transfer" in settings:
        if not isinstance(settings["transfer"], bool):
            raise ValueError(f"adversarial.transfer: expected true or false, got {settings['transfer']!r}")
        out["transfer"] = settings["transfer"]
    return AdversarialSettings(**out)


def attack_budget(dataset: str) -> AttackBudget | None:
    """The ε a registered dataset declares (:attr:`ursa_ray.data.base.DatasetSpec.attack_budget`); None for
    one that declares none or is not registered (a dataset read from files)."""
    spec = data.registry().get(dataset)
    return None if spec is None else spec.attack_budget


def default_epsilons(dataset: str) -> tuple[float, ...]:
    """The ε grid (pixel units) ``dataset`` declares; ValueError naming the datasets that declare one."""
    budget = attack_budget(dataset)
    if budget is None:
        known = [name for name, spec in data.registry().items() if spec.attack_budget is not None]
        raise ValueError(f"no adversarial defaults for dataset {dataset!r}; known: {', '.join(known)}")
    return budget.epsilons


def reference_epsilon(dataset: str) -> float:
    """The ε of the robustness composite ``dataset`` declares; NaN when it declares none (no set is then the
    composite's)."""
    budget = attack_budget(dataset)
    return math.nan if budget is None else budget.reference


# --------------------------------------------------------------------------------------------------
# Pixel space


@dataclass(frozen=True)
class PixelScale:
    """The per-channel normalisation a dataset stores its images with: input = (pixel − mean) / std.

    One value applies to every channel.  Channels are dimension 1 of an N × C × … batch.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def to_pixels(self, inputs: Tensor) -> Tensor:
        """pixel = input · std + mean."""
        mean, std, _, _ = _channel_constants(self, inputs.dtype, inputs.device, inputs.dim())
        return torch.addcmul(mean, inputs, std)

    def to_inputs(self, pixels: Tensor) -> Tensor:
        """input = (pixel − mean) / std, computed in one operation as pixel · (1/std) − mean/std."""
        _, _, inverse_std, shift = _channel_constants(self, pixels.dtype, pixels.device, pixels.dim())
        return torch.addcmul(shift, pixels, inverse_std)


@functools.cache
def _channel_constants(
    scale: PixelScale, dtype: torch.dtype, device: torch.device, dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """mean, std, 1/std and −mean/std as 1 × C × 1 … tensors for a batch of ``dim`` dimensions."""
    shape = (1, -1) + (1,) * (dim - 2)
    mean = torch.tensor(scale.mean, dtype=torch.float64).view(shape)
    std = torch.tensor(scale.std, dtype=torch.float64).view(shape)
    return tuple(t.to(dtype=dtype, device=device) for t in (mean, std, 1 / std, -mean / std))


# --------------------------------------------------------------------------------------------------
# The attacker's model average


def _cuda_index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def kept_sample_indices(
    n_samples: int, attack_samples: int, n_chains: int = 1, chains_in_turn: bool = False
) -> tuple[int, ...]:
    """Which positions (0-based) of a stream of C = ``n_chains`` chains of S = ``n_samples`` samples each the
    attacker keeps, in increasing order.

    The M' = min(C·S, M) kept samples are shared among the chains as evenly as possible (chain c keeps
    m_c = ⌊M'/C⌋ samples, one more for c < M' mod C), and each chain keeps its own draws spaced S/m_c
    apart and ending with its last, i_j = ⌊(j + 1) S / m_c⌋ − 1 for j = 0 … m_c − 1 (all S when S ≤ m_c).
    Draw i of chain c is at stream position i·C + c when the chains are interleaved (every sampling step
    yields chain 1's sample, then chain 2's, ...: HMC and every batched stream) and c·S + i when they run
    ``chains_in_turn`` (SG-MCMC chains of a network too large to batch).  One chain: the S/M'-spaced
    positions ending with the last.
    """
    if n_samples < 1 or attack_samples < 1 or n_chains < 1:
        raise ValueError(
            f"need n_samples, attack_samples and n_chains >= 1, got {n_samples}, {attack_samples}, {n_chains}"
        )
    kept = min(n_samples * n_chains, attack_samples)
    positions = []
    for chain in range(n_chains):
        per_chain = kept // n_chains + (chain < kept % n_chains)
        for j in range(per_chain):
            draw = (j + 1) * n_samples // per_chain - 1
            positions.append(chain * n_samples + draw if chains_in_turn else draw * n_chains + chain)
    return tuple(sorted(positions))


@dataclass(frozen=True)
class AttackLoss:
    """L = −log p̄(y|x) per example and its input gradient, ∇ₓL = exp(``log_scale``) · ``direction``.

    ``direction`` (float32, the inputs' shape) is a positive per-example multiple of the gradient with
    entries of order one however confident the network: a float32 gradient underflows to exactly 0 once a
    logit margin passes ~100 (softmax saturates), which would mask a confident network from a sign attack.
    """

    nll: Tensor
    direction: Tensor
    log_scale: Tensor

    def gradient(self) -> Tensor:
        """∇ₓL in float64."""
        return self.direction.double() * torch.exp(self.log_scale).view(-1, *[1] * (self.direction.dim() - 1))


class ModelAverage:
    """M posterior samples kept as flat copies, and the model average p̄ over them.

    Feed it every sample of the stream with :meth:`observe`; it copies those at
    :func:`kept_sample_indices` (S = ``planned_samples`` per chain of ``n_chains``, M = ``attack_samples``).
    A copy is the network's parameters (in :func:`~ursa_ray.methods.base.flat_parameters` order) followed
    by its floating-point
    buffers (batch-norm running statistics: SWAG recomputes them for each draw, ensemble members have
    their own).  Memory: M × (parameters + buffer values) × 4 bytes on the samples' device, e.g.
    20 × 199,210 × 4 = 15.9 MB for the MLP 784-200-200-10 and 20 × 23.6 M × 4 = 1.9 GB for ResNet-50;
    a sample identical to the previous kept one (MC dropout's single network) shares its copy
    (:attr:`stored_bytes`).  Single-sample methods (SGD, SWA) have M = 1.

    Every pass runs one shared network, the first kept one, in the train/eval modes it had when kept, with
    its parameter and buffer slots pointing at views of copy s (the tensors are swapped, never written,
    so graphs of different samples can be alive at once; the network's own tensors and modes are put back
    after each call).  Inputs go through in chunks of ``batch_size`` examples.

    Stochastic networks (MC, concrete and variational dropout, which draw their noise from torch's
    generator of the inputs' device): sample s on chunk c runs with that generator seeded from
    (``seed``, s, c), and the generator's state is restored afterwards.  So the M samples are M fixed
    masks (θ, m_s), like M fixed parameter draws: the attack ascends one deterministic p̄, PGD's K steps
    see the same function, and :meth:`predictors` evaluates the adversarial examples on exactly the
    function that was attacked.  Fresh masks per step (expectation over transformation, Athalye et al.
    2018) would attack a noisy estimate of the infinite-mask predictive instead; with fixed masks the
    attacker is as strong as for the other methods, and the attacked and evaluated predictives agree.
    The masks depend on the chunk's shape, so any two sets of the same size (clean and adversarial
    copies of the attacked examples) see example i with the same masks.
    """

    def __init__(
        self,
        planned_samples: int,
        attack_samples: int = ATTACK_SAMPLES,
        *,
        n_chains: int = 1,
        chains_in_turn: bool = False,
        seed: int = 0,
        batch_size: int = ATTACK_BATCH,
    ) -> None:
        self.kept_indices = kept_sample_indices(planned_samples, attack_samples, n_chains, chains_in_turn)
        self.seed = seed
        self.batch_size = batch_size
        self._n_observed = 0
        self._network: nn.Module | None = None
        self._modes: list[bool] = []
        self._slots: list[tuple[dict[str, Tensor], str, Tensor]] = []  # (module's dict, name, like-tensor)
        self._copies: list[Tensor] = []
        self._states: list[list[Tensor]] = []
        self._seeds: dict[tuple[int, int], int] = {}

    @property
    def n_kept(self) -> int:
        """M, the samples kept so far."""
        return len(self._states)

    @property
    def stored_bytes(self) -> int:
        """Bytes held by the distinct flat copies."""
        return sum(c.numel() * c.element_size() for c in self._copies)

    def observe(self, sample: nn.Module) -> bool:
        """Offer the stream's next sample; copy it if its index is kept.  Returns whether it was kept."""
        index = self._n_observed
        self._n_observed += 1
        if index not in self.kept_indices:
            return False
        if not isinstance(sample, nn.Module):
            raise TypeError(f"a kept posterior sample must be an nn.Module, got {type(sample).__name__}")
        if self._network is None:
            self._adopt(sample)
        tensors = [p for p in sample.parameters()] + [b for b in sample.buffers() if b.is_floating_point()]
        if [t.shape for t in tensors] != [like.shape for _, _, like in self._slots]:
            raise ValueError("a kept posterior sample is not the same network as the first one")
        with torch.no_grad():
            flat = torch.cat([memory_order(t.detach()).reshape(-1) for t in tensors])
        if self._copies and torch.equal(flat, self._copies[-1]):
            flat = self._copies[-1]
        else:
            self._copies.append(flat)
        views, offset = [], 0
        for _, _, like in self._slots:
            views.append(view_as_parameter(flat[offset : offset + like.numel()], like))
            offset += like.numel()
        self._states.append(views)
        return True

    def _adopt(self, network: nn.Module) -> None:
        """Make ``network`` the shared one: record its modes and its parameter and float buffer slots."""
        self._network = network
        self._modes = [m.training for m in network.modules()]
        for name, p in network.named_parameters():
            owner, _, leaf = name.rpartition(".")
            self._slots.append((network.get_submodule(owner)._parameters, leaf, p))
        for name, b in network.named_buffers():
            if b.is_floating_point():
                owner, _, leaf = name.rpartition(".")
                self._slots.append((network.get_submodule(owner)._buffers, leaf, b))

    def _chunks(self, n: int) -> list[slice]:
        return [slice(start, min(start + self.batch_size, n)) for start in range(0, n, self.batch_size)]

    @contextmanager
    def _passes(self, device: torch.device) -> Iterator[None]:
        """The kept modes set and the generator state of ``device`` saved; both, and the network's own
        tensors, put back afterwards."""
        if self._network is None:
            raise RuntimeError("no posterior sample kept yet")
        modules = list(self._network.modules())
        modes = [m.training for m in modules]
        own = [slot[name] for slot, name, _ in self._slots]
        for m, mode in zip(modules, self._modes, strict=True):
            m.training = mode
        try:
            with torch.random.fork_rng(devices=[_cuda_index(device)] if device.type == "cuda" else []):
                yield
        finally:
            for (slot, name, _), tensor in zip(self._slots, own, strict=True):
                slot[name] = tensor
            for m, mode in zip(modules, modes, strict=True):
                m.training = mode

    def _forward(self, s: int, chunk: int, x: Tensor) -> Tensor:
        """Logits of kept sample ``s`` on chunk number ``chunk`` ``x``, with that pass's fixed noise
        (call inside :meth:`_passes`)."""
        assert self._network is not None
        for (slot, name, _), tensor in zip(self._slots, self._states[s], strict=True):
            slot[name] = tensor
        key = (s, chunk)
        if key not in self._seeds:
            self._seeds[key] = int(np.random.SeedSequence((self.seed, s, chunk)).generate_state(1, np.uint64)[0])
        cuda = x.device.type == "cuda"
        generator = torch.cuda.default_generators[_cuda_index(x.device)] if cuda else torch.default_generator
        generator.manual_seed(self._seeds[key])
        return self._network(x)

    def logits(self, s: int, x: Tensor) -> Tensor:
        """Float32 logits of kept sample ``s`` on the whole set ``x`` (no gradient)."""
        with torch.no_grad(), self._passes(x.device):
            chunks = enumerate(self._chunks(x.shape[0]))
            return torch.cat([self._forward(s, c, x[rows]).float() for c, rows in chunks])

    def predictors(self) -> Iterator[Callable[[Tensor], Tensor]]:
        """The kept samples as a predictor stream (a whole set in, its logits out), for
        :meth:`AdversarialPredictives.update`."""
        for s in range(self.n_kept):
            yield functools.partial(self.logits, s)

    def log_predictive(self, x: Tensor) -> Tensor:
        """Differentiable log p̄(·|x) = logsumexp_s log softmax f(x; θₛ) − log M, n × K, float32.

        Holds the graphs of all M passes of a chunk at once; the attacks use :meth:`attack_loss`,
        which holds one.
        """
        out = []
        with self._passes(x.device):
            for c, rows in enumerate(self._chunks(x.shape[0])):
                per_sample = [self._forward(s, c, x[rows]).float().log_softmax(dim=-1) for s in range(self.n_kept)]
                out.append(torch.logsumexp(torch.stack(per_sample), dim=0) - math.log(self.n_kept))
        return torch.cat(out)

    def attack_loss(self, x: Tensor, y: Tensor) -> AttackLoss:
        """L = −log p̄(y|x) and its input gradient, one forward and one backward pass per sample and chunk.

        With lₛ = log pₛ(y|x) and gₛ = ∇ₓlₛ, ∇ₓ log p̄(y|x) = Σₛ wₛ gₛ, wₛ = pₛ(y|x) / Σᵣ pᵣ(y|x) (a softmax of
        the lₛ over samples).  With logits z, cₛ = 1 − pₛ(y|x) = Σ_{k≠y} pₛ(k|x) and ∂lₛ/∂z = e_y − pₛ = cₛ vₛ,
        where vₛ = e_y − softmax_{k≠y}(z) (zero at y in the softmax) has entries in [−1, 1] and does not
        vanish where pₛ(y|x) rounds to 1 (a float32 softmax gradient is exactly 0 beyond a margin of ~100).
        With u = z_y − lse_{k≠y} z, lₛ = log σ(u) = u − softplus(u) and log cₛ = −softplus(u).  Pass s
        backpropagates −exp(Eₛ − r) vₛ, Eₛ = lₛ + log cₛ, and adds the result, −exp(Eₛ − r) gₛ / cₛ, to a
        running sum (the direction of ∇ₓL), where r is a per-example reference: the first sample's Eₛ,
        raised (and the sum rescaled) when a later one exceeds it by more than 20.  Then

            ∇ₓ log p̄ = exp(r − logsumexp_s lₛ) Σₛ exp(Eₛ − r) gₛ / cₛ.

        Only one graph and one input-sized sum live at a time.  A pass adds to a plain forward and backward
        about twenty operations on the n × K logits and n × 1 columns, and one input-sized addition
        (``benchmarks/bench_adversarial.py`` measures what that costs).
        """
        n, m = x.shape[0], self.n_kept
        y = y.to(x.device)
        nll = torch.empty(n, dtype=torch.float64, device=x.device)
        log_scale = torch.empty_like(nll)
        direction = torch.empty_like(x, dtype=torch.float32)
        rows_shape = (-1,) + (1,) * (x.dim() - 1)
        with self._passes(x.device), torch.enable_grad():
            for c, rows in enumerate(self._chunks(n)):
                xc, yc = x[rows].detach().requires_grad_(True), y[rows, None]
                ascent = direction[rows]  # −Σₛ exp(Eₛ − r) gₛ / cₛ
                log_lik = []
                for s in range(m):
                    logits = self._forward(s, c, xc)
                    z = logits.detach().float()
                    if s == 0:
                        is_label = torch.zeros_like(z, dtype=torch.bool).scatter_(1, yc, True)
                    v = z.masked_fill(is_label, -math.inf)
                    top = v.amax(dim=1, keepdim=True)
                    v = v.sub_(top).exp_()
                    total = v.sum(dim=1, keepdim=True)
                    u = z.gather(1, yc).sub_(top).sub_(total.log())  # z_y − lse_{k≠y} z
                    softplus = nn.functional.softplus(u)
                    log_lik.append(u - softplus)
                    exponent = log_lik[-1] - softplus  # Eₛ
                    v = torch.where(is_label, -1.0, v.div_(total))  # −vₛ: backpropagated, it ascends L
                    if s == 0:
                        ref = exponent
                    else:
                        shift = exponent - ref
                        if shift.max() > _HEADROOM:
                            raised = torch.maximum(ref, exponent)
                            ascent.mul_(torch.exp(ref - raised).view(rows_shape))
                            ref, shift = raised, exponent - raised
                        v.mul_(shift.exp_())
                    (g,) = torch.autograd.grad(logits, xc, v.to(logits.dtype))
                    if s == 0:
                        ascent.copy_(g)
                    else:
                        ascent.add_(g)
                log_evidence = torch.logsumexp(torch.cat(log_lik, dim=1).double(), dim=1)
                nll[rows] = math.log(m) - log_evidence
                log_scale[rows] = ref.squeeze(1).double() - log_evidence
        return AttackLoss(nll=nll, direction=direction, log_scale=log_scale)


# --------------------------------------------------------------------------------------------------
# Attacks


def _ball(pixels: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Per-pixel bounds of {x' : ‖x' − x‖∞ ≤ ε} ∩ [0, 1]ᴰ."""
    return (pixels - epsilon).clamp_min(0.0), (pixels + epsilon).clamp_max(1.0)


def fgsm(
    model: ModelAverage, pixels: Tensor, y: Tensor, scale: PixelScale, epsilons: Sequence[float]
) -> dict[float, Tensor]:
    """FGSM (Goodfellow et al. 2015) at each ε: x' = Π(x + ε sign ∇ₓL(x)), L = −log p̄(y|x).

    ``pixels`` are clean images in [0, 1]; one gradient serves every ε.  Returns adversarial pixels by ε.
    """
    step = model.attack_loss(scale.to_inputs(pixels), y).direction.sign()
    out = {}
    for eps in epsilons:
        low, high = _ball(pixels, eps)
        out[eps] = torch.clamp(pixels + eps * step, low, high)
    return out


def pgd(
    model: ModelAverage,
    pixels: Tensor,
    y: Tensor,
    scale: PixelScale,
    epsilons: Sequence[float],
    *,
    steps: int = PGD_STEPS,
    seed: int = 0,
) -> dict[float, Tensor]:
    """L∞ PGD (Madry et al. 2018) at each ε: random start x₀ = Π(x + ε u), u ~ U[−1, 1]ᴰ, then ``steps``
    steps x_{k+1} = Π(x_k + (ε/4) sign ∇ₓL(x_k)); returns the last iterate, adversarial pixels by ε.

    u is drawn once on the CPU from ``seed`` and scaled by each ε, so the examples do not depend on the
    device and a larger ε starts from the same direction.
    """
    start = torch.rand(pixels.shape, generator=torch.Generator().manual_seed(seed), dtype=pixels.dtype)
    start = (2 * start - 1).to(pixels.device)
    out = {}
    for eps in epsilons:
        low, high = _ball(pixels, eps)
        adversarial = torch.clamp(pixels + eps * start, low, high)
        for _ in range(steps):
            step = model.attack_loss(scale.to_inputs(adversarial), y).direction.sign_()
            adversarial.add_(step, alpha=eps / 4).clamp_(low, high)
        out[eps] = adversarial
    return out


@dataclass(frozen=True)
class AdversarialSet:
    """One crafted set: its attack, its ε (pixel units) and its images."""

    attack: str
    epsilon: float
    pixels: Tensor
    """Adversarial images in pixel space, within ε of the clean pixels and in [0, 1]."""


@dataclass(frozen=True)
class AdversarialExamples:
    """The attacked examples' clean pixels (in [0, 1]), their labels and the crafted sets by name."""

    clean_pixels: Tensor
    labels: Tensor
    scale: PixelScale
    sets: dict[str, AdversarialSet]

    def inputs(self) -> dict[str, Tensor]:
        """``clean`` and every set's normalised inputs, as the network takes them.  All are normalised from
        pixels the same way, so an ε = 0 set equals the clean one bit for bit."""
        pixels = {"clean": self.clean_pixels, **{name: s.pixels for name, s in self.sets.items()}}
        return {name: self.scale.to_inputs(p) for name, p in pixels.items()}


def examples_to_bytes(examples: AdversarialExamples) -> bytes:
    """The crafted examples as a file (``torch.save`` of CPU tensors, strings and floats only), for the
    trials that score them as a transfer attack; the pixel scale is not saved (it is the dataset's)."""
    buffer = io.BytesIO()
    torch.save(
        {
            "clean_pixels": examples.clean_pixels.cpu(),
            "labels": examples.labels.cpu(),
            "sets": {name: (s.attack, s.epsilon, s.pixels.cpu()) for name, s in examples.sets.items()},
        },
        buffer,
    )
    return buffer.getvalue()


def examples_from_bytes(saved: bytes, scale: PixelScale, device: torch.device) -> AdversarialExamples:
    """:func:`examples_to_bytes` read back onto ``device`` (``weights_only``: a file holds no code)."""
    loaded = torch.load(io.BytesIO(saved), map_location=device, weights_only=True)
    sets = {name: AdversarialSet(attack, float(eps), pixels) for name, (attack, eps, pixels) in loaded["sets"].items()}
    return AdversarialExamples(loaded["clean_pixels"], loaded["labels"], scale, sets)


def craft(
    model: ModelAverage,
    x: Tensor,
    y: Tensor,
    scale: PixelScale,
    attacks: Sequence[str],
    epsilons: Sequence[float],
    *,
    steps: int = PGD_STEPS,
    seed: int = 0,
) -> AdversarialExamples:
    """Adversarial copies of the normalised inputs ``x`` (labels ``y``) for every attack and ε, crafted on
    ``model``'s average.  Clean pixels are clipped to [0, 1] (undoing the normalisation's rounding)."""
    pixels = scale.to_pixels(x).clamp(0.0, 1.0)
    sets = {}
    for attack in attacks:
        if attack == "fgsm":
            crafted = fgsm(model, pixels, y, scale, epsilons)
        elif attack == "pgd":
            crafted = pgd(model, pixels, y, scale, epsilons, steps=steps, seed=seed)
        else:
            raise ValueError(f"unknown attack {attack!r}; allowed: {', '.join(ATTACKS)}")
        sets.update({attack_set(attack, eps): AdversarialSet(attack, eps, p) for eps, p in crafted.items()})
    return AdversarialExamples(pixels, y, scale, sets)


# --------------------------------------------------------------------------------------------------
# Evaluation


def adversarial_metrics(
    clean: ClassificationSummary, adversarial: ClassificationSummary, labels: np.ndarray
) -> dict[str, float]:
    """One adversarial set against its clean examples, under one posterior predictive.

    * ``accuracy``: share with argmax p̄(·|x') = y;
    * ``attack_success_rate``: of the examples classified correctly when clean, the share misclassified
      when attacked (NaN when none is correct);
    * ``adv_auroc_entropy``, ``adv_auroc_mi``: AUROC of telling the adversarial inputs (label 1) from
      the clean ones (label 0) by total predictive entropy and by mutual information, computed as the OOD
      AUROCs are (:func:`~ursa_ray.evaluation.metrics.ood_detection`).
    """
    clean_right = clean.mean_probs.argmax(axis=1) == labels
    attacked_wrong = adversarial.mean_probs.argmax(axis=1) != labels
    n_right = int(clean_right.sum())
    detection = ood_detection(
        clean.total_entropy, clean.mutual_information, adversarial.total_entropy, adversarial.mutual_information
    )
    return {
        "accuracy": accuracy(adversarial.mean_probs, labels),
        "attack_success_rate": float((clean_right & attacked_wrong).sum() / n_right) if n_right else math.nan,
        "adv_auroc_entropy": detection["ood_auroc_entropy"],
        "adv_auroc_mi": detection["ood_auroc_mi"],
    }


def _all_metrics(
    summaries: Mapping[str, ClassificationSummary], labels: np.ndarray, epsilons: Mapping[str, float]
) -> dict[str, dict[str, float]]:
    clean = summaries["clean"]
    out = {"clean": {"accuracy": accuracy(clean.mean_probs, labels)}}
    for name, epsilon in epsilons.items():
        out[name] = {"epsilon": epsilon, **adversarial_metrics(clean, summaries[name], labels)}
    return out


class AdversarialPredictives:
    """The posterior predictive of one predictor stream on the clean examples and every adversarial set.

    ``update(predictor)`` takes one posterior sample as a function from a whole set's inputs to its logits
    (for a trial's stream ``lambda x: predict(sample, x, precision)``; for the attacked model average each
    of :meth:`ModelAverage.predictors`).  Memory: (1 + sets) × n × K float64 sums, whatever the stream's
    length, plus the normalised inputs (the crafted pixels are not kept).  ``expected_entropy``, when given,
    maps the same inputs to the sample's distilled expected entropy (shape n, or None where it has none),
    handed to :meth:`ClassificationPredictive.update` (the transfer attack's scoring of a GPED student).
    """

    def __init__(self, examples: AdversarialExamples, n_classes: int) -> None:
        self.labels = examples.labels.cpu().numpy()
        self._inputs = examples.inputs()
        self._kinds = {name: (s.attack, s.epsilon) for name, s in examples.sets.items()}
        n, device = examples.labels.shape[0], examples.clean_pixels.device
        self._accumulators = {name: ClassificationPredictive(n, n_classes, device) for name in self._inputs}

    def update(
        self, predictor: Callable[[Tensor], Tensor], expected_entropy: Callable[[Tensor], Tensor | None] | None = None
    ) -> None:
        for name, x in self._inputs.items():
            self._accumulators[name].update(predictor(x), None if expected_entropy is None else expected_entropy(x))

    def metrics(self) -> dict[str, dict[str, float]]:
        """``{"clean": {"accuracy"}, set name: {"epsilon", :func:`adversarial_metrics`' keys}}``."""
        return _all_metrics(self._accumulators, self.labels, {name: eps for name, (_, eps) in self._kinds.items()})

    def tables(self) -> dict[str, pd.DataFrame]:
        """Saved predictions by set (``clean`` too): :func:`~ursa_ray.evaluation.predictions.prediction_table`
        with the columns ``attack`` ("none" for clean) and ``epsilon``."""
        out = {}
        for name, accumulator in self._accumulators.items():
            table = prediction_table(accumulator, self.labels)
            table["attack"], table["epsilon"] = self._kinds.get(name, ("none", 0.0))
            out[name] = table
        return out


def metrics_from_adversarial_tables(
    tables: Mapping[str, pd.DataFrame], temperature: float | None = None
) -> dict[str, dict[str, float]]:
    """:meth:`AdversarialPredictives.metrics` recomputed from its saved :meth:`~AdversarialPredictives.tables`;
    with a ``temperature``, the same metrics with every set's predictive (the clean examples' too) tempered by
    it (:class:`~ursa_ray.evaluation.metrics.TemperedPredictive`: temperature scaling's ``@calibrated`` sets)."""
    saved = {name: SavedPredictive(table) for name, table in tables.items()}
    summaries: Mapping[str, ClassificationSummary] = saved
    if temperature is not None:
        summaries = {name: TemperedPredictive(pred, temperature) for name, pred in saved.items()}
    epsilons = {name: float(table["epsilon"].iloc[0]) for name, table in tables.items() if name != "clean"}
    return _all_metrics(summaries, saved["clean"].labels, epsilons)
