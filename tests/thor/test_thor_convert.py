"""ConvertNetUtils().convert_to_thor_net: what is replaced, what is kept, idempotence, checkpoints."""
import os

import mindspore as ms
import mindspore.common.dtype as mstype
import numpy as np
import pytest
from mindspore import Tensor, amp, nn, ops
from reference import thor_factors as ref

from ms_optim._thor.net.convert import ConvertNetUtils
from ms_optim._thor.net.layers import Conv2dThor, DenseThor, EmbeddingThor, ThorLayer


class _Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, (3, 2), stride=2, pad_mode="pad", padding=(1, 0, 2, 1), dilation=(2, 1),
                              has_bias=True)
        self.depthwise = nn.Conv2d(4, 4, 3, group=4)           # unsupported: stays first-order
        self.frozen = nn.Conv2d(4, 4, 1, has_bias=True)        # requires_grad False: stays plain
        for param in self.frozen.get_parameters():
            param.requires_grad = False
        self.seq = nn.SequentialCell([nn.ReLU(), nn.Conv2d(4, 2, 3, pad_mode="same"), nn.Flatten()])

    def construct(self, x):
        return self.seq(self.frozen(self.depthwise(self.conv(x))))


class _Net(nn.Cell):
    """Nested Cells, SequentialCell, CellList, a shared layer, an embedding and a float16 Dense."""

    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.heads = nn.CellList([nn.Dense(16, 5), nn.Dense(5, 3, activation="tanh")])
        self.shared = nn.Dense(3, 3)
        self.embed = nn.Embedding(6, 3, padding_idx=1)
        self.half = nn.Dense(3, 3, dtype=mstype.float16)

    def construct(self, x, ids):
        h = self.block(x)
        for head in self.heads:
            h = head(h)
        h = self.shared(self.shared(h)) + self.embed(ids).sum(1)
        return h + ops.cast(self.half(ops.cast(h, mstype.float16)), mstype.float32)


def _inputs(rng):
    x = Tensor(rng.standard_normal((2, 3, 7, 6)).astype(np.float32))
    ids = Tensor(np.array([[0, 1, 5], [5, 5, 2]], np.int32))
    return x, ids


def _parameters_by_name(net):
    return {p.name: p for p in net.get_parameters()}


