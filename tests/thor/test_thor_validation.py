"""``thor()`` argument validation: every documented Raises line, its type and message, checked
BEFORE the net is touched (a refused call leaves the net unconverted), and the exact signature."""
import inspect

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from support.snapshot import assert_unchanged, snapshot

from ms_optim._thor.factory import thor
from ms_optim._thor.layers import ThorLayer

NAN = float("nan")
INF = float("inf")


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 3)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(3, 2)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class NoLayers(nn.Cell):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def construct(self, x):
        return self.bn(x)


LR = Tensor(np.full(4, 0.1, np.float32))
DAMPING = Tensor(np.full(4, 0.01, np.float32))
GOOD = dict(learning_rate=LR, damping=DAMPING, momentum=0.9)

# (argument overrides, exception type, fragments the message must contain)
BAD = [
    (dict(learning_rate=0.1), TypeError, ["'learning_rate'", "Tensor", "0.1"]),
    (dict(learning_rate=[0.1, 0.2]), TypeError, ["'learning_rate'", "[0.1, 0.2]"]),
    (dict(learning_rate=Tensor(np.ones((2, 2), np.float32))), ValueError, ["'learning_rate'", "(2, 2)"]),
    (dict(learning_rate=Tensor(np.array([0.1, -1.0], np.float32))), ValueError, ["'learning_rate'", "-1.0"]),
    (dict(damping=0.01), TypeError, ["'damping'", "Tensor", "0.01"]),
    (dict(damping=Tensor(np.array([np.nan], np.float32))), ValueError, ["'damping'", "nan"]),
    (dict(momentum=1), TypeError, ["'momentum'", "float", "1"]),
    (dict(momentum="0.9"), TypeError, ["'momentum'", "'0.9'"]),
    (dict(momentum=-0.1), ValueError, ["'momentum'", ">= 0", "-0.1"]),
    (dict(weight_decay=-1e-4), ValueError, ["'weight_decay'", "-0.0001"]),
    (dict(weight_decay="0"), TypeError, ["'weight_decay'", "'0'"]),
    (dict(weight_decay=True), TypeError, ["'weight_decay'", "True"]),
    (dict(loss_scale=0.0), ValueError, ["'loss_scale'", "> 0", "0.0"]),
    (dict(loss_scale=-128), ValueError, ["'loss_scale'", "-128"]),
    (dict(loss_scale="128"), TypeError, ["'loss_scale'", "'128'"]),
    (dict(loss_scale=None), TypeError, ["'loss_scale'", "None"]),
    (dict(batch_size=0), ValueError, ["'batch_size'", "0"]),
    (dict(batch_size=32.5), ValueError, ["'batch_size'", "whole", "32.5"]),
    (dict(batch_size="32"), TypeError, ["'batch_size'", "'32'"]),
    (dict(use_nesterov=1), TypeError, ["'use_nesterov'", "bool", "1"]),
    (dict(decay_filter="weights"), TypeError, ["'decay_filter'", "callable", "'weights'"]),
    (dict(split_indices=5), TypeError, ["'split_indices'", "5"]),
    (dict(split_indices=[0.5]), TypeError, ["'split_indices'", "0.5"]),
    (dict(enable_clip_grad="yes"), TypeError, ["'enable_clip_grad'", "'yes'"]),
    (dict(frequency=10.0), TypeError, ["'frequency'", "int", "10.0"]),
    (dict(frequency=1), ValueError, ["'frequency'", ">= 2", "1"]),
    (dict(frequency=True), TypeError, ["'frequency'", "True"]),
    (dict(inverse="cholesky"), ValueError, ["'inverse'", "'cholesky'"]),
    (dict(block_size=0), ValueError, ["'block_size'", "0"]),
    # non-finite numbers (NaN slips through `x < 0` style checks) and values beyond float32/int32
    (dict(momentum=NAN), ValueError, ["'momentum'", "nan"]),
    (dict(momentum=INF), ValueError, ["'momentum'", "inf"]),
    (dict(momentum=1e300), ValueError, ["'momentum'", "float32", "1e+300"]),
    (dict(weight_decay=NAN), ValueError, ["'weight_decay'", "nan"]),
    (dict(weight_decay=INF), ValueError, ["'weight_decay'", "inf"]),
    (dict(loss_scale=NAN), ValueError, ["'loss_scale'", "nan"]),
    (dict(loss_scale=INF), ValueError, ["'loss_scale'", "inf"]),
    (dict(loss_scale=1e39), ValueError, ["'loss_scale'", "float32", "1e+39"]),
    (dict(learning_rate=Tensor(np.array([0.1, np.inf], np.float32))), ValueError, ["'learning_rate'", "inf"]),
    (dict(damping=Tensor(np.array([0.1, -0.5], np.float32))), ValueError, ["'damping'", "-0.5"]),
    (dict(frequency=2**32 + 2), ValueError, ["'frequency'", "int32", "4294967298"]),
    (dict(frequency=2**31 + 5), ValueError, ["'frequency'", "int32", "2147483653"]),
    (dict(frequency=np.int64(2**31)), ValueError, ["'frequency'", "int32", "2147483648"]),
    (dict(batch_size=2**31), ValueError, ["'batch_size'", "int32", "2147483648"]),
    (dict(block_size=2**40), ValueError, ["'block_size'", "int32", "1099511627776"]),
    (dict(kl_clip=NAN), ValueError, ["'kl_clip'", "nan"]),
    (dict(kl_clip="1e-3"), TypeError, ["'kl_clip'", "'1e-3'"]),
    (dict(distribute_inverses=1), TypeError, ["'distribute_inverses'", "bool", "1"]),
    (dict(distribute_inverses="yes"), TypeError, ["'distribute_inverses'", "'yes'"]),
]


