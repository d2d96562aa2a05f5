"""Standard-normal vectors on x86-64 CPUs with AES instructions: AES-128 counter blocks through the
Box–Muller transform, in one loop written in LLVM IR (llvmlite) with explicit 8-wide vectors.

This is the fast path of SGLD/SGHMC's per-step N(0, I) draw (:class:`~ursa_ray.methods._sgmcmc_kernels.
GaussianNoise`); CPUs without AES instructions use the Philox kernel of
:mod:`ursa_ray.methods._philox_gaussian`, whose float32 Box–Muller polynomials this kernel shares.  There
the generator takes about 30% of the time (on AVX2 its 32×32→64-bit products run in 64-bit lanes, and its
state crowds the 16 vector registers); an AES round is one instruction (two blocks at once with VAES), and
here the bits take about a fifth (0.2 of 1.0 ns per value, measured by cutting the rounds).

* **Bits**: AES-128 (FIPS-197) in counter mode, Random123's "AESNI" generator (Salmon, Moraes, Dror &
  Shaw 2011), which passes TestU01's BigCrush; as a block cipher it is also unpredictable.  The key is the
  128-bit ``key``; the 128-bit plaintext of block b of a draw is the 64-bit little-endian b followed by
  the 64-bit little-endian ``draw``.  The output block is read as four little-endian 32-bit words.
* **Normals**: group g of a draw is blocks 6g, …, 6g + 5, as three 8-word vectors A = (blocks 6g, 6g + 1),
  B = (6g + 2, 6g + 3), C = (6g + 4, 6g + 5); lane p of a vector is word p mod 4 of its (p div 4)-th block.
  Lane p of (A, B, C) makes two Box–Muller pairs as in the Philox kernel: radius bits A >> 9 and angle
  bits (C >> 16) << 8 | (A & 0xFF), then radius B >> 9 and angle (C & 0xFFFF) << 8 | (B & 0xFF).  Group g
  holds values 32g, …, 32g + 31: the first pair's cosines in lanes 0–7, its sines, then the second pair's
  cosines and sines.  A last partial group is computed whole and cut, in the kernel.
* **Updates** in the same pass as the draw, so no noise buffer is written or read back: x ← shrink·x +
  sigma·ξ; SGLD's whole step θ ← shrink·θ − lr·grad + sigma·ξ; or SGHMC's v ← keep·v − lr·grad −
  decay·θ + sigma·ξ, θ ← θ + v.  Multiply–adds are ``llvm.fmuladd`` (fused where the CPU has FMA), the
  only licence taken with float32 rounding; values agree with a float64 Box–Muller of the same bits to
  2e-6 (``tests/test_aes_gaussian.py``).

The kernels are compiled for the host CPU on first use (0.07 s each; VAES where the CPU has it, else
128-bit AES-NI, with the same values) and called through ctypes.  With ``threads`` > 1 the groups are
split over numba threads (``prange``, calling the kernel by its address; the values do not depend on the
split): measured 130–160 µs on two threads against 220–310 µs on one for 200k values, 60 against 95 µs
for 55k.  (A Python thread pool's hand-off alone took 70–90 µs.)
"""

from __future__ import annotations

import ctypes
import functools
import platform

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ursa_ray.methods import _philox_gaussian as _bm  # the float32 Box–Muller constants

_GROUP = 32  # values per group: six AES blocks, 24 words, 16 Box–Muller pairs
_MIN_VALUES_PER_THREAD = 1 << 13  # a numba thread's start costs a few µs, a few thousand values' work

_I32, _I64, _F32, _F64 = ir.IntType(32), ir.IntType(64), ir.FloatType(), ir.DoubleType()
_V8I, _V8F = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)
_V2Q, _V4Q = ir.VectorType(_I64, 2), ir.VectorType(_I64, 4)


def _host_features() -> dict[str, bool]:
    import llvmlite.binding as llvm

    return dict(llvm.get_host_cpu_features())


def aes_available() -> bool:
    """Whether this CPU can run the kernel: x86-64 with the AES instructions (most x86-64 CPUs since 2010)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return bool(_host_features().get("aes", False))
    except RuntimeError:  # llvmlite cannot name the host's features
        return False


# ---------------------------------------------------------------------------------------------- key schedule
def _gf_mul(a: int, b: int) -> int:
    """Product in GF(2⁸) modulo the AES polynomial x⁸ + x⁴ + x³ + x + 1."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        a = ((a << 1) ^ 0x11B) if a & 0x80 else a << 1
        b >>= 1
    return product


