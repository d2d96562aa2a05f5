"""Fast standard-normal vectors on the CPU: Philox4x32-10 counters through a vectorised Box–Muller transform.

SGLD and SGHMC draw one N(0, I) vector of every parameter at every step.  On one CPU thread torch's
``Tensor.normal_`` spends about 3 ns per value in its scalar MT19937 generator alone (4–6 ns per normal
in all), which made the draw 21–47% of a plain SGD epoch; numpy's generators, MKL's (through
``mkl_random``), JAX's and an inductor-compiled kernel were measured no faster than 2.5 ns
(``benchmarks/bench_samplers.py`` prints the comparison with ``normal_``).  This module compiles one loop
with numba that LLVM vectorises (AVX2: eight lanes), at about 1.6 ns per normal:

* **Bits**: Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2,
  3"), the counter-based generator of cuRAND and of torch on CUDA.  Block ``b`` of a draw is the
  128-bit counter ``(b, draw_lo, draw_hi, 0)`` under the 64-bit key; the known-answer vectors of the
  Random123 distribution are checked in ``tests/test_philox_gaussian.py``.
* **Normals**: the Box–Muller transform (Box & Muller 1958) on the top bits of two words:
  u = (k + ½)·2⁻²³ (k the top 23 bits) for the radius √(−2 ln u), t = k'·2⁻²⁴ (the top 24) for the
  angle 2πt.  So |z| ≤ √(48 ln 2) ≈ 5.77, the bound of torch's CPU ``normal_`` (24-bit uniforms) too.
  ln, sin and cos are float32 polynomials after exact range reduction (ln: exponent split,
  m ∈ (√½, √2], ln m = 2 artanh((m−1)/(m+1)) to s⁹, truncation < 1e-9; sin/cos: quadrant split,
  |a| ≤ π/4, Taylor to a⁹ / a¹⁰, truncation < 2e-9), so the values agree with a float64 Box–Muller of
  the same words to float32 rounding (tested to 2e-6 absolute).

Each block gives four normals, written to four planes of the target (the first 4·⌊n/4⌋ elements as a
4 × ⌊n/4⌋ array; one more block for the last n mod 4).  The kernel adds them in the same pass as it
scales the target (for SGLD the prior's shrink, θ ← (1 − η/σₚ²)θ + √(2ηT)ξ), so no noise buffer is
written or read back.  With ``threads`` > 1 the blocks are split over numba threads (``prange``), for
trials holding more than one CPU; block b's values do not depend on the split.  No fast-math flags: the
loop keeps IEEE semantics, and a given (key, counter) yields the same values on every machine.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_JIT = {"error_model": "numpy", "cache": True}  # numpy error model: no zero-division branch, so LLVM vectorises


@intrinsic
def _float_bits(typingctx, x):  # noqa: ARG001 (numba's intrinsic signature)
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits_float(typingctx, x):  # noqa: ARG001
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


# Philox4x32 multipliers and Weyl key increments (Salmon et al. 2011, Table 2).
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW32, _SHIFT32 = np.uint64(0xFFFFFFFF), np.uint64(32)

_f32 = np.float32
_MANTISSA, _EXPONENT_ONE = np.uint32(0x007FFFFF), np.uint32(0x3F800000)
_SHIFT23, _SHIFT9, _SHIFT8, _BIAS = np.uint32(23), np.uint32(9), np.uint32(8), np.int32(127)
_ONE, _HALF, _TWO, _FOUR, _QUARTER = _f32(1.0), _f32(0.5), _f32(2.0), _f32(4.0), _f32(0.25)
_INV_2_23, _INV_2_24 = _f32(2.0**-23), _f32(2.0**-24)
_LN2, _SQRT2, _TAU = _f32(0.6931471805599453), _f32(1.4142135623730951), _f32(6.283185307179586)
# 2·artanh(s) = 2s + 2s³/3 + 2s⁵/5 + 2s⁷/7 + 2s⁹/9 + …
_L3, _L5, _L7, _L9 = _f32(2 / 3), _f32(2 / 5), _f32(2 / 7), _f32(2 / 9)
# sin a = a − a³/3! + … + a⁹/9!;  cos a = 1 − a²/2! + … − a¹⁰/10!
_S3, _S5, _S7, _S9 = _f32(-1 / 6), _f32(1 / 120), _f32(-1 / 5040), _f32(1 / 362880)
_C4, _C6, _C8, _C10 = _f32(1 / 24), _f32(-1 / 720), _f32(1 / 40320), _f32(-1 / 3628800)


@numba.njit(inline="always", error_model="numpy")
def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    for _ in range(10):
        p0 = np.uint64(c0) * _M0
        p1 = np.uint64(c2) * _M1
        c0, c1, c2, c3 = (
            np.uint32(p1 >> _SHIFT32) ^ c1 ^ k0,
            np.uint32(p1 & _LOW32),
            np.uint32(p0 >> _SHIFT32) ^ c3 ^ k1,
            np.uint32(p0 & _LOW32),
        )
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


@numba.njit(inline="always", error_model="numpy")
def _log(u):
    """ln u for float32 u > 0: u = m·2ᵉ with m ∈ (√½, √2], ln u = 2 artanh((m−1)/(m+1)) + e ln 2."""
    bits = _float_bits(u)
    e = np.float32(np.int32(bits >> _SHIFT23) - _BIAS)
    m = _bits_float((bits & _MANTISSA) | _EXPONENT_ONE)
    above = m > _SQRT2
    m = m * _HALF if above else m
    e = e + _ONE if above else e
    s = (m - _ONE) / (m + _ONE)
    s2 = s * s
    return s * (_TWO + s2 * (_L3 + s2 * (_L5 + s2 * (_L7 + s2 * _L9)))) + e * _LN2


@numba.njit(inline="always", error_model="numpy")
def _box_muller(radius_word, angle_word):
    """(r cos 2πt, r sin 2πt), r = √(−2 ln u): u from the top 23 bits of one Philox word, t from 24 of the
    other; (k + ½)·2⁻²³ is exact in float32 (24 significant bits), so ln u keeps full relative precision
    even next to 1."""
    u = np.float32(np.int32(radius_word >> _SHIFT9)) * _INV_2_23 + _INV_2_24
    r = np.sqrt(-_TWO * _log(u))
    t = np.float32(np.int32(angle_word >> _SHIFT8)) * _INV_2_24
    quadrant = np.floor(t * _FOUR + _HALF)
    a = (t - quadrant * _QUARTER) * _TAU  # 2πt − quadrant·π/2, in [−π/4, π/4]
    a2 = a * a
    sin_a = a * (_ONE + a2 * (_S3 + a2 * (_S5 + a2 * (_S7 + a2 * _S9))))
    cos_a = _ONE + a2 * (-_HALF + a2 * (_C4 + a2 * (_C6 + a2 * (_C8 + a2 * _C10))))
    q = np.int32(quadrant)
    odd = np.float32(q & 1)
    sign = _ONE - np.float32(q & 2)  # −1 in quadrants 2 and 3; q = 4 (t near 1) is a full turn, like 0
    cos_q = (_ONE - odd) * sign  # cos(qπ/2), sin(qπ/2) without a branch
    sin_q = odd * sign
    return r * (cos_a * cos_q - sin_a * sin_q), r * (sin_a * cos_q + cos_a * sin_q)


@numba.njit(**_JIT)
def _shrink_add_blocks(plane0, plane1, plane2, plane3, shrink, sigma, k0, k1, draw_lo, draw_hi, first_block):
    """Blocks first_block, first_block + 1, … into the four planes (a separate function, not inlined:
    LLVM vectorises this loop on its own but not inside a parallel loop's body)."""
    zero = np.uint32(0)
    for b in range(plane0.shape[0]):
        w0, w1, w2, w3 = _philox4x32_10(np.uint32(first_block + b), draw_lo, draw_hi, zero, k0, k1)
        z0, z1 = _box_muller(w0, w1)
        z2, z3 = _box_muller(w2, w3)
        plane0[b] = shrink * plane0[b] + sigma * z0
        plane1[b] = shrink * plane1[b] + sigma * z1
        plane2[b] = shrink * plane2[b] + sigma * z2
        plane3[b] = shrink * plane3[b] + sigma * z3


@numba.njit(**_JIT)
def _shrink_add_tail(tail, shrink, sigma, k0, k1, draw_lo, draw_hi, block):
    """The last n mod 4 elements: z0, z1, z2 of one more block."""
    w0, w1, w2, w3 = _philox4x32_10(np.uint32(block), draw_lo, draw_hi, np.uint32(0), k0, k1)
    z0, z1 = _box_muller(w0, w1)
    z2, _ = _box_muller(w2, w3)
    tail[0] = shrink * tail[0] + sigma * z0
    if tail.shape[0] > 1:
        tail[1] = shrink * tail[1] + sigma * z1
    if tail.shape[0] > 2:
        tail[2] = shrink * tail[2] + sigma * z2


@numba.njit(parallel=True, **_JIT)
def _shrink_add_blocks_parallel(plane0, plane1, plane2, plane3, shrink, sigma, k0, k1, draw_lo, draw_hi, chunk):
    blocks = plane0.shape[0]
    for c in numba.prange((blocks + chunk - 1) // chunk):
        a, b = c * chunk, min(blocks, (c + 1) * chunk)
        _shrink_add_blocks(
            plane0[a:b], plane1[a:b], plane2[a:b], plane3[a:b], shrink, sigma, k0, k1, draw_lo, draw_hi, a
        )


@numba.njit(**_JIT)
def _philox_words(c0, c1, c2, c3, k0, k1):
    return _philox4x32_10(c0, c1, c2, c3, k0, k1)


def _split64(value: int, name: str) -> tuple[np.uint32, np.uint32]:
    if not 0 <= value < 2**64:
        raise ValueError(f"{name} must be an integer in [0, 2**64), got {value}")
    return np.uint32(value & 0xFFFFFFFF), np.uint32(value >> 32)


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """The four 32-bit output words of Philox4x32-10 for one 128-bit counter and 64-bit key."""
    words = _philox_words(*(np.uint32(c) for c in counter), *(np.uint32(k) for k in key))
    return tuple(int(w) for w in words)


_PARALLEL_CHUNK = 4096  # blocks (16,384 values) per parallel task; below 2 chunks a draw runs on one thread


def add_standard_normal(
    target: np.ndarray, key: int, draw: int, sigma: float = 1.0, shrink: float = 1.0, threads: int = 1
) -> None:
    """target ← shrink·target + sigma·ξ in one pass, ξ ~ N(0, I) a function of (``key``, ``draw``) only.

    ``target``: contiguous 1-D float32 or float64.  ``key`` and ``draw`` are integers in [0, 2⁶⁴); use a
    new ``draw`` for every fresh ξ.  Element i < 4·⌊n/4⌋ takes value i mod ⌊n/4⌋ of plane i // ⌊n/4⌋
    (see the module docstring); the last n mod 4 elements take the first values of block ⌊n/4⌋.
    ``threads`` > 1 splits the blocks over that many numba threads (a trial's CPU share, as torch's
    thread count); the values do not depend on it.
    """
    if target.ndim != 1 or target.dtype not in (np.float32, np.float64) or not target.flags.c_contiguous:
        raise ValueError(f"target must be a contiguous 1-D float32/float64 array, got {target.dtype} {target.shape}")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    k0, k1 = _split64(key, "key")
    draw_lo, draw_hi = _split64(draw, "draw")
    blocks = target.shape[0] // 4
    p0, p1, p2, p3 = target[: 4 * blocks].reshape(4, blocks)
    scalar = target.dtype.type
    shrink, sigma = scalar(shrink), scalar(sigma)
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    if threads > 1 and blocks >= 2 * _PARALLEL_CHUNK:
        numba.set_num_threads(threads)
        _shrink_add_blocks_parallel(p0, p1, p2, p3, shrink, sigma, k0, k1, draw_lo, draw_hi, _PARALLEL_CHUNK)
    else:
        _shrink_add_blocks(p0, p1, p2, p3, shrink, sigma, k0, k1, draw_lo, draw_hi, 0)
    if target.shape[0] > 4 * blocks:
        _shrink_add_tail(target[4 * blocks :], shrink, sigma, k0, k1, draw_lo, draw_hi, blocks)


def standard_normal(n: int, key: int, draw: int, dtype: type = np.float32) -> np.ndarray:
    """A new array of ``n`` N(0, 1) values: :func:`add_standard_normal` on zeros."""
    out = np.zeros(n, dtype=dtype)
    add_standard_normal(out, key, draw)
    return out
