"""THOR for ``nn.Conv1d``: ``Conv1dThor`` against the float64 NumPy oracle (tests/reference/thor_conv1d.py).

* The layer: its output equals ``nn.Conv1d``'s and the oracle's, its weight gradient the oracle's, and its
  factors A and G the oracle's (whole and in diagonal blocks), for "same" (odd and even padding), "valid"
  and "pad" geometries with strides and dilations, in PYNATIVE and GRAPH mode, with the fused CPU kernels
  and with the composite ops (``mode`` and ``path`` fixtures). ``L = sum(out * r)``, so ``dL/ds = r``.
* A converted net: a 1-D conv net trained by ``thor`` for several steps (THOR steps and steps in between),
  every parameter after every step equal to the THOR oracle (``reference.thor_ref.ThorReference``).
* Conversion: ``nn.Conv1d`` becomes ``Conv1dThor`` under ``factor_convention="kfc"`` and stays a plain,
  first-order layer under ``"gpu"``/``"ascend"``; grouped and frozen ones stay plain.
* The public class: its signature is ``nn.Conv1d``'s; ``from_cell`` reuses the Parameters.
"""
import inspect

import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from reference import thor_conv1d as oracle
from reference.thor_factors import stored_form
from reference.thor_ref import ThorReference
from support.params import param_values
from support.thor_runs import init_params

import ms_optim
from ms_optim._thor.factory import thor
from ms_optim._thor.net.convert import ConvertNetUtils, convert_net, count_thor_cells, thor_class_for
from ms_optim._thor.net.curvature import KroneckerCurvature
from ms_optim._thor.net.layers import Conv1dThor, DenseThor
from ms_optim._thor.net.taps import TapSettings

RTOL = 1e-4


def _close(actual, expected, rtol=RTOL, what=""):
    expected = np.asarray(expected, np.float64)
    atol = rtol * max(float(np.abs(expected).max()), 1e-12)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol, err_msg=what)


class _LinearLoss(nn.Cell):
    """``L = sum(net(x) * r)``: the gradient reaching the output is ``r``."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, r):
        return ops.reduce_sum(self.net(x) * r)


class _Gradients(nn.Cell):
    """The gradients of :class:`_LinearLoss` w.r.t. the trainable parameters (a Cell: compiled in GRAPH
    mode)."""

    def __init__(self, layer):
        super().__init__()
        self.loss = _LinearLoss(layer)
        self.weights = self.loss.trainable_params()
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, x, r):
        return self.grad(self.loss, self.weights)(x, r)


# (kernel, stride, dilation, pad_mode, padding, length)
GEOMETRIES = {
    "same_odd": (3, 1, 1, "same", 0, 9),
    "same_even_stride": (4, 2, 1, "same", 0, 10),   # total padding 2 at stride 2, L_out 5
    "same_dilated": (2, 3, 2, "same", 0, 11),        # e = 3, L_out 4, total padding 1: (0, 1)
    "valid_kernel1_stride2": (1, 2, 1, "valid", 0, 9),
    "pad_dilated": (3, 2, 2, "pad", 2, 8),
}


@pytest.mark.parametrize("case", sorted(GEOMETRIES))
def test_conv1d_layer_matches_oracle(mode, path, rng, case):
    kernel, stride, dilation, pad_mode, padding, length = GEOMETRIES[case]
    c_in, c_out, batch = 3, 4, 2
    weight = rng.standard_normal((c_out, c_in, 1, kernel)).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32)
    kwargs = dict(stride=stride, pad_mode=pad_mode, padding=padding, dilation=dilation, has_bias=True,
                  weight_init=Tensor(weight[:, :, 0]), bias_init=Tensor(bias))
    layer = Conv1dThor(c_in, c_out, kernel, **kwargs)
    plain = nn.Conv1d(c_in, c_out, kernel, **kwargs)
    assert layer.kind == "conv1d" and isinstance(layer.spec, KroneckerCurvature)  # a conv's curvature form
    assert layer.weight.shape == (c_out, c_in, 1, kernel)
    assert (layer.a_dim, layer.g_dim) == (c_in * kernel, c_out)
    x = rng.standard_normal((batch, c_in, length)).astype(np.float32)
    args = dict(stride=stride, dilation=dilation, pad_mode=pad_mode, padding=padding)
    want = oracle.conv1d_forward(x, weight, bias, **args)
    np.testing.assert_array_equal(layer(Tensor(x)).asnumpy(), plain(Tensor(x)).asnumpy())
    _close(layer(Tensor(x)).asnumpy(), want, rtol=1e-5, what="output")

    r = rng.standard_normal(want.shape).astype(np.float32) / batch
    grads = _Gradients(layer)(Tensor(x), Tensor(r))
    patches = oracle.conv1d_patches(x, kernel, **args)
    _close(grads[0].asnumpy(), np.einsum("bot,btk->ok", r, patches).reshape(weight.shape), what="dW")
    a_want, g_want = oracle.conv1d_factors(x, r, kernel, **args)
    _close(layer.matrix_a_cov.asnumpy(), a_want, what="A")
    _close(layer.matrix_g_cov.asnumpy(), g_want, what="G")


def test_conv1d_blocked_factors_match_oracle(mode, path, rng):
    """A 15-wide A and a 6-wide G stored as the 4-wide diagonal blocks (last ones padded) of the oracle's."""
    plain = nn.Conv1d(5, 6, 3, stride=2, pad_mode="pad", padding=1, has_bias=False)
    layer = Conv1dThor.from_cell(plain, settings=TapSettings(block_size=4))
    assert layer.weight is plain.weight and layer.matrix_a_cov.shape == (4, 4, 4)
    assert layer.matrix_g_cov.shape == (2, 4, 4) and layer.matrix_a_cov.name == "matrix_a_cov"
    x = rng.standard_normal((3, 5, 12)).astype(np.float32)
    r = rng.standard_normal((3, 6, 6)).astype(np.float32) / 3
    _Gradients(layer)(Tensor(x), Tensor(r))
    a_want, g_want = oracle.conv1d_factors(x, r, 3, stride=2, pad_mode="pad", padding=1)
    _close(layer.matrix_a_cov.asnumpy(), stored_form(a_want, 4), what="A blocks")
    _close(layer.matrix_g_cov.asnumpy(), stored_form(g_want, 4), what="G blocks")


