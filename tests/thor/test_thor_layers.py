"""THOR layers: outputs equal to the plain layers, factors equal to the NumPy reference (float64).

Every test runs in PYNATIVE and GRAPH mode (``mode`` fixture), with the fused factor kernels of CPU
(``ms_optim._thor.net.factor_kernels``) and with the composite taps of other devices (``path`` fixture).
The losses are linear in the layer outputs, ``L = sum(out * r)`` with ``r`` drawn per step (already
divided by the batch size), so the gradient reaching each layer is known exactly: ``dL/dout = r``.

Flags and factors are changed from Python with ``ops.assign`` (an in-place write compiled graphs see);
``Parameter.set_data`` after compilation is not seen by MindSpore 2.10 graphs that write the Parameter.
"""
import inspect

import mindspore as ms
import mindspore.common.dtype as mstype
import numpy as np
import pytest
from mindspore import Tensor, amp, nn, ops
from reference import thor_factors as ref

from ms_optim._thor.net.layers import Conv2dThor, DenseThor, EmbeddingThor, ThorLayer

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)

RTOL = 1e-4


def _close(actual, expected, rtol=RTOL, what=""):
    expected = np.asarray(expected, np.float64)
    atol = rtol * max(float(np.abs(expected).max()), 1e-12)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol, err_msg=what)


def _set_flag(layers, value: bool):
    for layer in layers:
        ops.assign(layer.thor_flag, Tensor(value))