def test_convert_replaces_keeps_and_is_idempotent(mode, rng):
    ms.set_seed(0)
    net = _Net()
    x, ids = _inputs(rng)
    before = net(x, ids).asnumpy()
    params_before = _parameters_by_name(net)
    conv = net.block.conv

    out = ConvertNetUtils().convert_to_thor_net(net)
    assert out is net
    kinds = {name: type(cell) for name, cell in net.cells_and_names()}
    assert kinds["block.conv"] is Conv2dThor and kinds["block.seq.1"] is Conv2dThor
    assert kinds["heads.0"] is DenseThor and kinds["heads.1"] is DenseThor and kinds["shared"] is DenseThor
    assert kinds["embed"] is EmbeddingThor and kinds["half"] is DenseThor
    assert kinds["block.depthwise"] is nn.Conv2d and kinds["block.frozen"] is nn.Conv2d
    assert isinstance(net.block.seq.cell_list[1], Conv2dThor)  # SequentialCell's own list updated too
    # same Parameter objects, names, dtypes and values; only factor Parameters added, named after the layer
    params_after = _parameters_by_name(net)
    for name, param in params_before.items():
        assert params_after[name] is param
    assert net.half.weight.dtype == mstype.float16 and net.half.matrix_a_cov.dtype == mstype.float32
    added = sorted(set(params_after) - set(params_before))
    expected = sorted(f"{layer}.{attr}" for layer in ("block.conv", "block.seq.1", "heads.0", "heads.1", "shared",
                                                     "embed", "half")
                      for attr in ("matrix_a_cov", "matrix_g_cov", "thor_flag"))
    assert added == expected
    # geometry kept exactly (MindSpore's converter drops dilation and fails on non-square kernels)
    new_conv = net.block.conv
    assert new_conv.weight is conv.weight and new_conv.bias is conv.bias
    assert (new_conv.kernel_size, new_conv.stride, new_conv.pad_mode, new_conv.padding, new_conv.dilation) == \
        ((3, 2), (2, 2), "pad", (1, 0, 2, 1), (2, 1))
    np.testing.assert_array_equal(net(x, ids).asnumpy(), before)
    # converting again changes nothing
    layers = {name: cell for name, cell in net.cells_and_names()}
    ConvertNetUtils().convert_to_thor_net(net)
    assert {name: cell for name, cell in net.cells_and_names()} == layers
    assert _parameters_by_name(net).keys() == params_after.keys()
    # THOR candidates are exactly the converted layers
    assert sorted(n for n, _ in ConvertNetUtils.thor_candidates(net)) == \
        ["block.conv", "block.seq.1", "embed", "half", "heads.0", "heads.1", "shared"]

    # the converted net trains; its first conv's and its embedding's A follow the reference, and every
    # THOR layer stored finite, non-zero factors
    net.set_train()

    class _Loss(nn.Cell):
        def __init__(self, network):
            super().__init__(auto_prefix=False)
            self.network = network

        def construct(self, xx, ii, r):
            return ops.reduce_sum(self.network(xx, ii) * r)

    step = nn.TrainOneStepCell(_Loss(net), nn.SGD(net.trainable_params(), 0.0))
    step.set_train()
    r = rng.standard_normal((2, 3)).astype(np.float32)
    step(x, ids, Tensor(r))
    a_exp = ref.conv_factors(x.asnumpy(), np.zeros((2, 4, 2, 4)), (3, 2), 2, (2, 1), "pad", (1, 0, 2, 1))[0]
    np.testing.assert_allclose(net.block.conv.matrix_a_cov.asnumpy(), a_exp, rtol=1e-4, atol=1e-4 * np.abs(a_exp).max())
    emb_a = ref.embedding_factors(ids.asnumpy(), np.zeros((6, 3)), 6)[0]
    np.testing.assert_allclose(net.embed.matrix_a_cov.asnumpy(), emb_a, rtol=1e-6)
    for _, cell in ConvertNetUtils.thor_candidates(net):
        for factor in (cell.matrix_a_cov.asnumpy(), cell.matrix_g_cov.asnumpy()):
            assert np.isfinite(factor).all() and np.abs(factor).max() > 0


def test_public_names():
    """The facades expose these classes under MindSpore's names."""
    from ms_optim import nn as ms_optim_nn
    from ms_optim import train_thor
    assert train_thor.ConvertNetUtils is ConvertNetUtils
    assert (ms_optim_nn.DenseThor, ms_optim_nn.Conv2dThor, ms_optim_nn.EmbeddingThor) == \
        (DenseThor, Conv2dThor, EmbeddingThor)