# ------------------------------------------------------------------------ a converted net vs the THOR oracle
class Conv1dNet(nn.Cell):
    def __init__(self, length=11):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, stride=2, pad_mode="pad", padding=1, dilation=2, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 5, 5)  # length 11 -> L_out 5

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


@pytest.mark.parametrize("block_size", [128, 4])
def test_converted_conv1d_net_matches_thor_oracle(mode, path, rng, block_size):
    """Six steps of frequency 3 (THOR steps 0 and 3): loss and every parameter after every step equal the
    oracle's (rtol 1e-3, as the THOR optimizer tests); block_size 4 cuts the conv's 9-wide A into blocks."""
    steps = 6
    net = Conv1dNet()
    init_params(net, rng)
    lr = np.linspace(0.1, 0.05, steps).astype(np.float32)
    damping = np.linspace(0.05, 0.02, steps).astype(np.float32)
    model = oracle.Conv1dRef(3, stride=2, dilation=2, pad_mode="pad", padding=1)
    ref = ThorReference(model, param_values(net), lr, damping, 0.9, batch_size=8, frequency=3,
                        block_size=block_size)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=3, block_size=block_size)
    assert [type(c) for c in opt.thor_cells] == [Conv1dThor, DenseThor]
    assert net.conv.matrix_a_cov.shape == ((9, 9) if block_size == 128 else (3, 4, 4))
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(loss, opt).set_train()
    for step in range(steps):
        x = rng.standard_normal((8, 3, 11)).astype(np.float32)
        y = rng.integers(0, 5, 8).astype(np.int32)
        got = float(cell(Tensor(x), Tensor(y)).asnumpy())
        ref.step(x, y)
        np.testing.assert_allclose(got, ref.losses[-1], rtol=1e-3, err_msg=f"loss at step {step}")
        params = param_values(net)
        for name, want in ref.params.items():
            np.testing.assert_allclose(params[name], want, rtol=1e-3, atol=1e-6,
                                       err_msg=f"{name} at step {step}")
    a_inv = opt.matrix_a_inv[0].asnumpy()  # refreshed: not the initial identity blocks
    assert not np.allclose(a_inv, np.broadcast_to(np.eye(a_inv.shape[-1]), a_inv.shape))


