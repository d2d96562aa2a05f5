"""Fast standard-normal vectors on the CPU: Philox4x32-10 counters through a vectorised Box–Muller transform.

SGLD/SGHMC draw their noise on the CPU with this kernel (:class:`~ursa_ray.methods._sgmcmc_kernels.
GaussianNoise`; where numba cannot be imported they fall back to torch's ``normal_``).

SGLD and SGHMC draw one N(0, I) vector of every parameter at every step.  On one CPU thread torch's
``Tensor.normal_`` spends about 3 ns per value in its scalar MT19937 generator alone (4–6 ns per normal
in all), which made the draw 21–47% of a plain SGD epoch; numpy's generators, MKL's (through
``mkl_random``), JAX's and an inductor-compiled kernel were measured no faster than 2.5 ns
(``benchmarks/bench_samplers.py`` prints the comparison with ``normal_``).  This module compiles one loop
with numba that LLVM vectorises (AVX2: eight lanes), at about 1.4 ns per normal on one thread:

* **Bits**: Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2,
  3"), the counter-based generator of cuRAND and of torch on CUDA.  Block ``c`` of a draw is the
  128-bit counter ``(c, draw_lo, draw_hi, 0)`` under the 64-bit key; the known-answer vectors of the
  Random123 distribution are checked in ``tests/test_philox_gaussian.py``.
* **Normals**: the Box–Muller transform (Box & Muller 1958).  A pair takes 47 bits: 23 for the radius,
  u = (k + ½)·2⁻²³, r = √(−2 ln u), and 24 for the angle θ, uniform on a grid of 2²⁴ angles.  So three
  32-bit words make two pairs, and the 12 words of three Philox blocks make 16 normals, with no bit
  drawn twice or wasted beyond one per pair.  |z| ≤ √(48 ln 2) ≈ 5.77, the bound of torch's CPU
  ``normal_`` (24-bit uniforms) too.  ln, sin and cos are float32 polynomials (Chebyshev fits) after exact
  range reduction, so the values agree with a float64 Box–Muller of the same bits to float32 rounding
  (tested to 2e-6 absolute; measured 6e-7).

Lane l of a draw is Philox blocks 3l, 3l + 1, 3l + 2 and yields 16 values.  The target is cut into
chunks of 16,000 values; chunk c holds lanes 1000c, …, 1000c + 999 as 16 planes of 1000 (value j of lane
1000c + i at 16000c + 1000j + i).  The last m < 16,000 values hold the next ⌊m/16⌋ lanes as 16 planes of
⌊m/16⌋, and their last m mod 16 the first values of one more lane.  The kernel adds
the values in the same pass as it scales the target (for SGLD the prior's shrink,
θ ← (1 − η/σₚ²)θ + √(2ηT)ξ), so no noise buffer is written or read back.  With ``threads`` > 1 the chunks
are split over numba threads (``prange``), for trials holding more than one CPU; the values do not depend
on the split.  The only fast-math flag is contraction into fused multiply-adds, so a given (key,
counter) yields the same values on every machine with FMA (the last bits may differ on one without).
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

# numpy error model: no zero-division branch, so LLVM vectorises; "contract": a·b + c may become one fused
# multiply-add (where the CPU has FMA), the only fast-math flag.
_JIT_FLAGS = {"error_model": "numpy", "fastmath": {"contract"}}
_JIT = _JIT_FLAGS | {"cache": True}


def _bitcast(context, builder, signature, args):
    """The argument's bits reinterpreted as the return type (LLVM ``bitcast``: no instruction emitted)."""
    return builder.bitcast(args[0], context.get_value_type(signature.return_type))


@intrinsic
def _float_bits(typingctx, x):  # noqa: ARG001 (numba's intrinsic signature)
    return types.uint32(types.float32), _bitcast


@intrinsic
def _bits_float(typingctx, x):  # noqa: ARG001
    return types.float32(types.uint32), _bitcast


# Philox4x32 multipliers and Weyl key increments (Salmon et al. 2011, Table 2).
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW32, _SHIFT32 = np.uint64(0xFFFFFFFF), np.uint64(32)

