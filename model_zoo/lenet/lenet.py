"""LeNet5 for 1-channel 32x32 images, laid out as in MindSpore's documentation example.

conv(1->6, 5x5, valid) -> ReLU -> maxpool 2 -> conv(6->16, 5x5, valid) -> ReLU -> maxpool 2 ->
flatten (16*5*5) -> Dense 120 -> ReLU -> Dense 84 -> ReLU -> Dense num_class.
"""
from __future__ import annotations

from mindspore import nn
from mindspore.common.initializer import Normal


class LeNet5(nn.Cell):
    """LeNet5 (the MindSpore docs' variant): two valid 5x5 convolutions and three Dense layers.

    Args:
        num_class: number of output logits.
        num_channel: input channels (1 for grey-scale digits).
        include_top: keep the three Dense layers (False returns the conv features).
    """

    def __init__(self, num_class: int = 10, num_channel: int = 1, include_top: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.include_top = include_top
        if include_top:
            self.flatten = nn.Flatten()
            self.fc1 = nn.Dense(16 * 5 * 5, 120, weight_init=Normal(0.02))
            self.fc2 = nn.Dense(120, 84, weight_init=Normal(0.02))
            self.fc3 = nn.Dense(84, num_class, weight_init=Normal(0.02))

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        if not self.include_top:
            return x
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)
