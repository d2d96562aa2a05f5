"""The CPU Gaussian kernel of SGLD/SGHMC: Philox4x32-10 bits (known-answer vectors, and an independent
numpy implementation), Box–Muller values against float64, and the distribution of what comes out."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from ursa_ray.methods._philox_gaussian import add_standard_normal, philox4x32_10, standard_normal
from ursa_ray.methods._sgmcmc_kernels import GaussianNoise

# Random123's kat_vectors for philox4x32, 10 rounds: (counter, key) -> output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def reference_philox(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 on rows of a (B, 4) uint64 array of 32-bit counters, in numpy (no numba)."""
    mask = np.uint64(0xFFFFFFFF)
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0 = c[0] * np.uint64(0xD2511F53)
        p1 = c[2] * np.uint64(0xCD9E8D57)
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & mask]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return np.stack(c, axis=1)


def reference_lane_values(key: int, draw: int, lanes: int) -> np.ndarray:
    """(lanes, 16): the normals of lanes 0..lanes−1, computed in float64 with numpy's ln, sin, cos."""
    counters = np.zeros((3 * lanes, 4), dtype=np.uint64)  # blocks 3l, 3l + 1, 3l + 2 of lane l
    counters[:, 0] = np.arange(3 * lanes)
    counters[:, 1], counters[:, 2] = draw & 0xFFFFFFFF, draw >> 32
    words = reference_philox(counters, (key & 0xFFFFFFFF, key >> 32)).reshape(lanes, 12)
    values = []  # two Box–Muller pairs from each of the four word triples
    for i in range(4):
        a, b, c = words[:, 3 * i], words[:, 3 * i + 1], words[:, 3 * i + 2]
        for radius_word, angle_bits in ((a, ((c >> 16) << 8) | (a & 0xFF)), (b, ((c & 0xFFFF) << 8) | (b & 0xFF))):
            r = np.sqrt(-2.0 * np.log((2 * (radius_word >> 9) + 1) * 2.0**-24))
            s = (angle_bits & (2**22 - 1)).astype(np.float64)
            angle = (np.pi / 2) * ((angle_bits >> 22) + (s - 2**21 + 0.5) * 2.0**-22)
            values += [r * np.cos(angle), r * np.sin(angle)]
    return np.stack(values, axis=1)


def reference_normals(key: int, draw: int, n: int) -> np.ndarray:
    """The values add_standard_normal adds to n elements: chunks of 1000 lanes as 16 planes, then the rest."""
    chunks, rest = divmod(n, 16_000)
    rest_lanes = rest // 16
    values = reference_lane_values(key, draw, 1000 * chunks + rest_lanes + 1)
    out = [values[1000 * c : 1000 * (c + 1)].T.reshape(-1) for c in range(chunks)]  # value j of lane i at 1000j + i
    out.append(values[1000 * chunks : 1000 * chunks + rest_lanes].T.reshape(-1))
    out.append(values[1000 * chunks + rest_lanes, : rest % 16])  # the tail: the first values of one more lane
    return np.concatenate(out)


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    assert philox4x32_10(counter, key) == expected
    assert tuple(reference_philox(np.array([counter], dtype=np.uint64), key)[0]) == expected


@pytest.mark.parametrize("n", [32_000, 50_003, 16 * 700, 15, 3])
def test_values_match_float64_box_muller_of_the_same_words(n):
    key, draw = 0x0123456789ABCDEF, 2**40 + 7
    out = standard_normal(n, key, draw, np.float32)
    expected = reference_normals(key, draw, n)
    # float32 rounding of values up to 5.8 is ~3e-7 per operation; a wrong polynomial term is ~1e-3
    assert np.max(np.abs(out - expected)) < 2e-6
    assert np.max(np.abs(out)) <= math.sqrt(48 * math.log(2)) + 1e-5


def test_shrink_and_sigma_in_one_pass():
    target = np.linspace(-1, 1, 1001, dtype=np.float32)
    expected = 0.9 * target + 0.01 * standard_normal(1001, 5, 3, np.float32)
    add_standard_normal(target, 5, 3, sigma=0.01, shrink=0.9)
    np.testing.assert_allclose(target, expected, rtol=1e-6, atol=1e-7)


