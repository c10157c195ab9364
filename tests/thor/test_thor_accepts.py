"""``thor()`` accepts what MindSpore's thor accepts and trains with.

* ``split_indices`` is read only in data-parallel training (MindSpore's too): on one device a script's
  hard-coded ResNet-50 ``[26, 53]`` (or any list of ints) is accepted and changes nothing, bit for bit.
  In data parallel, as MindSpore's fusion pass: indices past the last THOR layer split nothing and are
  dropped with a warning; negative or not strictly increasing indices are a clear ValueError, before the
  net is converted.
* ``batch_size=32.0`` (MindSpore keeps it in a float32 Tensor) is 32; ``enable_clip_grad=1`` is True.
"""
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from support.nets import MLP
from support.snapshot import assert_unchanged, snapshot

from ms_optim._thor import validate as thor_config
from ms_optim._thor.factory import thor
from ms_optim._thor.net.layers import ThorLayer

LR = Tensor(np.full(6, 0.1, np.float32))
DAMPING = Tensor(np.full(6, 0.03, np.float32))


def _train(**kwargs):
    """Parameters (net and optimizer) after 3 steps with THOR's ``kwargs`` (same seed and data each call)."""
    ms.set_seed(0)
    net = MLP(4, 5, 3, weight_init="normal")
    opt = thor(net, LR, DAMPING, 0.9, **{"frequency": 2, "batch_size": 8, **kwargs})
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                               opt)
    rng = np.random.default_rng(0)
    for _ in range(3):
        step(Tensor((rng.standard_normal((8, 4)) * 30.0).astype(np.float32)),
             Tensor(rng.integers(0, 3, 8).astype(np.int32)))
    return {p.name: p.asnumpy() for p in list(net.get_parameters()) + list(opt.get_parameters())}


@pytest.mark.parametrize("given, same_as", [
    (dict(split_indices=[26, 53]), dict(split_indices=None)),  # model zoo ResNet's, on a 2-layer net
    (dict(split_indices=(1, 0)), dict(split_indices=None)),
    (dict(split_indices=[-1, 2**31]), dict(split_indices=None)),
    (dict(batch_size=8.0), dict(batch_size=8)),
    (dict(enable_clip_grad=1), dict(enable_clip_grad=True)),
    (dict(enable_clip_grad=0), dict(enable_clip_grad=False)),
], ids=["resnet50_splits", "decreasing", "negative_and_huge", "float_batch", "clip_1", "clip_0"])
def test_one_device_accepts_what_mindspore_accepts_and_trains_the_same(mode, given, same_as):
    got, want = _train(**given), _train(**same_as)
    assert set(got) == set(want)
    for name, value in want.items():
        assert np.all(np.isfinite(value)), name
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    if "enable_clip_grad" in given:  # the flag really reached the optimizer (clipping changes the numbers)
        other = _train(enable_clip_grad=not given["enable_clip_grad"])
        assert not np.array_equal(other["fc1.weight"], want["fc1.weight"])


@pytest.fixture
def data_parallel(monkeypatch):
    """thor() validating as in a 2-rank data-parallel run (the optimizer itself stays single-device)."""
    monkeypatch.setattr(thor_config, "data_parallel_group_size", lambda: 2)


@pytest.mark.parametrize("indices, kept", [([26, 53], []), ([0, 26, 53], [0]), ([0], [0]), ([], [])])
def test_data_parallel_drops_indices_past_the_last_layer_with_a_warning(data_parallel, indices, kept):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = thor(MLP(4, 5, 3, weight_init="normal"), LR, DAMPING, 0.9, split_indices=indices)
    assert opt.split_indices == kept
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if len(kept) < len(indices):
        assert any("'split_indices'" in m and str(indices) in m and "2 THOR layers" in m for m in messages), messages
    else:
        assert not any("split_indices" in m for m in messages), messages


@pytest.mark.parametrize("indices, words", [([1, 0], "strictly increasing"), ([0, 0], "strictly increasing"),
                                            ([-1], "non-negative"), ([0, -3], "non-negative")])
def test_data_parallel_refuses_what_mindspore_cannot_fuse(data_parallel, indices, words):
    net = MLP(4, 5, 3, weight_init="normal")
    before = snapshot(net)
    with pytest.raises(ValueError) as info:
        thor(net, LR, DAMPING, 0.9, split_indices=indices)
    message = str(info.value)
    assert "'thor'" in message and "'split_indices'" in message and words in message and str(indices) in message
    assert not any(isinstance(c, ThorLayer) for _, c in net.cells_and_names()), "refused: net left unconverted"
    assert_unchanged(before, snapshot(net))
