"""Shared machinery of the stochastic-gradient MCMC samplers (``sgmcmc.py``).

* :class:`FlatModel` re-seats a network's parameters and gradients as views into two flat vectors, so
  that every sampler update is a handful of in-place operations on one contiguous tensor (no per-layer
  Python loop, no temporaries).
* :class:`GaussianNoise` adds fresh N(0, I) draws to a flat vector, seeded from the problem's generator
  (reproducible per seed; it leaves the problem's generator to the mini-batch order); on the CPU with the
  Philox kernel of :mod:`ursa_ray.methods._philox_gaussian` (numba), or torch's generator where numba
  cannot be imported.
* :func:`momentum_step_` is SGHMC's deterministic update (one numba pass on the CPU,
  :mod:`ursa_ray.methods._momentum_cpu`; three torch operations without numba or on other devices).
* :func:`numba_kernels` is the one place that decides whether the numba kernels are used.
* :func:`langevin_noise_std` is the single place where the injected-noise scale is computed.
* The step-size schedules: constant, URSABench's cosine annealing to lr/2, and the cyclical cosine of
  Zhang et al. (2020).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ursa_ray.methods.base import memory_order, view_as_parameter


class FlatModel:
    """The parameters of ``model`` (in the order of :func:`~ursa_ray.methods.base.flat_parameters`:
    ``model.parameters()`` order, each parameter's values in memory order) stored in one vector ``theta``,
    their gradients in ``grad``.  After construction ``p.data`` and ``p.grad`` of every parameter are views
    into these with the parameter's own layout (a channels-last convolution weight stays channels-last, as
    cuDNN wants it on a GPU), and backward passes accumulate into ``grad`` in place (call
    :meth:`zero_grad`, not ``model.zero_grad``)."""

    def __init__(self, model: nn.Module):
        params = list(model.parameters())
        if not params:
            raise ValueError(f"{type(model).__name__} has no parameters to sample")
        dtype, device = params[0].dtype, params[0].device
        if any(p.dtype != dtype or p.device != device for p in params):
            raise ValueError("all parameters must share one dtype and device")
        n = sum(p.numel() for p in params)
        self.model = model
        self.params = params
        self.theta = torch.empty(n, dtype=dtype, device=device)
        self.grad = torch.zeros(n, dtype=dtype, device=device)
        offset = 0
        with torch.no_grad():
            for p in params:
                k = p.numel()
                self.theta[offset : offset + k].copy_(memory_order(p).reshape(-1))
                p.data = view_as_parameter(self.theta[offset : offset + k], p)
                p.grad = view_as_parameter(self.grad[offset : offset + k], p)
                offset += k
        self._grad_ptrs = [p.grad.data_ptr() for p in params]

    def zero_grad(self) -> None:
        self.grad.zero_()

    def check_grad_views(self) -> None:
        """Verify autograd accumulated into the flat gradient (it does, in place, when ``.grad`` exists)."""
        if any(p.grad is None or p.grad.data_ptr() != ptr for p, ptr in zip(self.params, self._grad_ptrs)):
            raise RuntimeError("autograd replaced a parameter's .grad; the flat gradient view is broken")

    def check_finite(self, loss: Tensor, where: str) -> None:
        """Raise FloatingPointError when the loss or any parameter is NaN or infinite."""
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"loss became {loss.item()} {where}")
        if not bool(torch.isfinite(self.theta).all()):
            raise FloatingPointError(f"parameters became non-finite {where}")


@functools.cache
def numba_kernels() -> tuple[Callable[..., None], Callable[..., None]] | None:
    """The CPU kernels compiled with numba: (:func:`~ursa_ray.methods._philox_gaussian.add_standard_normal`,
    :func:`~ursa_ray.methods._momentum_cpu.momentum_step`), or None where numba cannot be imported (then
    the samplers use torch's generator and operations, slower on the CPU but with the same distribution).
    Decided once per process (the import is attempted once)."""
    try:
        from ursa_ray.methods._momentum_cpu import momentum_step
        from ursa_ray.methods._philox_gaussian import add_standard_normal
    except ImportError:
        return None
    return add_standard_normal, momentum_step


class GaussianNoise:
    """Fresh N(0, I) vectors ξ added to a flat parameter-sized tensor: ``add_to_(target, sigma, shrink,
    grad, lr)`` does target ← shrink·target − lr·grad + sigma·ξ in place.

    The noise stream.  At construction one integer ``seed`` ∈ [0, 2⁶²) is drawn from ``seed_from`` (the
    problem's generator, touched only then and otherwise left to the mini-batch order); the stream is a
    function of that seed only, whichever of the three generators below makes it:

    * CPU with numba: Philox4x32-10 with key ``seed`` (:mod:`ursa_ray.methods._philox_gaussian`); draw k
      (k = 0, 1, … counts the calls that draw) uses counter k, and the shrink is applied in the same pass,
      the gradient term as a second torch pass.  3–5× faster than ``Tensor.normal_`` on one thread,
      with no noise buffer; the draw is split over as many numba threads as torch has (the trial's CPU
      share), and the values do not depend on that number.
    * CPU without numba: ``Tensor.normal_`` into a buffer with a ``torch.Generator`` of its own (MT19937)
      seeded with ``seed``.
    * Other devices: the same on that device (Philox there already).

    The generators give different (equally distributed) values for a seed, so a run is reproducible on one
    setup, not across them."""

    def __init__(self, like: Tensor, seed_from: torch.Generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=seed_from))
        self.draws = 0
        kernels = numba_kernels() if like.device.type == "cpu" else None
        self._philox = None if kernels is None else kernels[0]
        if self._philox is not None:
            self._key = seed
        else:
            self._generator = torch.Generator(device=like.device)
            self._generator.manual_seed(seed)
            self._buffer = torch.empty_like(like)

    @property
    def bits(self) -> str:
        """The bit generator: "philox4x32-10" (the numba kernel) or "torch" (``normal_``)."""
        return "philox4x32-10" if self._philox is not None else "torch"

    def add_to_(
        self, target: Tensor, sigma: float, shrink: float = 1.0, grad: Tensor | None = None, lr: float = 0.0
    ) -> Tensor:
        """target ← shrink·target − lr·grad + sigma·ξ with a fresh ξ, in place; returns ``target``."""
        if self._philox is not None:
            self._philox(target.numpy(), self._key, self.draws, sigma, shrink, threads=torch.get_num_threads())
        else:
            target.mul_(shrink).add_(self._buffer.normal_(generator=self._generator), alpha=sigma)
        if grad is not None:  # the gradient term as a second pass
            target.add_(grad, alpha=-lr)
        self.draws += 1
        return target

    def momentum_step_(
        self, theta: Tensor, velocity: Tensor, grad: Tensor, sigma: float, keep: float, lr: float, decay: float
    ) -> None:
        """SGHMC's noisy update in place: velocity ← keep·velocity − lr·grad − decay·theta + sigma·ξ with a
        fresh ξ, then theta ← theta + velocity (the noise pass, then :func:`momentum_step_`)."""
        self.add_to_(velocity, sigma, shrink=keep)
        momentum_step_(theta, velocity, grad, 1.0, lr, decay)


def warm_up_kernels(device: torch.device) -> None:
    """Compile (or load) every kernel :class:`GaussianNoise` and :func:`momentum_step_` use on ``device``,
    on a small vector, so that a fresh worker does not charge the compilation to its first timed trial."""
    theta = torch.zeros(64, device=device)
    velocity, grad = torch.zeros_like(theta), torch.zeros_like(theta)
    noise = GaussianNoise(theta, torch.Generator().manual_seed(0))
    noise.add_to_(theta, 0.1)
    noise.add_to_(theta, 0.1, grad=grad, lr=0.1)
    noise.momentum_step_(theta, velocity, grad, 0.1, 0.9, 0.1, 0.0)
    momentum_step_(theta, velocity, grad, 0.9, 0.1, 0.0)


def momentum_step_(theta: Tensor, velocity: Tensor, grad: Tensor, keep: float, lr: float, decay: float) -> None:
    """In place: velocity ← keep·velocity − lr·grad − decay·theta, then theta ← theta + velocity; one numba
    pass on the CPU, three torch operations without numba or on other devices."""
    kernels = numba_kernels() if theta.device.type == "cpu" else None
    if kernels is not None:
        kernels[1](theta.numpy(), velocity.numpy(), grad.numpy(), keep, lr, decay)
    else:
        if not (theta.shape == velocity.shape == grad.shape and theta.ndim == 1):
            raise ValueError(
                f"theta, velocity and grad must be 1-D of one length, got {tuple(theta.shape)}, "
                f"{tuple(velocity.shape)}, {tuple(grad.shape)}"
            )
        if not (theta.dtype == velocity.dtype == grad.dtype):
            raise ValueError(
                f"theta, velocity and grad must share a float32/float64 dtype, got {theta.dtype}, "
                f"{velocity.dtype}, {grad.dtype}"
            )
        velocity.mul_(keep).add_(grad, alpha=-lr).add_(theta, alpha=-decay)
        theta.add_(velocity)


def langevin_noise_std(step: float, temperature: float, friction: float = 1.0) -> float:
    """Standard deviation √(2·friction·η·T) of the noise injected per step of size η on U(θ).

    SGLD uses friction 1 (θ gets √(2ηT)·ξ); SGHMC in the (η, α) form gets √(2αηT)·ξ on the velocity.
    With the per-example learning rate ``lr`` of :mod:`ursa_ray.methods.sgmcmc`, η = lr / N, so the
    variance is 2·α·lr·T / N -- not (√(2·α·lr) / N)², URSABench's effective temperature of 1/N.
    """
    return math.sqrt(2.0 * friction * step * temperature)


def constant_lr(lr: float, step: int, total: int) -> float:
    return lr


def cosine_lr(lr: float, step: int, total: int) -> float:
    """URSABench's cosine option (CosineAnnealingLR with eta_min = lr/2), per step over the whole run:
    lr_k = lr/2 + (lr/2)·(1 + cos(π k / K)) / 2 for k = 0, ..., K-1."""
    return 0.5 * lr + 0.25 * lr * (1.0 + math.cos(math.pi * step / total))


def cyclical_lr(lr0: float, step: int, cycle_length: int) -> float:
    """Zhang et al. (2020): α_k = (lr0/2)·(cos(π·mod(k−1, C)/C) + 1), C = ⌈K/M⌉; here ``step`` = k − 1."""
    return 0.5 * lr0 * (math.cos(math.pi * (step % cycle_length) / cycle_length) + 1.0)