class _LinearLoss(nn.Cell):
    """L = sum_k sum(out_k * r_k) for a net returning one tensor or a tuple of tensors."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, rs):
        outs = self.net(x)
        if not isinstance(outs, tuple):
            outs = (outs,)
        loss = ops.reduce_sum(outs[0] * rs[0])
        for k in range(1, len(outs)):
            loss = loss + ops.reduce_sum(outs[k] * rs[k])
        return loss


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- Dense
def test_dense_factors_output_flag_eval_and_overflow(mode, path, rng):
    """DenseThor with bias, ReLU and a 3-D input, in TrainOneStepCell, over four steps:
    flag on (factors = reference), flag off (factors untouched), eval mode (untouched), flag on with a
    non-finite gradient (A updated, G kept)."""
    layer = DenseThor(5, 4, weight_init=Tensor(_f32(rng, 4, 5)), bias_init=Tensor(_f32(rng, 4)),
                      activation='relu')
    plain = nn.Dense(5, 4, weight_init=Tensor(layer.weight.asnumpy()), bias_init=Tensor(layer.bias.asnumpy()),
                     activation='relu')
    assert layer.kind == "dense" and layer.weight_param() is layer.weight
    assert layer.matrix_a_cov.shape == (5, 5) and layer.matrix_g_cov.shape == (4, 4)
    assert layer.matrix_a_cov.dtype == mstype.float32 and bool(layer.thor_flag.asnumpy())
    assert not layer.matrix_a_cov.requires_grad and not layer.thor_flag.requires_grad
    step = nn.TrainOneStepCell(_LinearLoss(layer), nn.SGD(layer.trainable_params(), 0.0))
    step.set_train()
    w, b = layer.weight.asnumpy(), layer.bias.asnumpy()
    batch = 2  # x is (2, 3, 5): N = 6 rows

    def expected(x, r):
        s = ref.dense_forward(x, w, b)
        return ref.dense_factors(x, r * (s > 0))

    # step 1: THOR step
    x, r = _f32(rng, 2, 3, 5), _f32(rng, 2, 3, 4) / batch
    step(Tensor(x), (Tensor(r),))
    a_exp, g_exp = expected(x, r)
    _close(layer.matrix_a_cov.asnumpy(), a_exp, what="A")
    _close(layer.matrix_g_cov.asnumpy(), g_exp, what="G")
    # forward equals nn.Dense, in train and eval mode
    out = layer(Tensor(x)).asnumpy()
    np.testing.assert_array_equal(out, plain(Tensor(x)).asnumpy())
    _close(out, np.maximum(ref.dense_forward(x, w, b), 0), rtol=1e-5)
    # step 2: flag off -> nothing stored
    _set_flag([layer], False)
    a_old, g_old = layer.matrix_a_cov.asnumpy().copy(), layer.matrix_g_cov.asnumpy().copy()
    step(Tensor(_f32(rng, 2, 3, 5)), (Tensor(_f32(rng, 2, 3, 4)),))
    np.testing.assert_array_equal(layer.matrix_a_cov.asnumpy(), a_old)
    np.testing.assert_array_equal(layer.matrix_g_cov.asnumpy(), g_old)
    # eval mode with the flag on -> nothing stored
    _set_flag([layer], True)
    layer.set_train(False)
    x7 = Tensor(_f32(rng, 7, 5))
    np.testing.assert_array_equal(layer(x7).asnumpy(), plain(x7).asnumpy())
    np.testing.assert_array_equal(layer.matrix_a_cov.asnumpy(), a_old)
    step.set_train()
    # step 3: flag on, non-finite output gradient -> A from this batch, G kept
    x3, r3 = _f32(rng, 2, 3, 5), _f32(rng, 2, 3, 4)
    r3[0, 0, :] = np.inf
    step(Tensor(x3), (Tensor(r3),))
    _close(layer.matrix_a_cov.asnumpy(), ref.dense_factors(x3, r3[..., :1])[0], what="A after overflow")
    np.testing.assert_array_equal(layer.matrix_g_cov.asnumpy(), g_old)


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_dense_factors_float32_under_amp(mode, path, rng, level):
    """Under amp O2/O3 the layer runs in float16 but A and G are computed and stored in float32."""
    l1 = DenseThor(6, 5, weight_init=Tensor(_f32(rng, 5, 6, scale=0.5)), bias_init=Tensor(_f32(rng, 5)))
    l2 = DenseThor(5, 3, weight_init=Tensor(_f32(rng, 3, 5, scale=0.5)), has_bias=False)
    net = amp.auto_mixed_precision(nn.SequentialCell([l1, l2]), level)
    step = nn.TrainOneStepCell(_LinearLoss(net), nn.SGD(net.trainable_params(), 0.0))
    step.set_train()
    x = _f32(rng, 8, 6, scale=3.0) + 0.123
    r = _f32(rng, 8, 3) / 8
    loss = step(Tensor(x), (Tensor(r),))
    assert np.isfinite(loss.asnumpy())
    for layer in (l1, l2):
        assert layer.matrix_a_cov.dtype == mstype.float32 and layer.matrix_g_cov.dtype == mstype.float32
    x16 = x.astype(np.float16).astype(np.float64)  # amp casts the cell input to float16
    # float32 accumulation of float16 inputs: 1e-4 relative (a float16 product would be ~1e-3 off)
    _close(l1.matrix_a_cov.asnumpy(), ref.dense_factors(x16, np.zeros((8, 5)))[0], what="A (float32 under amp)")
    # the second layer's G from the float16 gradient r: exactly representable products, float32 sums
    r16 = r.astype(np.float16).astype(np.float64)
    _close(l2.matrix_g_cov.asnumpy(), ref.dense_factors(np.zeros((8, 5)), r16)[1], what="G (float32 under amp)")


class _ConvEmbNet(nn.Cell):
    def __init__(self, rng):
        super().__init__()
        self.conv = Conv2dThor(2, 3, (3, 2), stride=2, has_bias=True,
                               weight_init=Tensor(_f32(rng, 3, 2, 3, 2)), bias_init=Tensor(_f32(rng, 3)))
        self.embed = EmbeddingThor(5, 3, embedding_table=Tensor(_f32(rng, 5, 3)))
        self.flatten = nn.Flatten()

    def construct(self, x, ids):
        return self.flatten(self.conv(x)).sum(1, keepdims=True) + self.embed(ids).sum(1)


class _LinearLoss2(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x, ids, r):
        return ops.reduce_sum(self.net(x, ids) * r)


def test_conv_embedding_factors_float32_under_amp(mode, path, rng):
    """Conv2dThor and EmbeddingThor under amp O3 (everything float16): A in float32 from the float16
    input, G finite and stored in float32."""
    net = _ConvEmbNet(rng)
    step = nn.TrainOneStepCell(_LinearLoss2(amp.auto_mixed_precision(net, "O3")),
                               nn.SGD(net.trainable_params(), 0.0))
    step.set_train()
    x = _f32(rng, 2, 2, 6, 5, scale=3.0) + 0.123
    ids = np.array([[1, 1, 4], [0, 1, 3]], np.int32)
    step(Tensor(x), Tensor(ids), Tensor(_f32(rng, 2, 3)))
    x16 = x.astype(np.float16).astype(np.float64)
    a_exp = ref.conv_factors(x16, np.zeros((2, 3, 3, 3)), (3, 2), 2, 1, "same", 0)[0]
    _close(net.conv.matrix_a_cov.asnumpy(), a_exp, what="conv A (float32 under amp)")
    _close(net.embed.matrix_a_cov.asnumpy(), ref.embedding_factors(ids, np.zeros((6, 3)), 5)[0], what="emb A")
    for layer in (net.conv, net.embed):
        g = layer.matrix_g_cov.asnumpy()
        assert layer.matrix_g_cov.dtype == mstype.float32 and np.isfinite(g).all() and np.abs(g).max() > 0


# ----------------------------------------------------------------------------- Conv2d
_CONV_CASES = [
    # (out, kernel, stride, pad_mode, padding, dilation, has_bias)
    (4, 3, 2, "pad", 1, 1, True),                    # stride 2 + padding, bias
    (2, 3, 1, "same", 0, 2, False),                  # dilation 2, "same"
    (3, (2, 3), (1, 2), "valid", 0, 1, True),        # non-square kernel and stride, "valid"
    (2, (3, 1), 2, "same", 0, 1, True),              # asymmetric "same" padding with stride 2
    (2, 2, 1, "pad", (0, 1, 2, 1), (1, 2), False),   # 4-tuple padding, non-square dilation
    (3, 1, 2, "same", 0, 1, False),                  # 1x1 with stride 2: the strided input, no im2col
    (2, 1, 2, "pad", (1, 0, 0, 1), 1, True),         # 1x1 with padding and stride: pad, then stride
]


class _ConvBank(nn.Cell):
    def __init__(self, convs):
        super().__init__()
        self.convs = nn.CellList(convs)

    def construct(self, x):
        outs = ()
        for conv in self.convs:
            outs = outs + (conv(x),)
        return outs


@pytest.mark.slow
def test_conv_factors_and_outputs(mode, path, rng):
    """Conv2dThor for stride/padding/dilation/kernel shapes/pad modes/bias: output = nn.Conv2d = NumPy
    conv; A and G = reference; trained through mindspore.value_and_grad."""
    convs, plains = [], []
    for out, k, s, pm, p, d, bias in _CONV_CASES:
        kh, kw = ref.pair(k)
        w = Tensor(_f32(rng, out, 3, kh, kw))
        bi = Tensor(_f32(rng, out)) if bias else 'zeros'
        convs.append(Conv2dThor(3, out, k, stride=s, pad_mode=pm, padding=p, dilation=d, has_bias=bias,
                                weight_init=w, bias_init=bi))
        plains.append(nn.Conv2d(3, out, k, stride=s, pad_mode=pm, padding=p, dilation=d, has_bias=bias,
                                weight_init=w, bias_init=bi))
    assert all(c.kind == "conv" for c in convs)
    bank = _ConvBank(convs)
    x = _f32(rng, 2, 3, 8, 7)
    outs = [o.asnumpy() for o in bank(Tensor(x))]  # eval mode: plain forward
    plain_outs = [o.asnumpy() for o in _ConvBank(plains)(Tensor(x))]
    for out, plain_out, conv, case in zip(outs, plain_outs, convs, _CONV_CASES):
        _, k, s, pm, p, d, bias = case
        np.testing.assert_array_equal(out, plain_out, err_msg=str(case))
        expect = ref.conv2d_forward(x, conv.weight.asnumpy(), conv.bias.asnumpy() if bias else None, s, d, pm, p)
        _close(out, expect, rtol=1e-5, what=str(case))
    np.testing.assert_array_equal(convs[0].matrix_a_cov.asnumpy(), 0)  # eval mode: no factors

    loss = _LinearLoss(bank)
    loss.set_train()
    grad_fn = ms.value_and_grad(loss, None, bank.trainable_params())
    for _ in range(2):  # two batches: the factors follow the current batch
        x = _f32(rng, 2, 3, 8, 7)
        rs = tuple(_f32(rng, *o.shape) / 2 for o in outs)
        _, grads = grad_fn(Tensor(x), tuple(Tensor(r) for r in rs))
        for conv, r, case in zip(convs, rs, _CONV_CASES):
            _, k, s, pm, p, d, _ = case
            assert conv.matrix_a_cov.shape == (3 * ref.pair(k)[0] * ref.pair(k)[1],) * 2
            a_exp, g_exp = ref.conv_factors(x, r, k, s, d, pm, p)
            _close(conv.matrix_a_cov.asnumpy(), a_exp, what=f"A {case}")
            _close(conv.matrix_g_cov.asnumpy(), g_exp, what=f"G {case}")
        # the weight gradient (what THOR preconditions) matches the reference patches
        _close(grads[0].asnumpy(), ref.conv2d_weight_grad(x, rs[0], 3, 2, 1, "pad", 1), rtol=1e-4, what="dW")


def test_conv_group_refused():
    with pytest.raises(ValueError, match="group"):
        Conv2dThor(4, 4, 3, group=2)


# ----------------------------------------------------------------------------- Embedding
class _EmbBank(nn.Cell):
    def __init__(self, e1, e2):
        super().__init__()
        self.e1 = e1
        self.e2 = e2

    def construct(self, ids):
        return self.e1(ids), self.e2(ids)


def test_embedding_factors_and_output(mode, path, rng):
    """EmbeddingThor (gather and one-hot) with repeated ids and padding_idx: output = nn.Embedding,
    A = counts / N, G = N d^T d; trained through mindspore.grad under ms.jit."""
    table = _f32(rng, 7, 3)
    e1 = EmbeddingThor(7, 3, embedding_table=Tensor(table), padding_idx=0)
    e2 = EmbeddingThor(7, 3, use_one_hot=True, embedding_table=Tensor(table))
    plain = nn.Embedding(7, 3, embedding_table=Tensor(table), padding_idx=0)
    assert e1.kind == "embedding" and e1.weight_param() is e1.embedding_table
    assert e1.matrix_a_cov.shape == (7,) and e1.matrix_g_cov.shape == (3, 3)
    np.testing.assert_array_equal(e1.embedding_table.asnumpy()[0], 0)  # padding row zeroed like nn.Embedding
    ids = np.array([[0, 3, 3, 5], [3, 0, 6, 1]], np.int32)
    np.testing.assert_array_equal(e1(Tensor(ids)).asnumpy(), plain(Tensor(ids)).asnumpy())
    _close(e2(Tensor(ids)).asnumpy(), table[ids], rtol=1e-6)

    loss = _LinearLoss(_EmbBank(e1, e2))
    loss.set_train()
    grad_fn = ms.grad(loss, None, loss.trainable_params())

    def train(i, rs):
        return grad_fn(i, rs)

    train = ms.jit(train)
    for step in range(2):
        if step == 1:
            ids = np.array([[2, 2, 2, 0], [4, 4, 1, 2]], np.int32)
        rs = (_f32(rng, 2, 4, 3) / 2, _f32(rng, 2, 4, 3) / 2)
        grads = train(Tensor(ids), (Tensor(rs[0]), Tensor(rs[1])))
        for layer, r in zip((e1, e2), rs):
            a_exp, g_exp = ref.embedding_factors(ids, r, 7)
            _close(layer.matrix_a_cov.asnumpy(), a_exp, what="A")
            _close(layer.matrix_g_cov.asnumpy(), g_exp, what="G")
        dtable = np.zeros((7, 3))
        np.add.at(dtable, ids.reshape(-1), rs[0].reshape(-1, 3))
        _close(grads[0].asnumpy(), dtable, what="d table")


# ----------------------------------------------------------------------------- API
def test_signatures_and_from_cell():
    """Signatures mirror MindSpore's; from_cell reuses the Parameter objects; wrong cells are refused."""
    assert str(inspect.signature(DenseThor)) == ("(in_channels, out_channels, weight_init='normal', "
                                                 "bias_init='zeros', has_bias=True, activation=None)")
    assert str(inspect.signature(Conv2dThor)) == ("(in_channels, out_channels, kernel_size, stride=1, "
                                                  "pad_mode='same', padding=0, dilation=1, group=1, has_bias=False, "
                                                  "weight_init='normal', bias_init='zeros')")
    assert str(inspect.signature(EmbeddingThor)) == ("(vocab_size, embedding_size, use_one_hot=False, "
                                                     "embedding_table='normal', dtype=mindspore.float32, "
                                                     "padding_idx=None)")
    dense = nn.Dense(3, 2, dtype=mstype.float16)
    thor = DenseThor.from_cell(dense)
    assert isinstance(thor, ThorLayer) and thor.weight is dense.weight and thor.bias is dense.bias
    assert thor.weight.dtype == mstype.float16 and thor.matrix_a_cov.dtype == mstype.float32
    conv = nn.Conv2d(2, 3, (1, 2), pad_mode="pad", padding=(1, 0, 0, 2), dilation=(2, 1), has_bias=True)
    tconv = Conv2dThor.from_cell(conv)
    assert tconv.weight is conv.weight and tconv.bias is conv.bias
    assert (tconv.kernel_size, tconv.stride, tconv.dilation, tconv.padding, tconv.pad_mode) == \
        ((1, 2), (1, 1), (2, 1), (1, 0, 0, 2), "pad")
    with pytest.raises(TypeError, match="cell"):
        DenseThor.from_cell(conv)
    with pytest.raises(TypeError, match="cell"):
        Conv2dThor.from_cell(nn.Conv2d(4, 4, 3, group=2))
    with pytest.raises(ValueError):
        DenseThor(0, 3)


class _TwiceShared(nn.Cell):
    def __init__(self, layer):
        super().__init__()
        self.shared = layer

    def construct(self, x, r):
        return ops.reduce_sum(self.shared(self.shared(x)) * r)


def test_layer_called_twice_keeps_first_call_factors(mode, path, rng):
    """A layer used twice in a step (in GRAPH mode too, without a graph cycle) stores A and G of
    the same call: the first, whose backward runs last."""
    w = _f32(rng, 3, 3)
    net = _TwiceShared(DenseThor(3, 3, weight_init=Tensor(w), has_bias=False))
    step = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.0))
    step.set_train()
    x, r = _f32(rng, 4, 3), _f32(rng, 4, 3)
    step(Tensor(x), Tensor(r))
    a_exp, g_exp = ref.dense_factors(x, r @ w)  # first call: input x, output gradient r @ W
    _close(net.shared.matrix_a_cov.asnumpy(), a_exp, what="A")
    _close(net.shared.matrix_g_cov.asnumpy(), g_exp, what="G")
