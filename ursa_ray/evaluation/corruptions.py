"""Common corruptions of an in-domain test set at severities 1–5, and Ovadia et al.'s summaries over them.

A fixed set of ten corruption types that apply to grayscale and RGB images alike.  The parameter of each
severity follows CIFAR-10-C (Hendrycks & Dietterich 2019, ``make_cifar_c.py`` of hendrycks/robustness)
for 3-channel images and MNIST-C (Mu & Gilmer 2019, ``corruptions.py`` of google-research/mnist-c) for
1-channel images (the MNIST family and scikit-learn's 8 × 8 digits); where neither paper has the type, or
its recipe does not grow with severity, the values are our own (marked *own*).

| corruption | parameter | RGB (CIFAR-10-C), severity 1 … 5 | grayscale (MNIST-C), severity 1 … 5 |
|---|---|---|---|
| ``gaussian_noise`` | σ of x + σ·z, z ~ N(0, 1) | 0.04, 0.06, 0.08, 0.09, 0.10 | 0.08, 0.12, 0.18, 0.26, 0.38 |
| ``shot_noise`` | photons λ of Poisson(λ·x)/λ | 500, 250, 100, 75, 50 | 60, 25, 12, 5, 3 |
| ``impulse_noise`` | share a of values set to 0 (a/2) or 1 (a/2) | 0.01, 0.02, 0.03, 0.05, 0.07 | 0.03, 0.06, 0.09, 0.17, 0.27 |
| ``gaussian_blur`` | σ in pixels † | 0.4, 0.6, 0.7, 0.8, 1.0 | 1, 2, 3, 4, 6 |
| ``elastic_transform`` | RMS displacement d in pixels †, σ = 4 † | *own* 0.5, 0.75, 1.0, 1.25, 1.5 | *own* 1.0, 1.5, 2.0, 2.5, 3.0 |
| ``jpeg_compression`` | JPEG quality q | 80, 65, 58, 50, 40 | 25, 18, 15, 10, 7 |
| ``contrast`` | factor c of m + c·(x − m) | 0.75, 0.5, 0.4, 0.3, 0.15 | 0.4, 0.3, 0.2, 0.1, 0.05 |
| ``brightness`` | shift b of HSV value V → min(V + b, 1) | 0.05, 0.1, 0.15, 0.2, 0.3 | 0.1, 0.2, 0.3, 0.4, 0.5 |
| ``rotate`` | angle ±c rad, sign per image | *own* as MNIST-C → | 0.2, 0.4, 0.6, 0.8, 1.0 (11.5° … 57.3°) |
| ``shear`` | slope ±sin c of x' = x + slope·y, sign per image | *own* as MNIST-C → | c = 0.2, 0.4, 0.6, 0.8, 1.0 |

† Lengths in pixels are given at the papers' image sizes, 32 (CIFAR) and 28 (MNIST), and scaled by
s = min(H, W)/32 or min(H, W)/28 for other sizes: on 8 × 8 digits s = 8/28, so the blur σ is 0.29 … 1.71
pixels and the elastic d is 0.29 … 0.86 pixels with σ = 1.14.  Noise, quality, contrast, brightness and
angles do not depend on the size.

How each type is computed, x the image in pixel space [0, 1] (N × C × H × W, C = 1 or 3):

- ``gaussian_noise``: x + σ·z.  Drawn here rather than by torchvision's ``gaussian_noise``, which takes
  no generator and would draw from torch's global generator (the trial's ``init`` stream).
- ``shot_noise``: Poisson(λ·x)/λ (``torch.poisson``), per value.
- ``impulse_noise`` (salt and pepper, scikit-image's ``random_noise(mode='s&p')`` as both papers use):
  u ~ U(0, 1) per value; 0 where u < a/2, 1 where a/2 ≤ u < a, x elsewhere.
- ``gaussian_blur``: the blur of torchvision's ``gaussian_blur`` (weights ∝ exp(−t²/2σ²), reflected
  borders) with scikit-image's kernel radius ⌈4σ⌉, which both papers' blurs used (at most side − 1, as
  reflection needs), computed separably as two small matrix products B_H·x·B_Wᵀ.  torchvision's op
  convolves with the full k × k kernel, k² multiply-adds per pixel (2401 at σ = 6 on MNIST); this is
  10–60 times faster on a CPU and equal to it up to float rounding (``tests/test_corruptions.py``).
- ``elastic_transform`` (Simard et al. 2003, built as torchvision's ``ElasticTransform`` builds its field):
  per image and axis a field U(−1, 1) smoothed by the same Gaussian blur with σ = 4 pixels (Simard's σ on
  MNIST), scaled per image so that its root-mean-square displacement sqrt(mean(dx² + dy²)) is d, then
  bilinear resampling at (x + dx, y + dy) by ``torch.nn.functional.grid_sample`` (what torchvision's
  ``elastic_transform`` calls; that op takes one field for a whole batch, so one field per image would
  be N calls).  Outside the image: 0 for grayscale (MNIST-C), reflection for RGB (CIFAR-10-C).  Neither
  paper's recipe is used: both add a random affine warp whose size *falls* with severity (CIFAR-10-C
  severity 1 is that warp alone) and MNIST-C's σ drops to 0.28 pixels (unsmoothed noise) at severity 3.
- ``jpeg_compression``: baseline JPEG as libjpeg does it with its defaults (ITU-T T.81), in tensors on the
  images' device: 8-bit levels; for RGB, JFIF YCbCr with 4:2:0 chroma (2 × 2 means; decoded with
  libjpeg's triangular "fancy" upsampling, which is bilinear interpolation); edge-replicated padding to
  whole blocks; level shift −128; orthonormal 8 × 8 DCT-II; quantisation by the Annex K tables scaled to
  the quality q as libjpeg does (scale 5000/q for q < 50, else 200 − 2q; entry ⌊(T·scale + 50)/100⌋
  clipped to 1–255); inverse DCT; rounding to 8 bits.  Its mean absolute difference from libjpeg's result
  (torchvision's ``jpeg``) is under 2% of the compression error itself on grayscale and 13–22% on RGB
  (chroma rounding; ``tests/test_corruptions.py``).  torchvision's ``jpeg`` is not used: it encodes and
  decodes image by image on the host through torchvision's image codecs, deprecated since torchvision
  0.29, at 3 s per severity for 10,000 CIFAR images on one core of the reference machine.
- ``contrast``: torchvision's ``adjust_contrast``: m + c·(x − m), m the image's mean gray level
  (CIFAR-10-C used each channel's mean; for grayscale the two are the same).
- ``brightness``: the HSV value V = maxₖ xₖ raised to V' = min(V + b, 1) at fixed hue and saturation,
  i.e. x·V'/V (and V' where V = 0), as both papers do through scikit-image's HSV conversion; for grayscale
  min(x + b, 1).  torchvision's ``adjust_brightness`` multiplies (it would leave a black background
  black) and there is no HSV operation in torchvision to use.
- ``rotate``: torchvision's ``affine`` (bilinear, fill 0) about the centre, by +c or −c with equal
  probability per image (MNIST-C's random direction).  CIFAR-10-C has no rotation; MNIST-C's angles are
  used for RGB too.
- ``shear``: torchvision's ``affine`` with a horizontal shear of angle atan(sin c), i.e. slope ±sin c, sign
  per image.  MNIST-C's scikit-image shear of c rad has the matrix [[1, −sin c], [0, cos c]]; torchvision's
  shear has [[1, −tan θ], [0, 1]], so θ = atan(sin c) keeps MNIST-C's horizontal slope and drops its
  vertical factor cos c.

Determinism: every random draw comes from one ``torch.Generator`` on the images' device seeded with
``seed``, so the same (images, corruption, severity, seed) gives the same result on that device, and the
global generators are untouched.  The draws do not depend on the severity (common random numbers): the
noise, field, mask or sign at severity 5 is the one at severity 1 with a larger parameter, so severities
differ only by the parameter.  CPU and CUDA generators are different streams, so the random types differ
between a CPU and a GPU (each deterministic); so may the last rounding of the others.  Draws are made for
the batch as given: corrupting a set in two halves gives other (equally valid) draws than corrupting it
whole.  ``gaussian_blur``, ``jpeg_compression``, ``contrast`` and ``brightness`` draw nothing.

Images in the datasets are stored normalised, (pixel − mean)/std per channel; :func:`corrupt` takes that
normalisation, maps back to pixels, clips to [0, 1], corrupts, clips to [0, 1] and normalises again.

Summaries (Ovadia et al. 2019, "Can you trust your model's uncertainty?", Figures 2–3): for each severity
the distribution of a metric over the corruption types, as a box plot: mean, minimum, quartiles, maximum
(:func:`analysis.corruption_shift.severity_summary`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as nnf
from torch import Tensor


def _functional() -> ModuleType:
    """torchvision's v2 functional transforms (affine, contrast), imported on first use: a worker whose trials
    build no corruption set never imports torchvision (~1 s, with torch._dynamo); one whose trials may has
    imported it before anything is timed (:func:`ursa_ray.trial.warm_up_worker`)."""
    import torchvision.transforms.v2.functional as tvf

    return tvf


SEVERITIES = (1, 2, 3, 4, 5)
RGB_REFERENCE_SIDE = 32  # CIFAR-10-C's image side: its lengths in pixels are meant at this size
GRAYSCALE_REFERENCE_SIDE = 28  # MNIST-C's
ELASTIC_SIGMA = 4.0  # pixels at the reference side (Simard et al. 2003 on MNIST)
BLUR_TRUNCATE = 4.0  # kernel radius in σ (scikit-image's default, which both papers' blurs used)


@dataclass(frozen=True)
class _Corruption:
    """One type: ``apply(pixels, value, generator, scale)`` with the severity's parameter ``value`` and
    ``scale`` = image side ÷ reference side; ``rgb`` and ``grayscale`` the parameters of severities 1–5."""

    apply: Callable[[Tensor, float, torch.Generator, float], Tensor]
    rgb: tuple[float, ...]
    grayscale: tuple[float, ...]
    random: bool


# --------------------------------------------------------------------------------------------------
# The corruptions, on pixels in [0, 1]; the caller clips the result to [0, 1].


def _gaussian_noise(x: Tensor, sigma: float, generator: torch.Generator, scale: float) -> Tensor:
    return x + sigma * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)


def _shot_noise(x: Tensor, photons: float, generator: torch.Generator, scale: float) -> Tensor:
    return torch.poisson(x * photons, generator=generator) / photons


def _impulse_noise(x: Tensor, amount: float, generator: torch.Generator, scale: float) -> Tensor:
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return torch.where(u < amount / 2, 0.0, torch.where(u < amount, 1.0, x))


def _blur_matrix(side: int, sigma: float, like: Tensor) -> Tensor:
    """B (side × side) with B·v = v convolved with torchvision's Gaussian kernel under reflection padding.

    The kernel is torchvision's (``_get_gaussian_kernel1d``): weights ∝ exp(−t²/2σ²) at t = −r … r,
    normalised, with r = ⌈4σ⌉ (scikit-image's truncation at 4σ, which both papers' blurs used), at most
    side − 1 (reflection needs r < side); a tap at i + t outside 0 … side − 1 is reflected about the edge
    pixel (−p, or 2(side − 1) − p), as ``torch.nn.functional.pad(mode="reflect")`` does.
    """
    radius = min(math.ceil(BLUR_TRUNCATE * sigma), side - 1)
    taps = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * (taps / sigma) ** 2)
    weights /= weights.sum()
    rows = torch.arange(side)
    matrix = torch.zeros(side, side, dtype=torch.float64)
    for tap, weight in zip(taps.long().tolist(), weights):
        column = (rows + tap).abs()
        column = torch.where(column > side - 1, 2 * (side - 1) - column, column)
        matrix.index_put_((rows, column), weight.expand(side), accumulate=True)
    return matrix.to(device=like.device, dtype=like.dtype)


def _blur(x: Tensor, sigma: float) -> Tensor:
    """torchvision's ``gaussian_blur`` of each channel (kernel and borders as :func:`_blur_matrix`),
    computed separably as B_H · x · B_Wᵀ: two small matrix products instead of a convolution with the
    k × k kernel (k² multiply-adds per pixel; 2401 at σ = 6 on MNIST).  Equal to torchvision's up to
    rounding (``tests/test_corruptions.py``), 10–60 times faster on a CPU."""
    h, w = x.shape[-2:]
    return _blur_matrix(h, sigma, x) @ x @ _blur_matrix(w, sigma, x).T


def _gaussian_blur(x: Tensor, sigma: float, generator: torch.Generator, scale: float) -> Tensor:
    return _blur(x, sigma * scale)


def _elastic_transform(x: Tensor, rms: float, generator: torch.Generator, scale: float) -> Tensor:
    n, c, h, w = x.shape
    uniform = torch.rand((n, 2, h, w), generator=generator, device=x.device, dtype=x.dtype) * 2 - 1
    field = _blur(uniform, ELASTIC_SIGMA * scale)
    field = field * (rms * scale / field.square().sum(1).mean((1, 2)).sqrt()).view(n, 1, 1, 1)  # pixels
    # grid_sample's coordinates: −1 and 1 are the outer edges of the first and last pixel
    rows = (torch.arange(h, device=x.device, dtype=x.dtype) * 2 + 1) / h - 1
    columns = (torch.arange(w, device=x.device, dtype=x.dtype) * 2 + 1) / w - 1
    grid = torch.stack(
        (columns.view(1, 1, w) + field[:, 0] * (2 / w), rows.view(1, h, 1) + field[:, 1] * (2 / h)), dim=-1
    )
    padding = "zeros" if c == 1 else "reflection"
    return nnf.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=False)


def _signed_affine(x: Tensor, generator: torch.Generator, angle: float = 0.0, shear: float = 0.0) -> Tensor:
    """torchvision's ``affine`` about the centre (bilinear, fill 0): rotation by ``angle`` and horizontal
    shear by ``shear`` (degrees), both negated for each image with probability 1/2."""
    tvf = _functional()
    negative = torch.rand(x.shape[0], generator=generator, device=x.device) < 0.5
    out = torch.empty_like(x)
    for sign, chosen in ((1.0, ~negative), (-1.0, negative)):
        out[chosen] = tvf.affine(
            x[chosen],
            angle=sign * angle,
            translate=[0.0, 0.0],
            scale=1.0,
            shear=[sign * shear, 0.0],
            interpolation=tvf.InterpolationMode.BILINEAR,
            fill=0.0,
        )
    return out


def _rotate(x: Tensor, radians: float, generator: torch.Generator, scale: float) -> Tensor:
    return _signed_affine(x, generator, angle=math.degrees(radians))


def _shear(x: Tensor, radians: float, generator: torch.Generator, scale: float) -> Tensor:
    return _signed_affine(x, generator, shear=math.degrees(math.atan(math.sin(radians))))


def _contrast(x: Tensor, factor: float, generator: torch.Generator, scale: float) -> Tensor:
    return _functional().adjust_contrast(x, factor)


def _brightness(x: Tensor, shift: float, generator: torch.Generator, scale: float) -> Tensor:
    value = x.amax(dim=1, keepdim=True)
    brighter = (value + shift).clamp(max=1.0)
    return torch.where(value > 0, x * (brighter / value.clamp(min=torch.finfo(x.dtype).tiny)), brighter)


# JPEG (ITU-T T.81): the example quantisation tables of Annex K (K.1 luminance, K.2 chrominance).
_LUMINANCE_TABLE = (
    (16, 11, 10, 16, 24, 40, 51, 61),
    (12, 12, 14, 19, 26, 58, 60, 55),
    (14, 13, 16, 24, 40, 57, 69, 56),
    (14, 17, 22, 29, 51, 87, 80, 62),
    (18, 22, 37, 56, 68, 109, 103, 77),
    (24, 35, 55, 64, 81, 104, 113, 92),
    (49, 64, 78, 87, 103, 121, 120, 101),
    (72, 92, 95, 98, 112, 100, 103, 99),
)
_CHROMINANCE_TABLE = (
    (17, 18, 24, 47, 99, 99, 99, 99),
    (18, 21, 26, 66, 99, 99, 99, 99),
    (24, 26, 56, 99, 99, 99, 99, 99),
    (47, 66, 99, 99, 99, 99, 99, 99),
    *((99,) * 8,) * 4,
)


def _quantisation_table(base: tuple[tuple[int, ...], ...], quality: int, like: Tensor) -> Tensor:
    """libjpeg's ``jpeg_quality_scaling`` and ``jpeg_add_quant_table`` (baseline: entries 1–255)."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    table = torch.tensor(base, dtype=torch.int64)
    return ((table * scale + 50) // 100).clamp(1, 255).to(device=like.device, dtype=like.dtype)


def _dct_matrix(like: Tensor) -> Tensor:
    """The orthonormal 8-point DCT-II, D[k, n] = a_k cos((2n + 1)kπ/16), a_0 = √(1/8), a_k = √(2/8)."""
    k = torch.arange(8, dtype=torch.float64)[:, None]
    n = torch.arange(8, dtype=torch.float64)[None, :]
    d = torch.cos((2 * n + 1) * k * math.pi / 16) * math.sqrt(2 / 8)
    d[0] /= math.sqrt(2)
    return d.to(device=like.device, dtype=like.dtype)


def _jpeg_plane(levels: Tensor, table: Tensor) -> Tensor:
    """Encode and decode 8-bit planes (M × H × W, H and W multiples of 8): the 8 × 8 blocks' DCT
    coefficients of (level − 128) rounded to multiples of ``table``, transformed back, rounded to 0–255."""
    m, h, w = levels.shape
    d = _dct_matrix(levels)
    blocks = (levels - 128).reshape(m, h // 8, 8, w // 8, 8).transpose(2, 3)
    coefficients = torch.round(d @ blocks @ d.T / table) * table
    blocks = d.T @ coefficients @ d
    return torch.round(blocks.transpose(2, 3).reshape(m, h, w) + 128).clamp(0, 255)


def _jpeg_compression(x: Tensor, quality: float, generator: torch.Generator, scale: float) -> Tensor:
    n, c, h, w = x.shape
    quality = int(quality)
    block = 8 if c == 1 else 16  # a 4:2:0 colour block covers 16 × 16 pixels
    levels = nnf.pad(torch.round(x * 255), (0, -w % block, 0, -h % block), mode="replicate")
    luminance = _quantisation_table(_LUMINANCE_TABLE, quality, x)
    if c == 1:
        return _jpeg_plane(levels[:, 0], luminance)[:, None, :h, :w] / 255
    r, g, b = levels.unbind(1)
    y = torch.round(0.299 * r + 0.587 * g + 0.114 * b)
    chroma = torch.stack((-0.168736 * r - 0.331264 * g + 0.5 * b, 0.5 * r - 0.418688 * g - 0.081312 * b), 1)
    chroma = torch.round(nnf.avg_pool2d(chroma + 128, 2))
    y = _jpeg_plane(y, luminance)
    half = chroma.shape[-2:]
    chroma = _jpeg_plane(chroma.reshape(-1, *half), _quantisation_table(_CHROMINANCE_TABLE, quality, x))
    chroma = nnf.interpolate(chroma.reshape(n, 2, *half), scale_factor=2, mode="bilinear", align_corners=False)
    cb, cr = (chroma - 128).unbind(1)
    rgb = torch.stack((y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb), 1)
    return torch.round(rgb).clamp(0, 255)[..., :h, :w] / 255


_TABLE: dict[str, _Corruption] = {
    "gaussian_noise": _Corruption(
        _gaussian_noise, (0.04, 0.06, 0.08, 0.09, 0.10), (0.08, 0.12, 0.18, 0.26, 0.38), random=True
    ),
    "shot_noise": _Corruption(_shot_noise, (500, 250, 100, 75, 50), (60, 25, 12, 5, 3), random=True),
    "impulse_noise": _Corruption(
        _impulse_noise, (0.01, 0.02, 0.03, 0.05, 0.07), (0.03, 0.06, 0.09, 0.17, 0.27), random=True
    ),
    "gaussian_blur": _Corruption(_gaussian_blur, (0.4, 0.6, 0.7, 0.8, 1.0), (1, 2, 3, 4, 6), random=False),
    "elastic_transform": _Corruption(
        _elastic_transform, (0.5, 0.75, 1.0, 1.25, 1.5), (1.0, 1.5, 2.0, 2.5, 3.0), random=True
    ),
    "jpeg_compression": _Corruption(_jpeg_compression, (80, 65, 58, 50, 40), (25, 18, 15, 10, 7), random=False),
    "contrast": _Corruption(_contrast, (0.75, 0.5, 0.4, 0.3, 0.15), (0.4, 0.3, 0.2, 0.1, 0.05), random=False),
    "brightness": _Corruption(_brightness, (0.05, 0.1, 0.15, 0.2, 0.3), (0.1, 0.2, 0.3, 0.4, 0.5), random=False),
    "rotate": _Corruption(_rotate, (0.2, 0.4, 0.6, 0.8, 1.0), (0.2, 0.4, 0.6, 0.8, 1.0), random=True),
    "shear": _Corruption(_shear, (0.2, 0.4, 0.6, 0.8, 1.0), (0.2, 0.4, 0.6, 0.8, 1.0), random=True),
}

CORRUPTIONS: tuple[str, ...] = tuple(_TABLE)
RANDOM_CORRUPTIONS: tuple[str, ...] = tuple(name for name, c in _TABLE.items() if c.random)


# --------------------------------------------------------------------------------------------------
# Public entry points.


def validate_corruptions(names: Iterable[str], severities: Iterable[int]) -> None:
    """Raise ``ValueError`` naming the first unknown corruption or severity outside 1–5, and the allowed
    values."""
    for name in names:
        if name not in _TABLE:
            raise ValueError(f"unknown corruption {name!r}; allowed: {', '.join(CORRUPTIONS)}")
    for severity in severities:
        if isinstance(severity, bool) or not isinstance(severity, int) or severity not in SEVERITIES:
            allowed = ", ".join(map(str, SEVERITIES))
            raise ValueError(f"severity {severity!r} is not an integer 1-5; allowed: {allowed}")


def corruption_parameter(corruption: str, severity: int, channels: int) -> float:
    """The table's parameter of ``corruption`` at ``severity`` for images with ``channels`` channels (at
    the reference side; lengths are scaled by the image side, see the module docstring)."""
    validate_corruptions([corruption], [severity])
    entry = _TABLE[corruption]
    return {1: entry.grayscale, 3: entry.rgb}[_check_channels(channels)][severity - 1]


def corrupt_pixels(pixels: Tensor, corruption: str, severity: int, seed: int) -> Tensor:
    """``corruption`` at ``severity`` of images in pixel space (N × C × H × W floats in [0, 1], C = 1 or
    3), on their device, clipped to [0, 1]; the same arguments always give the same result on a device.
    Computed in the images' dtype whatever autocast is in effect around the call."""
    validate_corruptions([corruption], [severity])
    channels = _channels(pixels)
    reference = GRAYSCALE_REFERENCE_SIDE if channels == 1 else RGB_REFERENCE_SIDE
    scale = min(pixels.shape[-2:]) / reference
    generator = torch.Generator(device=pixels.device).manual_seed(seed)
    value = corruption_parameter(corruption, severity, channels)
    with torch.autocast(pixels.device.type, enabled=False):
        return _TABLE[corruption].apply(pixels, value, generator, scale).clamp(0.0, 1.0)


def corrupt(
    images: Tensor,
    corruption: str,
    severity: int,
    seed: int,
    mean: float | Sequence[float],
    std: float | Sequence[float],
) -> Tensor:
    """``corruption`` at ``severity`` of normalised images x = (pixels − mean)/std (per channel; one value
    for all channels or one per channel): pixels = clip(x·std + mean, 0, 1) are corrupted by
    :func:`corrupt_pixels` and normalised again.  Same shape, dtype and device as ``images``."""
    channels = _channels(images)
    mean_t = _per_channel(mean, channels, images.device, "mean")
    std_t = _per_channel(std, channels, images.device, "std")
    if (std_t <= 0).any():
        raise ValueError(f"std must be positive, got {std!r}")
    pixels = (images.float() * std_t + mean_t).clamp(0.0, 1.0)
    return ((corrupt_pixels(pixels, corruption, severity, seed) - mean_t) / std_t).to(images.dtype)


def _channels(images: Tensor) -> int:
    if images.ndim != 4:
        raise ValueError(f"images must be N x C x H x W, got shape {tuple(images.shape)}")
    return _check_channels(images.shape[1])


def _check_channels(channels: int) -> int:
    if channels not in (1, 3):
        raise ValueError(f"corruptions need 1 (grayscale) or 3 (RGB) channels, got {channels}")
    return channels


def _per_channel(values: float | Sequence[float], channels: int, device: torch.device, label: str) -> Tensor:
    flat = torch.as_tensor(values, dtype=torch.float32, device=device).flatten()
    if flat.numel() not in (1, channels):
        raise ValueError(f"{label} must have 1 or {channels} values (one per channel), got {flat.numel()}")
    return flat.view(1, -1, 1, 1)