@functools.cache
def _sbox() -> tuple[int, ...]:
    """FIPS-197 §5.1.1: the multiplicative inverse in GF(2⁸) (0 ↦ 0), then the affine map.  Inverses
    through powers of the generator 3: 3ᵏ has inverse 3²⁵⁵⁻ᵏ."""
    power, powers = 1, []
    for _ in range(255):
        powers.append(power)
        power = _gf_mul(power, 3)
    inverse = {0: 0} | {powers[k]: powers[(255 - k) % 255] for k in range(255)}
    table = []
    for a in range(256):
        x = inverse[a]
        rotations = [((x << k) | (x >> (8 - k))) & 0xFF for k in range(1, 5)]
        table.append(x ^ rotations[0] ^ rotations[1] ^ rotations[2] ^ rotations[3] ^ 0x63)
    return tuple(table)


def round_keys(key: int) -> np.ndarray:
    """The 11 AES-128 round keys of the 128-bit integer ``key`` (its 16 little-endian bytes are the cipher
    key), FIPS-197 §5.2, as an (11, 16) uint8 array."""
    if not 0 <= key < 2**128:
        raise ValueError(f"key must be an integer in [0, 2**128), got {key}")
    sbox = _sbox()
    words = [list(key.to_bytes(16, "little")[4 * i : 4 * i + 4]) for i in range(4)]
    rcon = 1
    for i in range(4, 44):
        temp = list(words[i - 1])
        if i % 4 == 0:
            temp = [sbox[b] for b in temp[1:] + temp[:1]]
            temp[0] ^= rcon
            rcon = _gf_mul(rcon, 2)
        words.append([x ^ y for x, y in zip(words[i - 4], temp)])
    return np.array(words, dtype=np.uint8).reshape(11, 16)


# ------------------------------------------------------------------------------------------------- the kernel

