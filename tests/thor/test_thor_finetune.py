"""Fine-tuning with THOR: frozen layers (``requires_grad=False``) stay plain first-order layers.

Through the public path a user takes: ``thor()`` + ``ConvertModelUtils().convert_to_thor_model`` +
``Model.train``. Frozen parameters must come out bitwise unchanged, trainable ones changed, the
optimizer must hold exactly the unfrozen THOR layers, and the trainable THOR layer's update must
equal the NumPy oracle (tests/reference/thor_ref.py). A bare plain layer as the whole net is
refused with a clear ValueError, before anything is modified.
"""
from __future__ import annotations

import math

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Callback, Model
from reference.thor_ref import ConvRef, ThorReference

from ms_optim._thor.factory import thor
from ms_optim._thor.model import ConvertModelUtils
from ms_optim._thor.net.layers import ThorLayer

BATCH = 4


class _Losses(Callback):
    """Records the loss of every training step."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_step_end(self, run_context):
        self.values.append(float(np.asarray(run_context.original_args().net_outputs.asnumpy()).reshape(-1)[0]))


def _dataset(x, y):
    data = ds.NumpySlicesDataset({"x": x, "y": y.reshape(-1, 1)}, shuffle=False)
    data = data.map(lambda v: v.reshape(()), input_columns="y")
    return data.batch(BATCH, drop_remainder=True)


def _freeze(cell):
    for param in cell.get_parameters():
        param.requires_grad = False


def _snapshot(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters() if not p.name.endswith(
        ("matrix_a_cov", "matrix_g_cov", "thor_flag"))}


def _train(net, steps, frequency=2, lr=0.05, damping=0.03, sink=False):
    """thor() + ConvertModelUtils + Model.train over ``steps`` batches; returns (optimizer, losses)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((steps * BATCH, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, steps * BATCH).astype(np.int32)
    opt = thor(net, Tensor(np.full(steps, lr, np.float32)), Tensor(np.full(steps, damping, np.float32)), 0.9,
               batch_size=BATCH, frequency=frequency)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn=loss, optimizer=opt)
    model = ConvertModelUtils().convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
    losses = _Losses()
    model.train(1, _dataset(x, y), callbacks=[losses], dataset_sink_mode=sink)
    return opt, losses.values


def _check_frozen_training(net, before, frozen_prefixes, losses, steps):
    after = _snapshot(net)
    assert set(after) == set(before)
    for name, value in before.items():
        if name.startswith(frozen_prefixes):
            np.testing.assert_array_equal(after[name], value, err_msg=f"frozen {name} changed")
        else:
            assert not np.array_equal(after[name], value), f"trainable {name} did not change"
    assert len(losses) == steps and all(math.isfinite(v) for v in losses)


class _ConvNet(nn.Cell):
    """conv1 (frozen in the test) -> ReLU -> conv2 -> ReLU -> flatten -> fc."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, has_bias=True)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 4 * 4, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))


class _BackboneHead(nn.Cell):
    """A conv backbone (frozen in the test) and a trainable Dense head."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.SequentialCell([nn.Conv2d(3, 4, 3, has_bias=True), nn.ReLU(),
                                           nn.Conv2d(4, 2, 3, stride=2, has_bias=True), nn.ReLU(), nn.Flatten()])
        self.head = nn.Dense(2 * 4 * 4, 3)

    def construct(self, x):
        return self.head(self.backbone(x))


@pytest.mark.parametrize("sink", [False, True], ids=["steps", "sink"])
def test_frozen_first_conv(mode, sink):
    ms.set_seed(1)
    net = _ConvNet()
    _freeze(net.conv1)
    before = _snapshot(net)
    opt, losses = _train(net, steps=3, sink=sink)
    assert type(net.conv1) is nn.Conv2d  # stays a plain first-order layer
    assert [type(c).__name__ for c in opt.thor_cells] == ["Conv2dThor", "DenseThor"]
    assert opt.num_layers == 2 and opt.thor_cells[0] is net.conv2 and opt.thor_cells[1] is net.fc
    assert not any(p.name.startswith("conv1.") for p in opt.parameters)
    if sink:  # sink mode reports the last step of the sink only
        assert math.isfinite(losses[-1])
        losses = losses * 3
    _check_frozen_training(net, before, ("conv1.",), losses, 3)


