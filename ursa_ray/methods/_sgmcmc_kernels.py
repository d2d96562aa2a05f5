"""Shared machinery of the stochastic-gradient MCMC samplers (``sgmcmc.py``).

* :class:`FlatModel` re-seats a network's parameters and gradients as views into two flat vectors, so
  that every sampler update is a handful of in-place operations on one contiguous tensor (no per-layer
  Python loop, no temporaries).
* :class:`GaussianNoise` adds fresh N(0, I) draws to a flat vector, seeded from the problem's generator
  (reproducible per seed; it leaves the problem's generator to the mini-batch order); on the CPU with the
  vectorised AES kernel of :mod:`ursa_ray.methods._aes_gaussian` (SGLD's gradient step in the same pass),
  or the Philox kernel of :mod:`ursa_ray.methods._philox_gaussian` on CPUs without AES instructions.
* :func:`momentum_step_` is SGHMC's deterministic update (one numba pass on the CPU,
  :mod:`ursa_ray.methods._momentum_cpu`).
* :func:`langevin_noise_std` is the single place where the injected-noise scale is computed.
* The step-size schedules: constant, URSABench's cosine annealing to lr/2, and the cyclical cosine of
  Zhang et al. (2020).
"""

from __future__ import annotations

import math

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


class GaussianNoise:
    """Fresh N(0, I) vectors ξ added to a flat parameter-sized tensor: ``add_to_(target, sigma, shrink,
    grad, lr)`` does target ← shrink·target − lr·grad + sigma·ξ in place.

    On the CPU, one pass over the target: AES-128 counter blocks through a vectorised Box–Muller transform
    (:mod:`ursa_ray.methods._aes_gaussian`) on x86-64 CPUs with AES instructions, else Philox4x32-10
    (:mod:`ursa_ray.methods._philox_gaussian`, the gradient term as a second pass); 3–4× faster than
    ``Tensor.normal_`` on one thread and with no noise buffer.  It runs on as many threads as torch has
    (the trial's CPU share); the key is drawn from ``seed_from`` and each call uses the next counter.  The
    two generators give different (equally distributed) values for a seed.  On other devices: ``normal_``
    into a buffer, with a generator of its own on that device (Philox there already).  Either way the
    problem's generator is touched once, at construction, and left to the mini-batch order."""

    def __init__(self, like: Tensor, seed_from: torch.Generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=seed_from))
        self.draws = 0
        self._aes = self._philox = None
        if like.device.type == "cpu":
            from ursa_ray.methods import _aes_gaussian  # llvmlite/numba: only where used

            if _aes_gaussian.aes_available():
                self._aes = _aes_gaussian.AESGaussian(seed)
            else:
                from ursa_ray.methods._philox_gaussian import add_standard_normal

                self._philox = add_standard_normal
                self._key = seed
        else:
            self._generator = torch.Generator(device=like.device)
            self._generator.manual_seed(seed)
            self._buffer = torch.empty_like(like)

    @property
    def bits(self) -> str:
        """The bit generator: "aes-128" or "philox4x32-10" on the CPU, "torch" elsewhere."""
        return "aes-128" if self._aes is not None else "philox4x32-10" if self._philox is not None else "torch"

    def add_to_(
        self, target: Tensor, sigma: float, shrink: float = 1.0, grad: Tensor | None = None, lr: float = 0.0
    ) -> Tensor:
        """target ← shrink·target − lr·grad + sigma·ξ with a fresh ξ, in place; returns ``target``."""
        threads = torch.get_num_threads()
        if self._aes is not None:
            self._aes.add_to(
                target.numpy(), self.draws, sigma, shrink, None if grad is None else grad.numpy(), lr, threads
            )
        else:
            if self._philox is not None:
                self._philox(target.numpy(), self._key, self.draws, sigma, shrink, threads=threads)
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
        fresh ξ, then theta ← theta + velocity (one pass with the AES kernel; else the noise, then
        :func:`momentum_step_`)."""
        if self._aes is not None:
            self._aes.momentum_step(
                theta.numpy(), velocity.numpy(), grad.numpy(), self.draws, sigma, keep, lr, decay,
                torch.get_num_threads(),
            )
            self.draws += 1
        else:
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
    """In place: velocity ← keep·velocity − lr·grad − decay·theta, then theta ← theta + velocity; one pass
    on the CPU, three torch operations on other devices."""
    if theta.device.type == "cpu":
        from ursa_ray.methods._momentum_cpu import momentum_step  # numba: only where used

        momentum_step(theta.numpy(), velocity.numpy(), grad.numpy(), keep, lr, decay)
    else:
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