def _build_module(dtype: np.dtype, update: str, vaes: bool, triple: str) -> ir.Module:
    """kernel(x, grad, theta, n, shrink, sigma, neg_lr, neg_decay, round_keys, first_group, draw) with ξ
    the values 32·first_group, …, 32·first_group + n − 1 of the draw (module docstring) and the arrays read
    and written from their start, n values each:

    * "noise":    x ← shrink·x + sigma·ξ
    * "gradient": x ← shrink·x + neg_lr·grad + sigma·ξ  (SGLD)
    * "momentum": x ← shrink·x + neg_lr·grad + neg_decay·theta + sigma·ξ, then theta ← theta + x  (SGHMC,
      x the velocity)

    Whole groups run as 8-wide vectors; a last partial group is computed whole and its first n mod 32
    values applied one at a time.  ``round_keys`` is (11, 32) bytes: each round key twice, the broadcast
    VAES needs."""
    module = ir.Module("aes_gaussian")
    module.triple = triple
    real = _F32 if dtype == np.float32 else _F64
    vreal = ir.VectorType(real, 8)

    def declare(name: str, ret: ir.Type, *args: ir.Type) -> ir.Function:
        return ir.Function(module, ir.FunctionType(ret, list(args)), name)

    fmuladd = declare("llvm.fmuladd.v8f32", _V8F, _V8F, _V8F, _V8F)
    fmuladd_vector = fmuladd if real is _F32 else declare("llvm.fmuladd.v8f64", vreal, vreal, vreal, vreal)
    fmuladd_scalar = declare("llvm.fmuladd.f32" if real is _F32 else "llvm.fmuladd.f64", real, real, real, real)
    sqrt = declare("llvm.sqrt.v8f32", _V8F, _V8F)
    block = _V4Q if vaes else _V2Q
    suffix = ".256" if vaes else ""
    aesenc = declare("llvm.x86.aesni.aesenc" + suffix, block, block, block)
    aesenclast = declare("llvm.x86.aesni.aesenclast" + suffix, block, block, block)

    real_ptr = ir.PointerType(real)
    kernel = ir.Function(
        module,
        ir.FunctionType(
            ir.VoidType(),
            [real_ptr, real_ptr, real_ptr, _I64, real, real, real, real, ir.PointerType(_V4Q), _I64, _I64],
        ),
        "kernel",
    )
    target, grad, theta, n, shrink, sigma, neg_lr, neg_decay, keys_ptr, first_group, draw = kernel.args
    blocks = {name: kernel.append_basic_block(name) for name in ("entry", "loop", "after", "tail", "rest", "done")}

    b = ir.IRBuilder(blocks["entry"])

    def ints(value: int) -> ir.Constant:
        return ir.Constant(_V8I, [value & 0xFFFFFFFF] * 8)

    def floats(value: float) -> ir.Constant:
        return ir.Constant(_V8F, [float(np.float32(value))] * 8)

    def lanes(values: list[int]) -> ir.Constant:
        return ir.Constant(ir.VectorType(_I32, len(values)), values)

    def broadcast(scalar: ir.Value) -> ir.Value:
        vector = b.insert_element(ir.Constant(vreal, ir.Undefined), scalar, ir.Constant(_I32, 0))
        return b.shuffle_vector(vector, vector, lanes([0] * 8))

    keys = [b.load(b.gep(keys_ptr, [ir.Constant(_I64, r)]), align=16) for r in range(11)]
    if not vaes:
        keys = [b.shuffle_vector(k, k, lanes([0, 1])) for k in keys]
    scalars = (shrink, sigma, neg_lr, neg_decay)
    vectors = tuple(broadcast(c) for c in scalars)
    draw_lanes = b.insert_element(
        b.insert_element(ir.Constant(_V4Q, [0] * 4), draw, ir.Constant(_I32, 1)), draw, ir.Constant(_I32, 3)
    )
    groups = b.lshr(n, ir.Constant(_I64, 5))
    b.cbranch(b.icmp_signed(">", groups, ir.Constant(_I64, 0)), blocks["loop"], blocks["after"])

    def group_values(b: ir.IRBuilder, group: ir.Value) -> list[ir.Value]:
        """The 32 float32 values of ``group``, as four 8-lane vectors (module docstring)."""
        first_block = b.mul(group, ir.Constant(_I64, 6))
        counter = b.insert_element(ir.Constant(_V4Q, [0] * 4), first_block, ir.Constant(_I32, 0))
        counter = b.add(b.shuffle_vector(counter, counter, lanes([0, 1, 0, 1])), draw_lanes)  # (6g, draw, 6g, draw)
        plaintexts = [b.add(counter, ir.Constant(_V4Q, [2 * k, 0, 2 * k + 1, 0])) for k in range(3)]
        if not vaes:  # two 128-bit blocks per vector
            plaintexts = [b.shuffle_vector(p, p, lanes([h, h + 1])) for p in plaintexts for h in (0, 2)]
        states = [b.xor(p, keys[0]) for p in plaintexts]
        for r in range(1, 10):  # round by round over all blocks: independent instructions side by side
            states = [b.call(aesenc, [s, keys[r]]) for s in states]
        states = [b.call(aesenclast, [s, keys[10]]) for s in states]
        if not vaes:
            states = [b.shuffle_vector(states[j], states[j + 1], lanes([0, 1, 2, 3])) for j in (0, 2, 4)]
        a_words, b_words, c_words = (b.bitcast(s, _V8I) for s in states)
        low8 = ints(0xFF)
        z0, z1 = box_muller(
            b, b.lshr(a_words, ints(9)), b.or_(b.shl(b.lshr(c_words, ints(16)), ints(8)), b.and_(a_words, low8))
        )
        z2, z3 = box_muller(
            b, b.lshr(b_words, ints(9)), b.or_(b.shl(b.and_(c_words, ints(0xFFFF)), ints(8)), b.and_(b_words, low8))
        )
        return [z0, z1, z2, z3]

    def box_muller(b: ir.IRBuilder, radius_bits: ir.Value, angle_bits: ir.Value) -> tuple[ir.Value, ir.Value]:
        """As :func:`ursa_ray.methods._philox_gaussian._box_muller`: r = √(−2 ln u), u = (2k + 1)·2⁻²⁴;
        θ = qπ/2 + a from the quadrant q (top 2 angle bits) and a ∈ (−π/4, π/4) (the other 22)."""
        u = b.fmul(b.sitofp(b.or_(b.shl(radius_bits, ints(1)), ints(1)), _V8F), floats(2.0**-24))
        bits = b.add(b.bitcast(u, _V8I), ints(int(_bm._ONE_MINUS_SQRT_HALF_BITS)))
        exponent = b.sitofp(b.sub(b.lshr(bits, ints(23)), ints(127)), _V8F)
        f = b.bitcast(b.add(b.and_(bits, ints(int(_bm._MANTISSA))), ints(int(_bm._SQRT_HALF_BITS))), _V8F)
        f = b.fsub(f, floats(1.0))
        poly = floats(_bm._L7)
        for c in (_bm._L6, _bm._L5, _bm._L4, _bm._L3, _bm._L2, _bm._L1, _bm._L0):
            poly = b.call(fmuladd, [f, poly, floats(c)])
        log_u = b.call(fmuladd, [b.fmul(f, f), b.call(fmuladd, [f, poly, floats(-0.5)]), f])
        log_u = b.call(fmuladd, [exponent, floats(_bm._LN2), log_u])  # ln(1 + f) + e ln 2
        r = b.call(sqrt, [b.fmul(floats(-2.0), log_u)])
        quadrant = b.lshr(angle_bits, ints(22))
        centred = b.sitofp(b.sub(b.and_(angle_bits, ints(0x3FFFFF)), ints(2**21)), _V8F)
        a = b.call(fmuladd, [centred, floats(_bm._QUARTER_TURN_2_22), floats(_bm._HALF_QUARTER_TURN_2_22)])
        a2 = b.fmul(a, a)
        sin_poly = floats(_bm._S3)
        for c in (_bm._S2, _bm._S1, _bm._S0):
            sin_poly = b.call(fmuladd, [a2, sin_poly, floats(c)])
        sin_a = b.fmul(a, sin_poly)
        cos_a = floats(_bm._C4)
        for c in (_bm._C3, _bm._C2, _bm._C1, _bm._C0):
            cos_a = b.call(fmuladd, [a2, cos_a, floats(c)])
        odd = b.icmp_unsigned("!=", b.and_(quadrant, ints(1)), ints(0))
        x = b.fmul(r, b.select(odd, sin_a, cos_a))  # cos θ = (cos a, −sin a, −cos a, sin a)[q]
        y = b.fmul(r, b.select(odd, cos_a, sin_a))  # sin θ = (sin a, cos a, −sin a, −cos a)[q]
        x_sign = b.shl(b.and_(b.add(quadrant, ints(1)), ints(2)), ints(30))  # where q ∈ {1, 2}
        y_sign = b.shl(b.and_(quadrant, ints(2)), ints(30))  # where q ∈ {2, 3}
        return (
            b.bitcast(b.xor(b.bitcast(x, _V8I), x_sign), _V8F),
            b.bitcast(b.xor(b.bitcast(y, _V8I), y_sign), _V8F),
        )

    def apply(b: ir.IRBuilder, index: ir.Value, z: ir.Value, vector: bool) -> None:
        """The update at ``index`` (8 values from it when ``vector``), ξ = ``z`` (float32)."""
        kind = vreal if vector else real
        shrink_c, sigma_c, neg_lr_c, neg_decay_c = vectors if vector else scalars
        fma = fmuladd_vector if vector else fmuladd_scalar
        target_ptr, grad_ptr, theta_ptr = (
            b.bitcast(b.gep(x, [index]), ir.PointerType(kind)) for x in (target, grad, theta)
        )
        z = z if real is _F32 else b.fpext(z, kind)
        value = b.fmul(shrink_c, b.load(target_ptr, align=4))
        if update != "noise":
            value = b.call(fma, [neg_lr_c, b.load(grad_ptr, align=4), value])
        if update == "momentum":
            theta_value = b.load(theta_ptr, align=4)
            value = b.call(fma, [neg_decay_c, theta_value, value])
        value = b.call(fma, [sigma_c, z, value])
        b.store(value, target_ptr, align=4)
        if update == "momentum":
            b.store(b.fadd(theta_value, value), theta_ptr, align=4)

    b = ir.IRBuilder(blocks["loop"])
    i = b.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), blocks["entry"])
    offset = b.mul(i, ir.Constant(_I64, _GROUP))
    for j, z in enumerate(group_values(b, b.add(first_group, i))):
        apply(b, b.add(offset, ir.Constant(_I64, 8 * j)), z, vector=True)
    following = b.add(i, ir.Constant(_I64, 1))
    i.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", following, groups), blocks["loop"], blocks["after"])

    b = ir.IRBuilder(blocks["after"])
    start = b.shl(groups, ir.Constant(_I64, 5))
    b.cbranch(b.icmp_signed("<", start, n), blocks["tail"], blocks["done"])

    b = ir.IRBuilder(blocks["tail"])  # the partial last group: all 32 values to the stack, n − start applied
    stack = b.alloca(ir.ArrayType(_V8F, 4))
    for j, z in enumerate(group_values(b, b.add(first_group, groups))):
        b.store(z, b.gep(stack, [ir.Constant(_I32, 0), ir.Constant(_I32, j)]), align=32)
    stack_values = b.bitcast(stack, ir.PointerType(_F32))
    b.branch(blocks["rest"])

    b = ir.IRBuilder(blocks["rest"])
    k = b.phi(_I64)
    k.add_incoming(ir.Constant(_I64, 0), blocks["tail"])
    apply(b, b.add(start, k), b.load(b.gep(stack_values, [k]), align=4), vector=False)
    following = b.add(k, ir.Constant(_I64, 1))
    k.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", b.add(start, following), n), blocks["rest"], blocks["done"])

    ir.IRBuilder(blocks["done"]).ret_void()
    return module