def test_frozen_backbone_trainable_head(mode):
    ms.set_seed(2)
    net = _BackboneHead()
    _freeze(net.backbone)
    before = _snapshot(net)
    opt, losses = _train(net, steps=3)
    assert not any(isinstance(cell, ThorLayer) for _, cell in net.backbone.cells_and_names())
    assert opt.num_layers == 1 and opt.thor_cells[0] is net.head
    assert [p.name for p in opt.parameters] == ["head.weight", "head.bias"]
    _check_frozen_training(net, before, ("backbone.",), losses, 3)


class _FrozenRef:
    """The oracle's ConvRef with layer ``frozen`` excluded from THOR and from the update."""

    def __init__(self, base, frozen: str):
        self.base = base
        self.frozen = frozen
        self.layers = tuple((name, kind) for name, kind in base.layers if name != frozen)

    def forward_backward(self, p, x, y):
        loss, grads, factors = self.base.forward_backward(p, x, y)
        return loss, {k: v for k, v in grads.items() if not k.startswith(self.frozen + ".")}, factors


class _RefConvNet(nn.Cell):
    """The oracle's ConvRef((3, 2), 2, 2, 1) net (same parameter names)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, (3, 2), stride=2, pad_mode="pad", padding=1, dilation=2, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 4 * 5, 5)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def test_trainable_layer_matches_oracle_with_frozen_conv(mode):
    """conv frozen, fc trained with THOR for 3 steps (THOR steps 0 and 2) through Model.train: fc's
    parameters equal the float64 oracle's, conv's are unchanged."""
    rng = np.random.default_rng(11)
    steps = 3
    net = _RefConvNet()
    for p in net.trainable_params():
        fan_in = int(np.prod(p.shape[1:])) if len(p.shape) > 1 else 1
        scale = np.sqrt(2.0 / fan_in) if len(p.shape) > 1 else 0.1
        p.set_data(Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32)))
    _freeze(net.conv)
    initial = {p.name: p.asnumpy().astype(np.float64) for p in net.get_parameters()}
    lr = np.linspace(0.1, 0.05, steps).astype(np.float32)
    damping = np.linspace(0.05, 0.02, steps).astype(np.float32)
    ref = ThorReference(_FrozenRef(ConvRef((3, 2), 2, 2, 1), "conv"), initial, lr, damping, 0.9, batch_size=8,
                        frequency=2)
    x = rng.standard_normal((steps * 8, 3, 9, 9)).astype(np.float32)
    y = rng.integers(0, 5, steps * 8).astype(np.int32)
    for k in range(steps):
        ref.step(x[k * 8:(k + 1) * 8], y[k * 8:(k + 1) * 8])

    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=2)
    assert opt.num_layers == 1 and opt.thor_cells[0] is net.fc and type(net.conv) is nn.Conv2d
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ConvertModelUtils().convert_to_thor_model(Model(net, loss_fn=loss, optimizer=opt), network=net,
                                                      loss_fn=loss, optimizer=opt)
    data = ds.NumpySlicesDataset({"x": x, "y": y.reshape(-1, 1)}, shuffle=False)
    data = data.map(lambda v: v.reshape(()), input_columns="y").batch(8, drop_remainder=True)
    model.train(1, data, dataset_sink_mode=False)
    for name, want in ref.params.items():
        got = net.parameters_dict()[name].asnumpy()
        if name.startswith("conv."):
            np.testing.assert_array_equal(got, initial[name].astype(np.float32), err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6, err_msg=name)


def test_bare_plain_layer_as_net_is_refused():
    """A bare nn.Dense cannot be replaced in place: a clear ValueError naming 'net', net untouched."""
    net = nn.Dense(4, 2)
    names = [p.name for p in net.get_parameters()]
    with pytest.raises(ValueError, match=r"'net'.*Dense.*wrap it in a Cell"):
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9)
    assert type(net) is nn.Dense and [p.name for p in net.get_parameters()] == names
    wrapped = nn.SequentialCell([net])
    opt = thor(wrapped, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9)
    assert opt.num_layers == 1 and isinstance(wrapped[0], ThorLayer)
