"""The extra forward pass of adaptive THOR leaves BatchNorm's running statistics alone: after every step they
hold one update per batch, from the step's own forward pass, as with any optimizer (a NumPy oracle of
MindSpore's BatchNorm: ``moving = m * moving + (1 - m) * batch statistic``, the variance unbiased).

Checked for ``learning_rate`` and ``damping`` "adaptive" and for the adaptive damping alone, through both of
ms_optim's training cells, as two graphs and as one, in PYNATIVE and GRAPH mode; a trial the step rejects
leaves no trace in them either. A network without running statistics runs the probe as before.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from ms_optim import nn as ms_nn
from ms_optim._extra_pass import running_statistics

pytestmark = pytest.mark.core

MOMENTUM = 0.9  # BatchNorm's
STEPS = 4


class _ConvBn(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn = nn.BatchNorm2d(4, momentum=MOMENTUM)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(4 * 8 * 8, 3)

    def construct(self, x):
        return self.fc(self.flat(self.bn(self.conv(x))))


def _cell(net, learning_rate, kind: str):
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    opt = ms_nn.thor(loss, learning_rate, "adaptive", 0.9, batch_size=8, frequency=2)
    if kind == "loss_scale":
        return ms_nn.TrainOneStepWithLossScaleCell(loss, opt, Tensor(np.float32(1024.0))).set_train()
    cell = ms_nn.TrainOneStepCell(loss, opt).set_train()
    if kind == "one_graph":
        object.__setattr__(cell, "_graph_cells", ())  # the step as one graph (what runs inside another graph)
    return cell


def _batch_statistics(net, x):
    """The per-channel mean and unbiased variance of the conv's output at the net's current weights."""
    out = ms.ops.conv2d(Tensor(x), Tensor(net.conv.weight.asnumpy()), pad_mode="pad", padding=1).asnumpy()
    out = out.astype(np.float64)
    count = out.size // out.shape[1]
    return out.mean(axis=(0, 2, 3)), out.var(axis=(0, 2, 3)) * count / (count - 1)


@pytest.mark.parametrize("kind", ["two_graphs", "one_graph", "loss_scale"])
@pytest.mark.parametrize("learning_rate", ["adaptive", 0.05], ids=["adaptive_lr", "adaptive_damping"])
def test_running_statistics_take_each_batch_once(mode, rng, kind, learning_rate):
    ms.set_seed(0)
    net = _ConvBn()
    lr = learning_rate if isinstance(learning_rate, str) else Tensor(np.float32(learning_rate))
    cell = _cell(net, lr, kind)
    mean, variance = np.zeros(4), np.ones(4)
    for step in range(STEPS):
        x = (rng.standard_normal((8, 3, 8, 8)) + step).astype(np.float32)
        y = rng.integers(0, 3, size=(8,)).astype(np.int32)
        batch_mean, batch_variance = _batch_statistics(net, x)  # the step's forward reads these weights
        mean = MOMENTUM * mean + (1 - MOMENTUM) * batch_mean
        variance = MOMENTUM * variance + (1 - MOMENTUM) * batch_variance
        cell(Tensor(x), Tensor(y))
        np.testing.assert_allclose(net.bn.moving_mean.asnumpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(net.bn.moving_variance.asnumpy(), variance, rtol=1e-5, atol=1e-6)


def test_a_rejected_trial_leaves_no_trace_in_them(mode, rng):
    """A learning rate far too large: the damping-only step is taken back, and the statistics still hold the
    step's forward pass alone."""
    ms.set_seed(0)
    net = _ConvBn()
    cell = _cell(net, Tensor(np.float32(1e4)), "two_graphs")
    rule = cell.optimizer.damping_rule
    x = rng.standard_normal((8, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=(8,)).astype(np.int32)
    before = net.conv.weight.asnumpy().copy()
    batch_mean, batch_variance = _batch_statistics(net, x)
    cell(Tensor(x), Tensor(y))
    assert int(rule.rejected_steps.asnumpy()) == 1
    np.testing.assert_array_equal(net.conv.weight.asnumpy(), before)
    np.testing.assert_allclose(net.bn.moving_mean.asnumpy(), (1 - MOMENTUM) * batch_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bn.moving_variance.asnumpy(), MOMENTUM + (1 - MOMENTUM) * batch_variance,
                               rtol=1e-5, atol=1e-6)


def test_running_statistics_are_the_moving_parameters_once_each():
    net = _ConvBn()
    names = [p.name for p in running_statistics(net)]
    assert names == ["bn.moving_mean", "bn.moving_variance"]
    assert len(running_statistics(nn.SequentialCell([nn.Dense(3, 3), nn.ReLU()]))) == 0