_engines: list[object] = []  # the compiled code lives as long as its execution engine


def host_has_vaes() -> bool:
    """Whether the CPU has VAES (AES rounds on two blocks per instruction) and AVX2."""
    features = _host_features()
    return bool(features.get("vaes", False) and features.get("avx2", False))


@functools.cache
def _kernel(dtype: type, update: str, vaes: bool) -> ctypes._CFuncPtr:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_process_triple()
    module = _build_module(np.dtype(dtype), update, vaes, triple)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    machine = llvm.Target.from_triple(triple).create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    passes.getModulePassManager().run(parsed, passes)
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    _engines.append(engine)
    real = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    signature = ctypes.CFUNCTYPE(
        None, pointer, pointer, pointer, integer, real, real, real, real, pointer, integer, integer
    )
    return signature(engine.get_function_address("kernel"))


@intrinsic
def _call_kernel(  # noqa: ARG001 (numba's intrinsic signature)
    typingctx, address, x, grad, theta, count, shrink, sigma, neg_lr, neg_decay, keys, first, draw
):
    """Call the compiled kernel at ``address`` from numba (pointers passed as integers)."""
    signature = types.void(address, x, grad, theta, count, shrink, sigma, neg_lr, neg_decay, keys, first, draw)

    def codegen(context, builder, signature, args):
        real = context.get_value_type(signature.args[5])
        pointer, byte_pointer = ir.PointerType(real), ir.PointerType(ir.IntType(8))
        function_type = ir.FunctionType(
            ir.VoidType(), [pointer] * 3 + [_I64] + [real] * 4 + [byte_pointer, _I64, _I64]
        )
        function = builder.inttoptr(args[0], function_type.as_pointer())
        arrays = [builder.inttoptr(a, pointer) for a in args[1:4]]
        keys_pointer = builder.inttoptr(args[9], byte_pointer)
        builder.call(function, arrays + list(args[4:9]) + [keys_pointer] + list(args[10:]))
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(parallel=True, cache=True)
def _run_shares(address, x, grad, theta, itemsize, bounds, n, shrink, sigma, neg_lr, neg_decay, keys, draw):
    """Groups bounds[s] … bounds[s + 1] − 1 on numba thread s, the last share to value n (arrays as
    addresses of their first element)."""
    for s in numba.prange(bounds.shape[0] - 1):
        start = bounds[s] * _GROUP
        count = min(bounds[s + 1] * _GROUP, n) - start
        offset = start * itemsize
        _call_kernel(
            address, x + offset, grad + offset, theta + offset, count, shrink, sigma, neg_lr, neg_decay, keys,
            bounds[s], draw,
        )