# ------------------------------------------------------------------------ conversion and the public class
class _Mixed(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.grouped = nn.Conv1d(4, 4, 3, group=2)
        self.frozen = nn.Conv1d(4, 4, 1)
        self.fc = nn.Dense(4 * 6, 3)

    def construct(self, x):
        h = self.frozen(self.grouped(self.conv(x)))
        return self.fc(ops.reshape(h, (h.shape[0], -1)))


def _mixed():
    net = _Mixed()
    net.frozen.weight.requires_grad = False
    return net


@pytest.mark.parametrize("convention", ["kfc", "gpu", "ascend"])
def test_conversion_converts_conv1d_under_kfc_only(convention):
    net = _mixed()
    conv1d = Conv1dThor if convention == "kfc" else None
    assert thor_class_for(net.conv, convention) is conv1d
    assert thor_class_for(net.grouped, convention) is None and thor_class_for(net.frozen, convention) is None
    assert thor_class_for(net.fc, convention) is DenseThor
    assert count_thor_cells(net, convention) == (2 if convention == "kfc" else 1)
    layers = convert_net(net, TapSettings(convention=convention, batch_size=4))
    assert layers == ([net.conv, net.fc] if convention == "kfc" else [net.fc])
    assert type(net.conv) is (Conv1dThor if convention == "kfc" else nn.Conv1d)
    assert type(net.grouped) is nn.Conv1d and type(net.frozen) is nn.Conv1d
    assert all(layer.factor_tap.convention == convention for layer in layers)


def test_thor_leaves_conv1d_first_order_under_gpu(rng):
    """thor(..., factor_convention="gpu"): the nn.Conv1d stays plain and is no THOR layer of the optimizer;
    under "kfc" (the default on CPU) it is converted and preconditioned; ConvertNetUtils (MindSpore's
    signature, the default settings) converts it."""
    lr, damping = Tensor(np.float32(0.1)), Tensor(np.float32(0.03))
    net = _mixed()
    opt = thor(net, lr, damping, 0.9, batch_size=4, factor_convention="gpu")
    assert type(net.conv) is nn.Conv1d and [type(c) for c in opt.thor_cells] == [DenseThor]
    net = _mixed()
    opt = thor(net, lr, damping, 0.9, batch_size=4)
    assert type(net.conv) is Conv1dThor and [type(c) for c in opt.thor_cells] == [Conv1dThor, DenseThor]
    net = ConvertNetUtils().convert_to_thor_net(_mixed())
    assert type(net.conv) is Conv1dThor and net.conv.matrix_a_cov.name == "conv.matrix_a_cov"
    assert [name for name, _ in ConvertNetUtils.thor_candidates(net)] == ["conv", "fc"]


def test_public_class_signature_and_from_cell():
    assert ms_optim.nn.Conv1dThor is Conv1dThor and ms_optim.Conv1dThor is Conv1dThor
    assert str(inspect.signature(Conv1dThor)) == str(inspect.signature(nn.Conv1d))
    plain = nn.Conv1d(2, 3, 4, stride=2, pad_mode="pad", padding=1, dilation=2, has_bias=True)
    layer = Conv1dThor.from_cell(plain)
    assert layer.weight is plain.weight and layer.bias is plain.bias
    geometry = (layer.kernel_size, layer.stride, layer.dilation, layer.padding)
    assert geometry == ((1, 4), (1, 2), (1, 2), (0, 0, 1, 1))
    assert "kernel_size=(1, 4)" in repr(layer)
    with pytest.raises(TypeError, match="cell"):
        Conv1dThor.from_cell(nn.Conv2d(2, 3, 4))
    with pytest.raises(TypeError, match="cell"):
        Conv1dThor.from_cell(nn.Conv1d(2, 4, 3, group=2))
    with pytest.raises(ValueError, match="group"):
        Conv1dThor(2, 4, 3, group=2)
    with pytest.raises(ValueError, match="kernel_size"):
        Conv1dThor(2, 4, 2**31)
    with pytest.raises(TypeError, match="in_channels"):
        Conv1dThor(2.0, 4, 3)