def test_checkpoint_round_trip(tmp_path, rng):
    """A converted net's checkpoint loads into the plain net and back; outputs agree."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, ids = _inputs(rng)
    ms.set_seed(1)
    thor_net = ConvertNetUtils().convert_to_thor_net(_Net())
    ms.set_seed(2)
    plain = _Net()
    assert not np.allclose(plain(x, ids).asnumpy(), thor_net(x, ids).asnumpy())
    path = os.path.join(str(tmp_path), "thor.ckpt")
    ms.save_checkpoint(thor_net, path)
    not_loaded, _ = ms.load_param_into_net(plain, ms.load_checkpoint(path))
    assert not not_loaded
    np.testing.assert_array_equal(plain(x, ids).asnumpy(), thor_net(x, ids).asnumpy())
    # and back: plain checkpoint into a fresh converted net (its factors are not in the file)
    ms.set_seed(3)
    plain2 = _Net()
    path2 = os.path.join(str(tmp_path), "plain.ckpt")
    ms.save_checkpoint(plain2, path2)
    not_loaded, _ = ms.load_param_into_net(thor_net, ms.load_checkpoint(path2))
    assert not_loaded and all(n.rsplit(".", 1)[1] in ("matrix_a_cov", "matrix_g_cov", "thor_flag")
                              for n in not_loaded)
    np.testing.assert_array_equal(plain2(x, ids).asnumpy(), thor_net(x, ids).asnumpy())
    # the factor Parameters themselves survive a save/load between converted nets
    ops.assign(thor_net.shared.matrix_a_cov, Tensor(np.eye(3, dtype=np.float32) * 2))
    ops.assign(thor_net.shared.thor_flag, Tensor(False))
    ms.save_checkpoint(thor_net, path)
    other = ConvertNetUtils().convert_to_thor_net(_Net())
    ms.load_param_into_net(other, ms.load_checkpoint(path))
    np.testing.assert_array_equal(other.shared.matrix_a_cov.asnumpy(), np.eye(3) * 2)
    assert not bool(other.shared.thor_flag.asnumpy())


class _MyDense(nn.Dense):
    def construct(self, x):
        return super().construct(x) * 2


def test_unsupported_layers_stay_and_amp_after_conversion(mode, rng):
    """Subclasses, grouped convs and other layers stay as they are; a converted net can then be
    wrapped by amp O2/O3 and still computes float32 factors."""
    net = nn.SequentialCell([_MyDense(4, 4), nn.Dense(4, 3), nn.BatchNorm1d(3)])
    ConvertNetUtils().convert_to_thor_net(net)
    assert type(net[0]) is _MyDense and isinstance(net[1], DenseThor) and isinstance(net[2], nn.BatchNorm1d)
    with pytest.raises(TypeError, match="net"):
        ConvertNetUtils().convert_to_thor_net("not a net")
    bare = nn.Dense(2, 2)  # the root cell cannot be replaced in place: stays plain, and is no candidate
    assert ConvertNetUtils().convert_to_thor_net(bare) is bare and type(bare) is nn.Dense
    assert not ConvertNetUtils.thor_candidates(bare)
    assert [n for n, _ in ConvertNetUtils.thor_candidates(net)] == ["1"]
    dense = net[1]
    wrapped = amp.auto_mixed_precision(net, "O3" if mode == "graph" else "O2")
    step = nn.TrainOneStepCell(nn.WithLossCell(wrapped, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.0))
    step.set_train()
    x = rng.standard_normal((6, 4)).astype(np.float32)
    assert np.isfinite(step(Tensor(x), Tensor(np.zeros((6, 3), np.float32))).asnumpy())
    f16 = lambda v: np.asarray(v).astype(np.float16).astype(np.float64)  # noqa: E731
    h = (f16(x) @ f16(net[0].weight.asnumpy()).T + f16(net[0].bias.asnumpy())) * 2
    a = dense.matrix_a_cov.asnumpy()
    assert dense.matrix_a_cov.dtype == mstype.float32 and isinstance(dense, ThorLayer)
    np.testing.assert_allclose(a, ref.dense_factors(h, np.zeros((6, 3)))[0], rtol=2e-3, atol=2e-3 * np.abs(a).max())


def test_bare_train_one_step_cell_collects_factors_without_set_train(mode):
    """A converted net trained by a TrainOneStepCell that never calls set_train() still collects A
    (THOR layers start in training mode); set_train(False) turns collection off."""
    from mindspore import Tensor
    from mindspore import nn as mnn

    from ms_optim import nn as thor_nn

    rng = np.random.default_rng(7)
    net = mnn.SequentialCell(mnn.Dense(4, 8), mnn.ReLU(), mnn.Dense(8, 3))
    steps = 4
    opt = thor_nn.thor(net, Tensor(np.full(steps, 0.1, np.float32)), Tensor(np.full(steps, 0.03, np.float32)),
                       0.9, frequency=2)
    loss = mnn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = mnn.TrainOneStepCell(mnn.WithLossCell(net, loss), opt)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    step(Tensor(x), Tensor(np.array([0, 1, 2, 0, 1], np.int32)))
    np.testing.assert_allclose(net[0].matrix_a_cov.asnumpy(), x.T @ x / 5, rtol=1e-4, atol=1e-6)

    net.set_train(False)
    assert not net[0].training