class AESGaussian:
    """A stream of N(0, I) vectors under one 128-bit ``key``; :meth:`add_to` with a new ``draw`` each time."""

    def __init__(self, key: int, vaes: bool | None = None):
        """``vaes``: use VAES (default: where the CPU has it); the values are the same either way."""
        if not aes_available():
            raise RuntimeError("this CPU has no AES instructions; use ursa_ray.methods._philox_gaussian")
        self.vaes = host_has_vaes() if vaes is None else vaes
        if self.vaes and not host_has_vaes():
            raise RuntimeError("this CPU has no VAES instructions")
        keys = round_keys(key)
        self._round_keys = np.ascontiguousarray(np.concatenate([keys, keys], axis=1))  # (11, 32)

    def add_to(
        self,
        target: np.ndarray,
        draw: int,
        sigma: float = 1.0,
        shrink: float = 1.0,
        grad: np.ndarray | None = None,
        lr: float = 0.0,
        threads: int = 1,
    ) -> None:
        """target ← shrink·target − lr·grad + sigma·ξ in one pass (no gradient term when ``grad`` is None),
        ξ ~ N(0, I) a function of (key, ``draw``) only: SGLD's update, with ``shrink`` = 1 − η/σₚ².

        ``target`` (and ``grad``, of the same shape and dtype): contiguous 1-D float32 or float64.  ``draw``
        in [0, 2⁶⁴), a new one for every fresh ξ.  ``threads`` > 1 splits the work over that many threads
        (the values do not depend on it)."""
        arrays = {"x": target} if grad is None else {"x": target, "grad": grad}
        self._apply("noise" if grad is None else "gradient", arrays, (shrink, sigma, -lr, 0.0), draw, threads)

    def momentum_step(
        self,
        theta: np.ndarray,
        velocity: np.ndarray,
        grad: np.ndarray,
        draw: int,
        sigma: float,
        keep: float,
        lr: float,
        decay: float,
        threads: int = 1,
    ) -> None:
        """SGHMC's update in one pass: velocity ← keep·velocity − lr·grad − decay·theta + sigma·ξ, then
        theta ← theta + velocity (arrays and ``draw`` as in :meth:`add_to`)."""
        arrays = {"x": velocity, "grad": grad, "theta": theta}
        self._apply("momentum", arrays, (keep, sigma, -lr, -decay), draw, threads)

    def _apply(
        self, update: str, arrays: dict[str, np.ndarray], coefficients: tuple, draw: int, threads: int
    ) -> None:
        first = next(iter(arrays.values()))
        for name, array in arrays.items():
            if array.ndim != 1 or array.dtype not in (np.float32, np.float64) or not array.flags.c_contiguous:
                raise ValueError(
                    f"{name} must be a contiguous 1-D float32/float64 array, got {array.dtype} {array.shape}"
                )
            if array.shape != first.shape or array.dtype != first.dtype:
                raise ValueError(f"{name} must match x ({first.dtype} {first.shape}), got {array.dtype} {array.shape}")
        if not 0 <= draw < 2**64:
            raise ValueError(f"draw must be an integer in [0, 2**64), got {draw}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        kernel = _kernel(first.dtype.type, update, self.vaes)
        scalars = [first.dtype.type(c) for c in coefficients]
        draw_bits = draw - 2**64 if draw >= 2**63 else draw  # the same 64 bits, as ctypes' int64
        pointers = [arrays[name].ctypes.data if name in arrays else 0 for name in ("x", "grad", "theta")]
        n = first.shape[0]
        threads = min(threads, numba.config.NUMBA_NUM_THREADS, max(1, n // _MIN_VALUES_PER_THREAD))
        if threads > 1:
            numba.set_num_threads(threads)
            groups = -(-n // _GROUP)
            bounds = np.array([groups * t // threads for t in range(threads + 1)], dtype=np.int64)
            address = ctypes.cast(kernel, ctypes.c_void_p).value
            _run_shares(
                address, *pointers, first.itemsize, bounds, n, *scalars, self._round_keys.ctypes.data, draw_bits
            )
        elif n:
            kernel(*pointers, n, *scalars, self._round_keys.ctypes.data, 0, draw_bits)
