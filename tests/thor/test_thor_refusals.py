"""Every refusal of ``ConvertModelUtils.convert_to_thor_model`` and ``ConvertNetUtils`` raises the
documented type naming the argument, BEFORE anything changes: the net's cells (types, precision
flags, training mode), its Parameters (names, dtypes, values), the Model's attributes and the
optimizer's Parameters are compared before and after (tests/support/snapshot.py). ``thor()``'s own
refusals are checked the same way in test_thor_validation.py."""
import numpy as np
import pytest
from mindspore import Tensor, nn
from mindspore.train import Model
from support.snapshot import assert_unchanged, snapshot

from ms_optim._thor.factory import thor
from ms_optim._thor.model import ConvertModelUtils, ModelThor
from ms_optim._thor.net.convert import ConvertNetUtils


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc2 = nn.Dense(3, 2)

    def construct(self, x):
        return self.fc2(self.bn(self.fc1(x)))


def _setup():
    net = Net()
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, frequency=5)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return net, opt, loss, Model(net, loss, opt)


# (keyword overrides of convert_to_thor_model, exception, the argument the message names, the value it shows)
BAD = [
    (dict(amp_level="O2", loss_scale_manager="x"), TypeError, "loss_scale_manager", "'x'"),
    (dict(amp_level="O3", loss_scale_manager="x"), TypeError, "loss_scale_manager", "'x'"),
    (dict(amp_level="O2", loss_scale_manager=128.0), TypeError, "loss_scale_manager", "128.0"),
    (dict(amp_level="O4"), ValueError, "amp_level", "'O4'"),
    (dict(amp_level=2), TypeError, "amp_level", "2"),
    (dict(amp_level="O2", keep_batchnorm_fp32="yes"), TypeError, "keep_batchnorm_fp32", "'yes'"),
    (dict(amp_level="O3", metrics=["acc"]), TypeError, "metrics", "['acc']"),
    (dict(amp_level="O2", loss_fn="ce"), TypeError, "loss_fn", "'ce'"),
    (dict(amp_level="O2", frequency=7), ValueError, "frequency", "7"),
    (dict(amp_level="O2", frequency=5.0), TypeError, "frequency", "5.0"),
]


@pytest.mark.parametrize("overrides,exc,name,shows", BAD, ids=[str(b[0])[:50] for b in BAD])
def test_convert_to_thor_model_refuses_before_changing_anything(overrides, exc, name, shows):
    net, opt, loss, model = _setup()
    before = snapshot(net, model, opt)
    kwargs = {"network": net, "loss_fn": loss, "optimizer": opt, **overrides}
    with pytest.raises(exc) as info:
        ConvertModelUtils.convert_to_thor_model(model, **kwargs)
    message = str(info.value)
    assert "For 'ConvertModelUtils'" in message and f"'{name}'" in message and shows in message, message
    assert_unchanged(before, snapshot(net, model, opt))


def test_convert_to_thor_model_accepts_the_good_arguments():
    from mindspore.amp import FixedLossScaleManager

    net, opt, loss, model = _setup()
    converted = ConvertModelUtils.convert_to_thor_model(model, net, loss, opt, metrics={"acc"}, amp_level="O2",
                                                        loss_scale_manager=FixedLossScaleManager(8.0, False),
                                                        keep_batchnorm_fp32=True, frequency=5)
    assert isinstance(converted, ModelThor)


def test_other_optimizers_are_returned_unchanged_without_checks():
    net = Net()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True), opt)
    assert ConvertModelUtils.convert_to_thor_model(model, net, optimizer=opt, loss_scale_manager="x") is model


@pytest.mark.parametrize("bad", ["net", 3, None, [nn.Dense(2, 2)]])
def test_convert_net_utils_refuses_non_cells(bad):
    with pytest.raises(TypeError, match=r"For 'ConvertNetUtils', the argument 'net' must be a Cell"):
        ConvertNetUtils().convert_to_thor_net(bad)
    with pytest.raises(TypeError, match=r"For 'ConvertNetUtils', the argument 'net' must be a Cell"):
        ConvertNetUtils.thor_candidates(bad)
