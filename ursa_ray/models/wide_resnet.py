"""Wide residual network WRN-d-k (Zagoruyko & Komodakis 2016), URSABench's WideResNet-28-10.

A 3 × 3 stem convolution to 16 channels, three groups of n = (d − 4) / 6 pre-activation blocks with
16k, 32k, 64k channels (stride 2 at the start of groups 2 and 3), then batch norm, ReLU, global
average pooling (8 × 8 on 32 × 32 inputs) and the linear classifier.  A block is
BN → ReLU → 3 × 3 conv (stride) → BN → ReLU → dropout → 3 × 3 conv, plus the identity or, where the
shape changes, a 1 × 1 convolution of the pre-activated input.  The dropout slots sit where the paper
puts dropout, at rate 0 (URSABench trained WRN-28-10 without dropout) unless a method sets them.
Convolutions have no bias.  36.5 M parameters for WRN-28-10 with 10 classes.
"""

from __future__ import annotations

from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.models.base import ModelSpec, init_conv_and_batch_norm


class WideBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        activated = self.relu(self.bn1(x))
        out = self.conv1(activated)
        out = self.conv2(self.dropout(self.relu(self.bn2(out))))
        residual = x if self.shortcut is None else self.shortcut(activated)
        return out + residual


class WideResNet(nn.Module):
    def __init__(self, in_channels: int, n_outputs: int, depth: int = 28, widen_factor: int = 10) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WideResNet depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth}")
        if widen_factor < 1:
            raise ValueError(f"widen_factor must be >= 1, got {widen_factor}")
        n = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.stem = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        blocks: list[nn.Module] = []
        channels = 16
        for i, width in enumerate(widths):
            for j in range(n):
                blocks.append(WideBlock(channels, width, stride=2 if (i > 0 and j == 0) else 1))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(channels, n_outputs)
        init_conv_and_batch_norm(self)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.head(self.blocks(self.stem(x))).flatten(1))


def build_wide_resnet(
    input_shape: tuple[int, ...], n_outputs: int, depth: int = 28, widen_factor: int = 10
) -> WideResNet:
    """WRN-depth-widen_factor for small images (C × H × W inputs)."""
    return WideResNet(input_shape[0], n_outputs, depth=depth, widen_factor=widen_factor)


MODELS = (
    ModelSpec(
        name="wide_resnet",
        description="WideResNet-depth-k (Zagoruyko & Komodakis), dropout slots in every block; "
        "WRN-28-10: 36.5M parameters",
        build=build_wide_resnet,
        options=(
            Hyperparameter("depth", int, 28, "total depth, 6n + 4", low=10),
            Hyperparameter("widen_factor", int, 10, "width multiplier k", low=1),
        ),
        tasks=("classification",),
    ),
)
