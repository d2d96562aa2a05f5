"""ResNet50 in its CIFAR form (He et al. 2016, as in URSABench's medium-scale benchmark).

A 3 × 3 stride-1 stem convolution with no max-pool (the ImageNet 7 × 7 stride-2 stem and pool would
shrink a 32 × 32 image to 8 × 8 before the first block), four stages of bottleneck blocks [3, 4, 6, 3]
with base widths w, 2w, 4w, 8w (w = 64) and expansion 4, stride 2 (on the 3 × 3 convolution) at the
start of stages 2–4, projection shortcuts (1 × 1 convolution + batch norm) where the shape changes,
global average pooling (4 × 4 on 32 × 32 inputs), a dropout slot (rate 0 unless a method sets it) and
the linear classifier.  23.5 M parameters for 10 classes at w = 64.
"""

from __future__ import annotations

from torch import Tensor, nn

from ursa_ray.methods.base import Hyperparameter
from ursa_ray.models.base import ModelSpec, init_conv_and_batch_norm

STAGES = (3, 4, 6, 3)
EXPANSION = 4


class Bottleneck(nn.Module):
    """1 × 1 reduce → 3 × 3 (stride) → 1 × 1 expand, each followed by batch norm; ReLU after the sum."""

    def __init__(self, in_channels: int, planes: int, stride: int) -> None:
        super().__init__()
        out_channels = planes * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, in_channels: int, n_outputs: int, width: int = 64, stages: tuple[int, ...] = STAGES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        blocks: list[nn.Module] = []
        channels = width
        for i, n_blocks in enumerate(stages):
            planes = width * 2**i
            for j in range(n_blocks):
                blocks.append(Bottleneck(channels, planes, stride=2 if (i > 0 and j == 0) else 1))
                channels = planes * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.0)
        self.classifier = nn.Linear(channels, n_outputs)
        init_conv_and_batch_norm(self)

    def forward(self, x: Tensor) -> Tensor:
        out = self.pool(self.blocks(self.stem(x))).flatten(1)
        return self.classifier(self.dropout(out))


def build_resnet50(input_shape: tuple[int, ...], n_outputs: int, width: int = 64) -> CifarResNet:
    """ResNet50 for small images (C × H × W inputs, any H, W ≥ 8); ``width`` is the stem and first-stage width."""
    return CifarResNet(input_shape[0], n_outputs, width=width)


MODELS = (
    ModelSpec(
        name="resnet50",
        description="ResNet50, CIFAR variant (3x3 stem, no max-pool, bottlenecks [3,4,6,3]); 23.5M parameters",
        build=build_resnet50,
        options=(Hyperparameter("width", int, 64, "base width (stem and first stage); 64 is ResNet50", low=1),),
        tasks=("classification",),
    ),
)
