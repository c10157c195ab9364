"""``thor()`` argument validation: every documented Raises line, its type and message, checked
BEFORE the net is touched (a refused call leaves the net unconverted), and the exact signature."""
import inspect

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from support.optim_table import BY_NAME
from support.snapshot import assert_unchanged, snapshot

from ms_optim._thor.factory import thor
from ms_optim._thor.net.layers import ThorLayer

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

# every argument set thor() must refuse: the generic optimizer table's (support/refusals.py), which
# tests/optim/test_optim_generic.py checks for the type and the message's words; here, also that the
# refusal comes before the net is touched
BAD = BY_NAME["thor"].bad


def _thor_layers(net):
    return [name for name, cell in net.cells_and_names() if isinstance(cell, ThorLayer)]


@pytest.mark.parametrize("bad", BAD, ids=[bad.label for bad in BAD])
def test_bad_argument_raises_before_conversion(bad):
    net = Net()
    before = snapshot(net)
    with pytest.raises(bad.error) as info:
        bad.build(net)
    message = str(info.value)
    assert "'thor'" in message
    for fragment in (f"'{bad.name}'", *bad.also, bad.shows):
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
