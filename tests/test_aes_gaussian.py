"""The AES-NI Gaussian kernel of SGLD/SGHMC: AES-128 against FIPS-197 and an independent pure-Python
cipher, Box–Muller values against float64, the fused gradient term, threads, and the distribution."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ursa_ray.methods import _aes_gaussian
from ursa_ray.methods._aes_gaussian import AESGaussian, aes_available, host_has_vaes, round_keys
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise

pytestmark = pytest.mark.skipif(not aes_available(), reason="this CPU has no AES instructions")
VAES_CHOICES = [False, True] if host_has_vaes() else [False]


# ------------------------------------------------------------ an independent AES-128, byte by byte (FIPS-197)
def xtime(a: int) -> int:
    return ((a << 1) ^ 0x1B) & 0xFF if a & 0x80 else a << 1


def reference_sbox() -> list[int]:
    """Inverse by search over all products, then the affine map as a bit matrix (FIPS-197 eq. 5.1)."""
    def mul(a: int, b: int) -> int:
        out = 0
        for _ in range(8):
            if b & 1:
                out ^= a
            a, b = xtime(a), b >> 1
        return out

    sbox = []
    for a in range(256):
        x = next((y for y in range(1, 256) if mul(a, y) == 1), 0)
        bits = [(x >> i) & 1 for i in range(8)]
        out = [bits[i] ^ bits[(i + 4) % 8] ^ bits[(i + 5) % 8] ^ bits[(i + 6) % 8] ^ bits[(i + 7) % 8] for i in range(8)]
        sbox.append(sum(bit << i for i, bit in enumerate(out)) ^ 0x63)
    return sbox


SBOX = reference_sbox()


def reference_encrypt(key: bytes, block: bytes) -> bytes:
    schedule, rcon = list(key), 1  # the key expansion as a recurrence on bytes: 176 of them, 16 per round
    while len(schedule) < 176:
        last = schedule[-4:]
        if len(schedule) % 16 == 0:  # RotWord, SubWord, Rcon
            last = [SBOX[last[(j + 1) % 4]] for j in range(4)]
            last[0] ^= rcon
            rcon = xtime(rcon)
        schedule += [schedule[j - 16] ^ last[j] for j in range(4)]
    state = [x ^ k for x, k in zip(block, schedule[:16])]  # column-major: state[r + 4c]
    for rnd in range(1, 11):
        state = [SBOX[x] for x in state]
        state = [state[(r + 4 * (c + r)) % 16] for c in range(4) for r in range(4)]  # ShiftRows
        if rnd < 10:  # MixColumns
            mixed = []
            for c in range(4):
                col = state[4 * c : 4 * c + 4]
                total = col[0] ^ col[1] ^ col[2] ^ col[3]
                mixed += [col[r] ^ total ^ xtime(col[r] ^ col[(r + 1) % 4]) for r in range(4)]
            state = mixed
        state = [x ^ k for x, k in zip(state, schedule[16 * rnd : 16 * rnd + 16])]
    return bytes(state)


def test_reference_cipher_and_key_schedule_match_fips_197():
    # FIPS-197 Appendix C.1 (encryption) and Appendix A.1 (the last round key of the expansion)
    key = bytes(range(16))
    plaintext = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert reference_encrypt(key, plaintext).hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"
    a1_key = int.from_bytes(bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c"), "little")
    schedule = round_keys(a1_key)
    assert schedule[0].tobytes().hex() == "2b7e151628aed2a6abf7158809cf4f3c"
    assert schedule[10].tobytes().hex() == "d014f9a8c9ee2589e13f0cc8b6630ca6"


def reference_normals(key: int, draw: int, n: int) -> np.ndarray:
    """The first n values of a draw, from the module docstring's layout, in float64 with numpy's ln, sin, cos."""
    key_bytes = key.to_bytes(16, "little")
    values = []
    for group in range(-(-n // 32)):
        vectors = []
        for k in range(3):  # A, B, C: blocks 6g + 2k and 6g + 2k + 1, four words each
            blocks = [
                reference_encrypt(key_bytes, (6 * group + 2 * k + h).to_bytes(8, "little") + draw.to_bytes(8, "little"))
                for h in (0, 1)
            ]
            vectors.append(np.frombuffer(b"".join(blocks), dtype="<u4").astype(np.int64))
        a, b, c = vectors
        for radius_word, angle_bits in ((a, ((c >> 16) << 8) | (a & 0xFF)), (b, ((c & 0xFFFF) << 8) | (b & 0xFF))):
            r = np.sqrt(-2.0 * np.log((2 * (radius_word >> 9) + 1) * 2.0**-24))
            angle = (np.pi / 2) * ((angle_bits >> 22) + ((angle_bits & (2**22 - 1)) - 2**21 + 0.5) * 2.0**-22)
            values += [r * np.cos(angle), r * np.sin(angle)]
    return np.concatenate(values)[:n]


@pytest.mark.parametrize("vaes", VAES_CHOICES)
@pytest.mark.parametrize("n", [32 * 40, 32 * 7 + 5, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_match_float64_box_muller_of_reference_aes_words(vaes, n, dtype):
    key, draw = 0x0123456789ABCDEF_FEDCBA9876543210, 2**63 + 7  # a draw above 2⁶³ travels as a negative int64
    out = np.zeros(n, dtype=dtype)
    AESGaussian(key, vaes=vaes).add_to(out, draw)
    # float32 rounding of values up to 5.8 is ~3e-7 per operation; a wrong polynomial term is ~1e-3, a wrong
    # word or block a different number altogether
    assert np.max(np.abs(out - reference_normals(key, draw, n))) < 2e-6
    assert np.max(np.abs(out)) <= math.sqrt(48 * math.log(2)) + 1e-5
    if vaes:  # two blocks per instruction: the 128-bit AES-NI path's values, bit for bit
        aes_ni = np.zeros(n, dtype=dtype)
        AESGaussian(key, vaes=False).add_to(aes_ni, draw)
        np.testing.assert_array_equal(out, aes_ni)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shrink_gradient_and_sigma_in_one_pass(dtype):
    generator = AESGaussian(5)
    target = np.linspace(-1, 1, 1001).astype(dtype)
    grad = np.cos(np.arange(1001)).astype(dtype)
    xi = np.zeros(1001, dtype=dtype)
    generator.add_to(xi, 3)
    expected = 0.9 * target - 0.2 * grad + 0.01 * xi
    without_grad = target.copy()
    generator.add_to(without_grad, 3, sigma=0.01, shrink=0.9)
    generator.add_to(target, 3, sigma=0.01, shrink=0.9, grad=grad, lr=0.2)
    tolerance = {"rtol": 1e-6, "atol": 1e-7} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(target, expected, **tolerance)
    np.testing.assert_allclose(without_grad, 0.9 * np.linspace(-1, 1, 1001) + 0.01 * xi, **tolerance)


@pytest.mark.parametrize("n", [1001, 64])
def test_sghmc_momentum_step_in_one_pass(n):
    generator = AESGaussian(8)
    theta, velocity = np.linspace(-1, 1, n), np.sin(np.arange(n))
    grad = np.cos(np.arange(n))
    xi = np.zeros(n)
    generator.add_to(xi, 6)
    expected_velocity = 0.9 * velocity - 0.2 * grad - 0.01 * theta + 0.3 * xi
    expected_theta = theta + expected_velocity
    generator.momentum_step(theta, velocity, grad, 6, sigma=0.3, keep=0.9, lr=0.2, decay=0.01)
    np.testing.assert_allclose(velocity, expected_velocity, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(theta, expected_theta, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(grad, np.cos(np.arange(n)))  # read only


def test_values_do_not_depend_on_the_number_of_threads(monkeypatch):
    monkeypatch.setattr(_aes_gaussian, "_MIN_VALUES_PER_THREAD", 1000)  # split arrays this small too
    n = 3 * 1000 + 32 * 5 + 7  # shares of unequal length (as many as numba has threads) and a partial group
    generator = AESGaussian(11)
    grad = np.linspace(0, 1, n, dtype=np.float32)
    outs = []
    for threads in (1, 2, 3):
        out = np.ones(n, dtype=np.float32)
        generator.add_to(out, 4, sigma=0.5, shrink=0.99, grad=grad, lr=0.1, threads=threads)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 31, 33, 32 * 4 + 29])
def test_partial_last_group_writes_nothing_past_the_end(monkeypatch, n, threads):
    """The kernel finishes a partial group itself: values past ``n`` (here the rest of a larger buffer)
    stay as they were, and the first ``n`` are the values a longer array gets."""
    monkeypatch.setattr(_aes_gaussian, "_MIN_VALUES_PER_THREAD", 16)
    generator = AESGaussian(13)
    longer = np.zeros(n + 40)
    generator.add_to(longer, 2, threads=threads)
    buffers = {name: np.full(n + 40, 7.0) for name in ("theta", "velocity", "grad")}
    views = {name: buffer[:n] for name, buffer in buffers.items()}
    generator.momentum_step(views["theta"], views["velocity"], views["grad"], 2, 1.0, 1.0, 0.0, 0.0, threads)
    np.testing.assert_array_equal(views["velocity"], 7.0 + longer[:n])
    for buffer in buffers.values():
        np.testing.assert_array_equal(buffer[n:], 7.0)


def test_distribution_is_standard_normal():
    n = 1_000_003
    generator = AESGaussian(2024)
    z = np.zeros(n, dtype=np.float64)
    generator.add_to(z, 0)
    se = 1 / math.sqrt(n)
    assert abs(z.mean()) < 4 * se
    assert abs(z.var() - 1) < 4 * math.sqrt(2) * se
    assert abs(stats.skew(z)) < 4 * math.sqrt(6) * se
    assert abs(stats.kurtosis(z)) < 4 * math.sqrt(24) * se
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(np.mean(np.abs(z) > 3) - 2 * stats.norm.sf(3)) < 4 * math.sqrt(2 * stats.norm.sf(3) / n)


def test_draws_and_box_muller_pairs_are_uncorrelated():
    generator = AESGaussian(7)
    first, second = np.zeros(320_000), np.zeros(320_000)
    generator.add_to(first, 1)
    generator.add_to(second, 2)
    bound = 4 / math.sqrt(first.size)
    assert abs(np.corrcoef(first, second)[0, 1]) < bound  # successive draws
    groups = first.reshape(-1, 4, 8)  # per group: cos and sin of pair 1, cos and sin of pair 2, 8 lanes each
    for i, j in ((0, 1), (2, 3), (0, 2), (1, 3)):
        assert abs(np.corrcoef(groups[:, i].ravel(), groups[:, j].ravel())[0, 1]) < 4 / math.sqrt(groups[:, i].size)
    # the radius is shared within a pair: z² of the cosine and the sine are independent only if r and θ are
    assert abs(np.corrcoef(groups[:, 0].ravel() ** 2, groups[:, 1].ravel() ** 2)[0, 1]) < 4 / math.sqrt(
        groups[:, 0].size
    )


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        (np.zeros((2, 3), np.float32), {}, "contiguous 1-D"),
        (np.zeros(5, np.int32), {}, "float32/float64"),
        (np.zeros(10, np.float32)[::2], {}, "contiguous"),
        (np.zeros(5, np.float32), {"draw": -1}, "draw"),
        (np.zeros(5, np.float32), {"draw": 2**64}, "draw"),
        (np.zeros(5, np.float32), {"grad": np.zeros(4, np.float32)}, "grad must match x"),
        (np.zeros(5, np.float32), {"grad": np.zeros(5, np.float64)}, "grad must match x"),
        (np.zeros(5, np.float32), {"grad": np.zeros(10, np.float32)[::2]}, "grad must be a contiguous 1-D"),
        (np.zeros(5, np.float32), {"threads": 0}, "threads"),
    ],
)
def test_rejects_bad_arguments(target, kwargs, message):
    kwargs = {"draw": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        AESGaussian(1).add_to(target, **kwargs)


def test_rejects_bad_keys():
    for key in (-1, 2**128):
        with pytest.raises(ValueError, match="key must be an integer"):
            AESGaussian(key)


def test_gaussian_noise_on_cpu_uses_the_aes_kernel_per_seed():
    n, seed = 5000, 17
    noise = GaussianNoise(torch.zeros(n), torch.Generator().manual_seed(seed))
    first = noise.add_to_(torch.zeros(n), 1.0).numpy().copy()
    second = noise.add_to_(torch.zeros(n), 1.0).numpy()
    key = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(seed)))
    expected = np.zeros((2, n), np.float32)
    AESGaussian(key).add_to(expected[0], 0)
    AESGaussian(key).add_to(expected[1], 1)
    np.testing.assert_array_equal(first, expected[0])
    np.testing.assert_array_equal(second, expected[1])