def _thor_layers(net):
    return [name for name, cell in net.cells_and_names() if isinstance(cell, ThorLayer)]


@pytest.mark.parametrize("overrides,exc,fragments", BAD, ids=[f"{list(o)[0]}={list(o.values())[0]!r}"[:40]
                                                              for o, _, _ in BAD])
def test_bad_argument_raises_before_conversion(overrides, exc, fragments):
    net = Net()
    before = snapshot(net)
    with pytest.raises(exc) as info:
        thor(net, **{**GOOD, **overrides})
    message = str(info.value)
    assert "'thor'" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert _thor_layers(net) == [], "a refused call must leave the net unconverted"
    assert isinstance(net.fc1, nn.Dense) and type(net.fc1) is nn.Dense
    assert_unchanged(before, snapshot(net))


def test_net_without_convertible_layer():
    net = NoLayers()
    with pytest.raises(ValueError, match=r"'net'.*at least one layer.*NoLayers"):
        thor(net, **GOOD)
    with pytest.raises(TypeError, match=r"'net'.*Cell"):
        thor("net", **GOOD)


def test_good_call_converts_and_accepts_every_valid_form():
    net = Net()
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.0, weight_decay=0, loss_scale=128,
               batch_size=8, use_nesterov=True, decay_filter=lambda p: "bias" not in p.name, split_indices=[0],
               enable_clip_grad=True, frequency=2, inverse="full", block_size=64)
    assert _thor_layers(net) == ["fc1", "fc2"]
    assert opt.get_frequency() == 2 and opt.decay_flags == (True, False, True, False)
    # converting an already converted net again is fine (the converter is idempotent)
    thor(net, LR, DAMPING, 0.9)
    assert _thor_layers(net) == ["fc1", "fc2"]


def test_signature_mirrors_mindspore():
    params = inspect.signature(thor).parameters
    names = list(params)
    assert names[:12] == ["net", "learning_rate", "damping", "momentum", "weight_decay", "loss_scale", "batch_size",
                          "use_nesterov", "decay_filter", "split_indices", "enable_clip_grad", "frequency"]
    defaults = {n: params[n].default for n in names[4:12] if n != "decay_filter"}
    assert defaults == dict(weight_decay=0.0, loss_scale=1.0, batch_size=32, use_nesterov=False, split_indices=None,
                            enable_clip_grad=False, frequency=100)
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names[12:])
    keep_all = params["decay_filter"].default
    assert keep_all(ms.Parameter(Tensor(1.0), name="w")) is True
    ms_params = inspect.signature(ms.nn.thor).parameters
    assert list(ms_params) == names[:12]
    assert all(ms_params[n].default == params[n].default for n in names[4:12] if n != "decay_filter")