def test_distribution_is_standard_normal():
    n = 2**22
    z = standard_normal(n, 12345, 0, np.float32).astype(np.float64)
    se = 1 / math.sqrt(n)
    assert abs(z.mean()) < 4 * se
    assert abs(z.var() - 1) < 4 * math.sqrt(2) * se
    assert abs(stats.kurtosis(z)) < 4 * math.sqrt(24) * se
    assert stats.kstest(z, "norm").pvalue > 1e-3
    tail = 2 * stats.norm.sf(3.0)
    assert abs(np.mean(np.abs(z) > 3.0) - tail) < 4 * math.sqrt(tail * (1 - tail) / n)


def test_draws_and_box_muller_pairs_are_uncorrelated():
    n = 2**20
    first = standard_normal(n, 7, 0, np.float32).astype(np.float64)
    second = standard_normal(n, 7, 1, np.float32).astype(np.float64)
    other_key = standard_normal(n, 8, 0, np.float32).astype(np.float64)
    bound = 4 / math.sqrt(n)
    assert abs(np.corrcoef(first, second)[0, 1]) < bound
    assert abs(np.corrcoef(first, other_key)[0, 1]) < bound
    planes = first[: 16_000 * (n // 16_000)].reshape(-1, 16, 1000)  # (chunk, value j of a lane, lane)
    cos_plane, sin_plane, next_cos_plane = (planes[:, j].reshape(-1) for j in range(3))  # a pair, the next pair
    for other in (sin_plane, next_cos_plane):
        assert abs(np.corrcoef(cos_plane, other)[0, 1]) < 4 / math.sqrt(cos_plane.size)
        assert abs(np.corrcoef(cos_plane**2, other**2)[0, 1]) < 4 / math.sqrt(cos_plane.size)


def test_values_do_not_depend_on_the_number_of_threads():
    n = 3 * 16_000 + 16 * 5 + 3  # three parallel chunks, a short last chunk and a tail
    one, two = np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    add_standard_normal(one, 11, 4, sigma=0.5, shrink=0.9, threads=1)
    add_standard_normal(two, 11, 4, sigma=0.5, shrink=0.9, threads=2)
    assert np.array_equal(one, two)
    np.testing.assert_allclose(one, 0.9 + 0.5 * standard_normal(n, 11, 4), rtol=1e-6)


@pytest.mark.slow
def test_reproducible_and_float64_gets_the_same_values():
    a = standard_normal(64, 3, 5, np.float32)
    b = standard_normal(64, 3, 5, np.float64)
    assert np.array_equal(a, standard_normal(64, 3, 5, np.float32))
    assert np.array_equal(a.astype(np.float64), b)


@pytest.mark.parametrize(
    ("target", "key", "draw", "message"),
    [
        (np.empty(8, dtype=np.int32), 0, 0, "float32/float64"),
        (np.empty((2, 4), dtype=np.float32), 0, 0, "1-D"),
        (np.empty(16, dtype=np.float32)[::2], 0, 0, "contiguous"),
        (np.empty(8, dtype=np.float32), -1, 0, "key must be"),
        (np.empty(8, dtype=np.float32), 0, 2**64, "draw must be"),
    ],
)
def test_rejects_bad_arguments(target, key, draw, message):
    with pytest.raises(ValueError, match=message):
        add_standard_normal(target, key, draw)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        add_standard_normal(np.empty(8, dtype=np.float32), 0, 0, threads=0)


def test_gaussian_noise_on_cpu_uses_the_philox_kernel_per_seed():
    def draws(seed: int, n: int = 10, dtype=torch.float32) -> list[torch.Tensor]:
        noise = GaussianNoise(torch.zeros(n, dtype=dtype), torch.Generator().manual_seed(seed))
        assert noise.bits == "philox4x32-10"
        return [noise.add_to_(torch.zeros(n, dtype=dtype), sigma=1.0) for _ in range(3)]

    a, b = draws(0), draws(0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], draws(1)[0])
    assert torch.equal(draws(0, dtype=torch.float64)[0], a[0].double())
    key = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    np.testing.assert_array_equal(a[1].numpy(), standard_normal(10, key, 1))
    noise = GaussianNoise(torch.zeros(10), torch.Generator().manual_seed(0))
    target, grad = torch.ones(10), torch.arange(10.0)
    noise.add_to_(target, sigma=0.0, shrink=0.5, grad=grad, lr=0.1)  # the gradient term as a second pass
    torch.testing.assert_close(target, 0.5 - 0.1 * grad)
    assert noise.draws == 1
