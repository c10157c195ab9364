"""Checkpoints move between MindSpore's own Lamb/ASGD and ms_optim's, by name, without renaming.

For each optimizer: a train cell (net + optimizer) is saved with ``mindspore.save_checkpoint`` from one
library and loaded with ``mindspore.load_param_into_net`` into the other's; every Parameter of the
checkpoint must find its counterpart (no name left over on either side) and every value must arrive
unchanged. MindSpore's Lamb cannot step on CPU (no fused kernel), so its state is filled with known
non-trivial values before saving; MindSpore's ASGD runs on CPU, so there both directions are also
continued for two steps and must agree (same state in, same numbers out).
"""
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import ms_optim

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)


def _net(seed):
    ms.set_seed(seed)
    return nn.SequentialCell([nn.Dense(3, 5), nn.ReLU(), nn.Dense(5, 2)])


def _train_cell(net, opt):
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    cell.set_train()
    return cell


def _batches(steps):
    data_rng = np.random.default_rng(7)
    return [(Tensor(data_rng.standard_normal((4, 3)).astype(np.float32)),
             Tensor(data_rng.standard_normal((4, 2)).astype(np.float32))) for _ in range(steps)]


def _values(cell):
    return {name: p.asnumpy().copy() for name, p in cell.parameters_dict().items()}


def _fill_state(cell, prefixes, rng):
    """Give every optimizer state Parameter (by name prefix) distinctive values, global_step 3."""
    for name, param in cell.parameters_dict().items():
        if name == "global_step":
            param.set_data(Tensor(np.array([3], np.int32)))
        elif name.startswith(prefixes):
            shape = tuple(param.shape)
            param.set_data(Tensor(rng.uniform(0.1, 1.0, size=shape).astype(np.float32)))


def _exchange(src_cell, dst_cell, tmp_path, tag):
    """Save src, load into dst by name; assert the name sets match exactly and values round-trip."""
    path = os.path.join(str(tmp_path), f"{tag}.ckpt")
    ms.save_checkpoint(src_cell, path)
    saved = ms.load_checkpoint(path)
    expected = _values(src_cell)
    assert set(saved) == set(expected)
    assert set(saved) == set(dst_cell.parameters_dict()), (
        f"names only in the checkpoint: {sorted(set(saved) - set(dst_cell.parameters_dict()))}; "
        f"only in the destination: {sorted(set(dst_cell.parameters_dict()) - set(saved))}")
    not_loaded, unused = ms.load_param_into_net(dst_cell, saved, strict_load=True)
    assert list(not_loaded) == [] and list(unused) == []
    loaded = _values(dst_cell)
    for name, value in expected.items():
        assert loaded[name].dtype == value.dtype, name
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    return expected


STATE_PREFIXES = {"Lamb": ("lamb_m.", "lamb_v."), "ASGD": ("ax_", "mu_", "eta_")}


def _mindspore_cls(name):
    return getattr(nn, name)  # MindSpore's own class, the other library in this exchange


@pytest.mark.parametrize("name", ["Lamb", "ASGD"])
def test_state_names_are_mindspores(name):
    """Same Parameter names, shapes and dtypes in both libraries' optimizers over the same net."""
    ours_net = _net(0)
    ours = _train_cell(ours_net, getattr(ms_optim, name)(ours_net.trainable_params(), learning_rate=0.01))
    their_net = _net(0)
    theirs = _train_cell(their_net, _mindspore_cls(name)(their_net.trainable_params(), learning_rate=0.01))
    describe = lambda cell: {n: (tuple(p.shape), p.dtype) for n, p in cell.parameters_dict().items()}  # noqa: E731
    assert describe(ours) == describe(theirs)
    assert any(n.startswith(STATE_PREFIXES[name]) for n in describe(ours))


def test_lamb_checkpoint_both_ways(tmp_path):
    rng = np.random.default_rng(3)
    # MindSpore -> ms_optim: MindSpore's Lamb constructs on CPU; its state gets known values.
    their_net = _net(1)
    theirs = _train_cell(their_net, nn.Lamb(their_net.trainable_params(), learning_rate=0.01))
    _fill_state(theirs, STATE_PREFIXES["Lamb"], rng)
    ours_net = _net(2)
    ours = _train_cell(ours_net, ms_optim.Lamb(ours_net.trainable_params(), learning_rate=0.01))
    _exchange(theirs, ours, tmp_path, "ms_to_ours")
    # ... and ms_optim's Lamb steps on from the loaded state.
    before = _values(ours)
    for x, y in _batches(2):
        ours(x, y)
    after = _values(ours)
    assert after["global_step"][0] == 5
    for key in ("0.weight", "lamb_m.0.weight", "lamb_v.2.bias"):
        assert np.all(np.isfinite(after[key])) and not np.array_equal(after[key], before[key]), key

    # ms_optim -> MindSpore: state produced by ms_optim's own steps.
    back_net = _net(3)
    back = _train_cell(back_net, nn.Lamb(back_net.trainable_params(), learning_rate=0.01))
    _exchange(ours, back, tmp_path, "ours_to_ms")


def test_asgd_checkpoint_both_ways_and_continues_identically(tmp_path):
    batches = _batches(4)
    # MindSpore's ASGD trains two steps, is saved, and resumes in ms_optim.
    their_net = _net(1)
    theirs = _train_cell(their_net, nn.ASGD(their_net.trainable_params(), learning_rate=0.05, lambd=0.1,
                                            t0=1.0))
    for x, y in batches[:2]:
        theirs(x, y)
    ours_net = _net(2)
    ours = _train_cell(ours_net, ms_optim.ASGD(ours_net.trainable_params(), learning_rate=0.05, lambd=0.1,
                                               t0=1.0))
    _exchange(theirs, ours, tmp_path, "ms_to_ours")
    for x, y in batches[2:]:
        theirs(x, y)
        ours(x, y)
    theirs_after, ours_after = _values(theirs), _values(ours)
    for key, value in theirs_after.items():
        assert np.all(np.isfinite(ours_after[key])), key
        np.testing.assert_allclose(ours_after[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    assert not np.array_equal(ours_after["ax_.0.weight"], 0)

    # ms_optim's state back into MindSpore's ASGD: both continue to the same numbers.
    back_net = _net(3)
    back = _train_cell(back_net, nn.ASGD(back_net.trainable_params(), learning_rate=0.05, lambd=0.1, t0=1.0))
    _exchange(ours, back, tmp_path, "ours_to_ms")
    for x, y in batches[:2]:
        back(x, y)
        ours(x, y)
    back_after, ours_after = _values(back), _values(ours)
    for key, value in back_after.items():
        np.testing.assert_allclose(ours_after[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
