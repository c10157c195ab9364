"""ResNet-18/34/50/101 for MindSpore (ResNet-50 is the v1.5 layout: stride 2 in the 3x3 convolution).

Only plain ``nn.Conv2d``/``nn.Dense`` layers are used, so THOR's converter turns every one of them
into a THOR layer: ResNet-50 has 53 convolutions (1 stem + 16 blocks x 3 + 4 projection shortcuts)
and one Dense, i.e. the 54 layers that ``split_indices=[26, 53]`` refers to.

``width`` scales every stage (64 is the published network; tests use 4 or 8 to stay fast) and
``stem="cifar"`` replaces the 7x7/2 convolution and max pool by one 3x3/1 convolution for 32x32 inputs.
The module depends on MindSpore only, so it can be loaded on its own (tests, benchmarks).
"""
from __future__ import annotations

from typing import List, Sequence, Type, Union

import mindspore.nn as nn
import mindspore.ops as ops
from mindspore.common.initializer import HeNormal, HeUniform

__all__ = ["ResNet", "BasicBlock", "Bottleneck", "resnet18", "resnet34", "resnet50", "resnet101",
           "build_resnet", "ARCHITECTURES"]


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """Bias-free convolution with symmetric padding kernel//2 and He-normal (fan_out) weights."""
    return nn.Conv2d(in_ch, out_ch, kernel, stride=stride, pad_mode="pad", padding=kernel // 2,
                     has_bias=False, weight_init=HeNormal(mode="fan_out", nonlinearity="relu"))


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, momentum=0.9, eps=1e-5)


class _ResidualBlock(nn.Cell):
    """What both blocks share: the final ReLU and the shortcut (identity, or a 1x1 projection with
    BatchNorm when the stride or the channel count changes)."""

    def _init_shortcut(self, in_ch: int, out_ch: int, stride: int) -> None:
        # Called after the block's own layers so parameter names and order stay conv*, bn*, down_sample_layer.
        self.relu = nn.ReLU()
        self.down_sample = stride != 1 or in_ch != out_ch
        if self.down_sample:
            self.down_sample_layer = nn.SequentialCell([_conv(in_ch, out_ch, 1, stride), _bn(out_ch)])

    def _add_shortcut(self, x, out):
        """relu(out + shortcut(x))."""
        identity = x
        if self.down_sample:
            identity = self.down_sample_layer(x)
        return self.relu(out + identity)


class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions (ResNet-18/34); projection shortcut when the shape changes."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 3, stride)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, out_ch, 3)
        self.bn2 = _bn(out_ch)
        self._init_shortcut(in_ch, out_ch, stride)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self._add_shortcut(x, out)


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (carrying the stride: v1.5), 1x1 expand x4; projection shortcut when needed."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 1)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, width, 3, stride)
        self.bn2 = _bn(width)
        self.conv3 = _conv(width, out_ch, 1)
        self.bn3 = _bn(out_ch)
        self._init_shortcut(in_ch, out_ch, stride)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self._add_shortcut(x, out)


class ResNet(nn.Cell):
    """Stem, four stages of residual blocks (strides 1, 2, 2, 2), global average pool, Dense.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layer_nums: number of blocks per stage, e.g. ``(3, 4, 6, 3)`` for ResNet-50.
        class_num: output classes (1001 in MindSpore's ImageNet zoo, 1000 in torchvision).
        width: channels of the first stage before expansion (64 for the published networks).
        stem: ``"imagenet"`` (7x7/2 conv + 3x3/2 max pool) or ``"cifar"`` (3x3/1 conv, no pool).
    """

    def __init__(self, block: Type[Union[BasicBlock, Bottleneck]], layer_nums: Sequence[int],
                 class_num: int = 1001, width: int = 64, stem: str = "imagenet"):
        super().__init__()
        if len(layer_nums) != 4:
            raise ValueError(f"ResNet needs 4 stage depths, got {list(layer_nums)}")
        if stem not in ("imagenet", "cifar"):
            raise ValueError(f"stem must be 'imagenet' or 'cifar', got {stem!r}")
        self.stem_kind = stem
        if stem == "imagenet":
            self.conv1 = _conv(3, width, 7, 2)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
        else:
            self.conv1 = _conv(3, width, 3, 1)
        self.bn1 = _bn(width)
        self.relu = nn.ReLU()
        in_ch = width
        stages: List[nn.SequentialCell] = []
        for i, (num, stride) in enumerate(zip(layer_nums, (1, 2, 2, 2))):
            stage_width = width * 2 ** i
            blocks = []
            for j in range(num):
                blocks.append(block(in_ch, stage_width, stride if j == 0 else 1))
                in_ch = stage_width * block.expansion
            stages.append(nn.SequentialCell(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.mean = ops.ReduceMean(keep_dims=False)
        self.end_point = nn.Dense(in_ch, class_num, weight_init=HeUniform(), bias_init="zeros")

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        if self.stem_kind == "imagenet":
            x = self.maxpool(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.end_point(self.mean(x, (2, 3)))


ARCHITECTURES = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
}


def build_resnet(name: str, class_num: int = 1001, width: int = 64, stem: str = "imagenet") -> ResNet:
    """Build ``resnet18``/``resnet34``/``resnet50``/``resnet101`` by name."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown network {name!r}; choose one of {sorted(ARCHITECTURES)}")
    block, layers = ARCHITECTURES[name]
    return ResNet(block, layers, class_num=class_num, width=width, stem=stem)


def resnet18(class_num: int = 1001, **kwargs) -> ResNet:
    return build_resnet("resnet18", class_num, **kwargs)


def resnet34(class_num: int = 1001, **kwargs) -> ResNet:
    return build_resnet("resnet34", class_num, **kwargs)


def resnet50(class_num: int = 1001, **kwargs) -> ResNet:
    return build_resnet("resnet50", class_num, **kwargs)


def resnet101(class_num: int = 1001, **kwargs) -> ResNet:
    return build_resnet("resnet101", class_num, **kwargs)