_LANE_VALUES = 16  # normals per lane: three Philox blocks, eight Box–Muller pairs
# Lanes per chunk, the unit of work of a thread: 16,000 values.  Not a power of two: rows 4 KiB apart would
# fall in the same L1 cache sets, and the 16 row streams would evict each other (measured 35% slower).
_CHUNK_LANES = 1000
_CHUNK_VALUES = _LANE_VALUES * _CHUNK_LANES
_MAX_VALUES = _LANE_VALUES * ((2**32 - 3) // 3 + 1)  # block counters 3·lane + 2 stay below 2³²

_f32 = np.float32
_MANTISSA, _BIAS = np.uint32(0x007FFFFF), np.int32(127)
_SQRT_HALF_BITS = np.uint32(0x3F3504F3)  # float32 √½
_ONE_MINUS_SQRT_HALF_BITS = np.uint32(0x3F800000 - 0x3F3504F3)
_SHIFT30, _SHIFT23, _SHIFT22, _SHIFT16 = np.uint32(30), np.uint32(23), np.uint32(22), np.uint32(16)
_SHIFT9, _SHIFT8 = np.uint32(9), np.uint32(8)
_LOW8, _LOW16, _LOW22 = np.uint32(0xFF), np.uint32(0xFFFF), np.uint32(0x3FFFFF)
_ZERO_BITS, _ONE_BIT, _TWO_BITS = np.uint32(0), np.uint32(1), np.uint32(2)
_TWO_TO_21 = np.int32(2**21)
_ONE, _HALF, _TWO = _f32(1.0), _f32(0.5), _f32(2.0)
_INV_2_24 = _f32(2.0**-24)
_LN2 = _f32(0.6931471805599453)
_QUARTER_TURN_2_22 = _f32(1.5707963267948966 * 2.0**-22)  # (π/2)·2⁻²²
_HALF_QUARTER_TURN_2_22 = _f32(0.5 * 1.5707963267948966 * 2.0**-22)
# Polynomials fitted by Chebyshev interpolation in float64 (degree, largest error of the fit):
# ln(1 + f) = f − f²/2 + f³·L(f) on f ∈ [√½ − 1, √2 − 1]  (L of degree 7, relative error 2.4e-8)
_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7 = (
    _f32(c)
    for c in (
        0.33333328596742190,
        -0.25000296546003276,
        0.20001468579776010,
        -0.16642247599706012,
        0.14202173760870668,
        -0.12972238887706514,
        0.12712308059287447,
        -0.08101559079491110,
    )
)
# sin a = a·S(a²), cos a = C(a²) on |a| ≤ π/4  (S of degree 3, error 3.1e-9; C of degree 4, error 4.7e-11)
_S0, _S1, _S2, _S3 = (
    _f32(c) for c in (0.99999999692202610, -0.16666650686603554, 0.00833203633044176, -0.00019503963125624)
)
_C0, _C1, _C2, _C3, _C4 = (
    _f32(c)
    for c in (0.99999999995254480, -0.49999999615145724, 0.04166661671588412, -0.00138866186052523, 2.4379880333e-05)
)


@numba.njit(inline="always", **_JIT_FLAGS)
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


@numba.njit(inline="always", **_JIT_FLAGS)
def _log(u):
    """ln u for float32 u > 0: u = m·2ᵉ with m ∈ [√½, √2) (the exponent split by integer arithmetic on the
    bits), ln u = ln(1 + f) + e ln 2 with f = m − 1, exact by Sterbenz's lemma."""
    bits = _float_bits(u) + _ONE_MINUS_SQRT_HALF_BITS
    e = np.float32(np.int32(bits >> _SHIFT23) - _BIAS)
    f = _bits_float((bits & _MANTISSA) + _SQRT_HALF_BITS) - _ONE
    poly = _L0 + f * (_L1 + f * (_L2 + f * (_L3 + f * (_L4 + f * (_L5 + f * (_L6 + f * _L7))))))
    return f + f * f * (f * poly - _HALF) + e * _LN2


@numba.njit(inline="always", **_JIT_FLAGS)
def _box_muller(radius_bits, angle_bits):
    """(r cos θ, r sin θ) with r = √(−2 ln u), u = (k + ½)·2⁻²³ for the 23-bit integer k = ``radius_bits``
    (exact in float32, so ln u keeps full relative precision even next to 1), and θ = qπ/2 + a from the
    24-bit k' = ``angle_bits``: quadrant q its top 2 bits, a = (s − 2²¹ + ½)·(π/2)·2⁻²² ∈ (−π/4, π/4) from
    the other 22 (s).  θ is uniform on a grid of 2²⁴ angles, a fixed rotation of 2πk'/2²⁴ (so (r cos θ,
    r sin θ) has the same distribution)."""
    u = np.float32(np.int32((radius_bits << _ONE_BIT) | _ONE_BIT)) * _INV_2_24  # (2k + 1)·2⁻²⁴, exact
    r = np.sqrt(-_TWO * _log(u))
    q = angle_bits >> _SHIFT22
    centred = np.float32(np.int32(angle_bits & _LOW22) - _TWO_TO_21)  # s − 2²¹, exact
    a = centred * _QUARTER_TURN_2_22 + _HALF_QUARTER_TURN_2_22
    a2 = a * a
    sin_a = a * (_S0 + a2 * (_S1 + a2 * (_S2 + a2 * _S3)))
    cos_a = _C0 + a2 * (_C1 + a2 * (_C2 + a2 * (_C3 + a2 * _C4)))
    odd = (q & _ONE_BIT) != _ZERO_BITS
    x = r * (sin_a if odd else cos_a)  # cos θ = (cos a, −sin a, −cos a, sin a)[q]
    y = r * (cos_a if odd else sin_a)  # sin θ = (sin a, cos a, −sin a, −cos a)[q]
    x_sign = ((q + _ONE_BIT) & _TWO_BITS) << _SHIFT30  # the sign bit where q ∈ {1, 2}
    y_sign = (q & _TWO_BITS) << _SHIFT30  # where q ∈ {2, 3}
    return _bits_float(_float_bits(x) ^ x_sign), _bits_float(_float_bits(y) ^ y_sign)


@numba.njit(inline="always", **_JIT_FLAGS)
def _shrink_add_two_pairs(planes, row, lane, shrink, sigma, a, b, c):
    """Rows row..row+3 of ``lane`` from three words: radii from the top 23 bits of a and of b, angles from
    24 bits each (16 of c with the low 8 of a, resp. of b)."""
    z0, z1 = _box_muller(a >> _SHIFT9, ((c >> _SHIFT16) << _SHIFT8) | (a & _LOW8))
    z2, z3 = _box_muller(b >> _SHIFT9, ((c & _LOW16) << _SHIFT8) | (b & _LOW8))
    planes[row, lane] = shrink * planes[row, lane] + sigma * z0
    planes[row + 1, lane] = shrink * planes[row + 1, lane] + sigma * z1
    planes[row + 2, lane] = shrink * planes[row + 2, lane] + sigma * z2
    planes[row + 3, lane] = shrink * planes[row + 3, lane] + sigma * z3


@numba.njit(**_JIT)
def _shrink_add_lanes(planes, shrink, sigma, k0, k1, draw_lo, draw_hi, first_lane):
    """Lanes first_lane, first_lane + 1, … into the columns of the 16 rows of ``planes`` (a separate
    function, not inlined: LLVM vectorises this loop on its own but not inside a parallel loop's body)."""
    zero = np.uint32(0)
    for lane in range(planes.shape[1]):
        block = np.uint32(3 * (first_lane + lane))
        a0, a1, a2, a3 = _philox4x32_10(block, draw_lo, draw_hi, zero, k0, k1)
        b0, b1, b2, b3 = _philox4x32_10(block + np.uint32(1), draw_lo, draw_hi, zero, k0, k1)
        c0, c1, c2, c3 = _philox4x32_10(block + np.uint32(2), draw_lo, draw_hi, zero, k0, k1)
        _shrink_add_two_pairs(planes, 0, lane, shrink, sigma, a0, a1, a2)
        _shrink_add_two_pairs(planes, 4, lane, shrink, sigma, a3, b0, b1)
        _shrink_add_two_pairs(planes, 8, lane, shrink, sigma, b2, b3, c0)
        _shrink_add_two_pairs(planes, 12, lane, shrink, sigma, c1, c2, c3)


@numba.njit(**_JIT)
def _shrink_add_chunk(values, c, shrink, sigma, k0, k1, draw_lo, draw_hi):
    """Chunk c of ``values`` (whole chunks only): lanes 1000c, …, 1000c + 999 as 16 rows of 1000."""
    chunk = values[c * _CHUNK_VALUES : (c + 1) * _CHUNK_VALUES].reshape(_LANE_VALUES, _CHUNK_LANES)
    _shrink_add_lanes(chunk, shrink, sigma, k0, k1, draw_lo, draw_hi, c * _CHUNK_LANES)


@numba.njit(**_JIT)
def _shrink_add_chunks(values, shrink, sigma, k0, k1, draw_lo, draw_hi):
    for c in range(values.shape[0] // _CHUNK_VALUES):
        _shrink_add_chunk(values, c, shrink, sigma, k0, k1, draw_lo, draw_hi)


@numba.njit(parallel=True, **_JIT)
def _shrink_add_chunks_parallel(values, shrink, sigma, k0, k1, draw_lo, draw_hi):
    for c in numba.prange(values.shape[0] // _CHUNK_VALUES):
        _shrink_add_chunk(values, c, shrink, sigma, k0, k1, draw_lo, draw_hi)


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


def add_standard_normal(
    target: np.ndarray, key: int, draw: int, sigma: float = 1.0, shrink: float = 1.0, threads: int = 1
) -> None:
    """target ← shrink·target + sigma·ξ in one pass, ξ ~ N(0, I) a function of (``key``, ``draw``) only.

    ``target``: contiguous 1-D float32 or float64, at most 16·⌈(2³² − 2)/3⌉ ≈ 2.3·10¹⁰ elements.  ``key``
    and ``draw`` are integers in [0, 2⁶⁴); use a new ``draw`` for every fresh ξ.  The layout of the values
    is the module docstring's (chunks of 16 planes).  ``threads`` > 1 splits the chunks over that many
    numba threads (a trial's CPU share, as torch's thread count); the values do not depend on it.
    """
    if target.ndim != 1 or target.dtype not in (np.float32, np.float64) or not target.flags.c_contiguous:
        raise ValueError(f"target must be a contiguous 1-D float32/float64 array, got {target.dtype} {target.shape}")
    if target.shape[0] > _MAX_VALUES:
        raise ValueError(f"target has {target.shape[0]} elements; at most {_MAX_VALUES} fit one counter space")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    k0, k1 = _split64(key, "key")
    draw_lo, draw_hi = _split64(draw, "draw")
    scalar = target.dtype.type
    shrink, sigma = scalar(shrink), scalar(sigma)
    chunks = target.shape[0] // _CHUNK_VALUES
    whole = target[: chunks * _CHUNK_VALUES]
    threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    if threads > 1 and chunks >= 2:
        numba.set_num_threads(threads)
        _shrink_add_chunks_parallel(whole, shrink, sigma, k0, k1, draw_lo, draw_hi)
    else:
        _shrink_add_chunks(whole, shrink, sigma, k0, k1, draw_lo, draw_hi)
    rest = target[chunks * _CHUNK_VALUES :]  # a shorter last chunk: 16 rows of ⌊len/16⌋, then a tail
    lanes = rest.shape[0] // _LANE_VALUES
    first_lane = chunks * _CHUNK_LANES
    if lanes:
        planes = rest[: _LANE_VALUES * lanes].reshape(_LANE_VALUES, lanes)
        _shrink_add_lanes(planes, shrink, sigma, k0, k1, draw_lo, draw_hi, first_lane)
    tail = rest[_LANE_VALUES * lanes :]
    if tail.shape[0]:  # one more lane, computed whole in a scratch column, of which the tail keeps the first values
        column = np.zeros((_LANE_VALUES, 1), dtype=target.dtype)
        column[: tail.shape[0], 0] = tail
        _shrink_add_lanes(column, shrink, sigma, k0, k1, draw_lo, draw_hi, first_lane + lanes)
        tail[:] = column[: tail.shape[0], 0]


def standard_normal(n: int, key: int, draw: int, dtype: type = np.float32) -> np.ndarray:
    """A new array of ``n`` N(0, 1) values: :func:`add_standard_normal` on zeros."""
    out = np.zeros(n, dtype=dtype)
    add_standard_normal(out, key, draw)
    return out
