"""``thor(..., factor_convention=...)`` vs the float64 oracle written from MindSpore's THOR source
(tests/reference/thor_conventions.py), in PYNATIVE and GRAPH mode, the optimizer inside TrainOneStepCell.

For each of "gpu", "ascend" and "kfc", step by step: on every THOR step the factors the layers stored
(A, G) and the damped inverses the optimizer stored, and after every step the loss and every
parameter. Nets: a conv (3x2 kernel, stride 2) with pad_mode "pad" (padding 1) and with "same",
followed by a Dense; an Embedding + Dense + LayerNorm model with ``batch_size`` (10) different from
the real batch (8), so the conventions' use of ``batch_size`` is checked. Frequencies 2 and 3 (thor()
refuses 1, as MindSpore does). Also: "auto" resolves by device target (the resolver, with the target
given or mocked; the real device is not changed), "auto" on CPU is "kfc" and reproduces it exactly,
and bad values are refused naming the argument before the net is touched.
"""
import mindspore.common.dtype as mstype
import numpy as np
import pytest
from mindspore import Tensor, nn
from reference import thor_conventions as oracle
from reference.thor_ref import ConvRef, EmbedRef, MLPRef, ThorReference
from support.nets import MLP, ConvNet, EmbedNet, labelled_batches
from support.params import param_values
from support.snapshot import assert_unchanged, snapshot
from support.thor_runs import init_params, net_batches, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.net import conventions
from ms_optim._thor.net.layers import ThorLayer

RTOL = 1e-3
ATOL = 1e-6


def _close(actual, expected, what):
    """rtol RTOL, atol RTOL * max|expected| (float32 sums are accurate relative to the largest entry)."""
    expected = np.asarray(expected, np.float64)
    atol = RTOL * max(float(np.abs(expected).max()), 1e-12)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=RTOL, atol=atol, err_msg=what)


def _stored_inverse(slot_param, kind_is_vector):
    value = slot_param.asnumpy().astype(np.float64)
    if kind_is_vector:
        return value
    assert value.shape[0] == 1, "the test layers fit one inverse block"
    return value[0]


CASES = {
    "conv_pad_f2": dict(net=lambda: ConvNet("pad"), ref=lambda: ConvRef((3, 2), 2, 1, 1, "pad"), frequency=2,
                        batch_size=8, data="conv", layernorm=()),
    "conv_same_f3": dict(net=lambda: ConvNet("same"), ref=lambda: ConvRef((3, 2), 2, 1, 0, "same"), frequency=3,
                         batch_size=8, data="conv", layernorm=()),
    "embed_dense_layernorm_f2_bs10": dict(net=EmbedNet, ref=lambda: EmbedRef(1e-7), frequency=2, batch_size=10,
                                          data="ids", layernorm=("ln",)),
    # with a loss scale and weight decay: Ascend's max-abs scale on conv AND Dense (a conv net), and
    # GPU's embedding product L^-1 L^-1, through scaled gradients and decayed weights
    "conv_pad_f2_scale_wd": dict(net=lambda: ConvNet("pad"), ref=lambda: ConvRef((3, 2), 2, 1, 1, "pad"), frequency=2,
                                 batch_size=8, data="conv", layernorm=(), loss_scale=64.0, weight_decay=1e-3),
    "embed_f3_bs10_scale_wd": dict(net=EmbedNet, ref=lambda: EmbedRef(1e-7), frequency=3, batch_size=10,
                                   data="ids", layernorm=("ln",), loss_scale=64.0, weight_decay=1e-3),
    # a Dense layer with 2 outputs, no conv: Ascend's Ginv = I for it (not for the hidden layer)
    "mlp_2_outputs_f2": dict(net=lambda: MLP(6, 5, 2), ref=MLPRef, frequency=2, batch_size=8, data="vectors",
                             layernorm=()),
}


@pytest.mark.parametrize("convention", oracle.CONVENTIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_convention_matches_mindspore_oracle(mode, rng, case, convention):
    spec = CASES[case]
    steps = 5
    net = spec["net"]()
    init_params(net, rng)
    # THOR moves these small nets' weights by O(1) in a few steps at lr 0.1; at half that the float32
    # rounding of the run stays well inside the tolerances below for every convention
    lr = np.linspace(0.05, 0.025, steps).astype(np.float32)
    damping = np.linspace(0.05, 0.02, steps).astype(np.float32)
    bs, freq = spec["batch_size"], spec["frequency"]
    scale, wd = spec.get("loss_scale", 1.0), spec.get("weight_decay", 0.0)
    model = spec["ref"]()
    has_conv = any(kind == "conv" for _, kind in model.layers)
    ref = ThorReference(model, param_values(net), lr, damping, 0.9, weight_decay=wd, batch_size=bs,
                        frequency=freq, layernorm=spec["layernorm"],
                        inverses=oracle.reference_inverses(convention, bs, has_conv))
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, weight_decay=wd, loss_scale=scale, batch_size=bs,
               frequency=freq, factor_convention=convention)
    assert opt.factor_convention == convention
    assert [c.kind for c in opt.thor_cells] == [kind for _, kind in ref.model.layers]
    cell = train_cell(net, opt, sens=None if scale == 1.0 else scale)
    for step, (x, y) in enumerate(net_batches(rng, spec["data"], steps)):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL, err_msg=f"loss at step {step}")
        if step % freq == 0:  # a THOR step: this step's factors and inverses
            effective = oracle.all_effective(convention, ref.model.raw, bs)
            for i, (name, kind) in enumerate(ref.model.layers):
                layer = opt.thor_cells[i]
                want_a, want_g = effective[name]
                _close(layer.matrix_a_cov.asnumpy(), want_a, f"{convention} A of {name} at step {step}")
                _close(layer.matrix_g_cov.asnumpy() / scale ** 2, want_g,  # the layer's G carries the loss scale
                       f"{convention} G of {name} at step {step}")
                _close(_stored_inverse(opt.slots[i].a_inv, kind == "embedding"), ref.a_inv[name],
                       f"{convention} A^-1 of {name} at step {step}")
                _close(_stored_inverse(opt.slots[i].g_inv, False), ref.g_inv[name],
                       f"{convention} G^-1 of {name} at step {step}")
        got = param_values(net)
        for pname, want in ref.params.items():
            np.testing.assert_allclose(got[pname], want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{convention}: {pname} after step {step}")


def test_conventions_differ_where_documented(rng):
    """The oracle's conventions really differ on these nets (else the comparison above proves little):
    conv A and G differ in all three; Dense G agrees when batch_size is the real batch."""
    x = rng.standard_normal((8, 3, 9, 9))
    dout = rng.standard_normal((8, 4, 5, 5))
    raw = ("conv", x, dout, dict(kernel_size=(3, 2), stride=2, dilation=1, pad_mode="pad", padding=1))
    eff = {c: oracle.effective_factors(c, raw, 8) for c in oracle.CONVENTIONS}
    for one, other in (("gpu", "ascend"), ("gpu", "kfc"), ("ascend", "kfc")):
        for k in range(2):
            assert not np.allclose(eff[one][k], eff[other][k], rtol=1e-2), (one, other, k)
    dense = ("dense", rng.standard_normal((8, 6)), rng.standard_normal((8, 3)))
    g = [oracle.effective_factors(c, dense, 8)[1] for c in oracle.CONVENTIONS]
    np.testing.assert_allclose(g[0], g[2], rtol=1e-12)
    np.testing.assert_allclose(g[1], g[2], rtol=1e-12)


@pytest.mark.parametrize("convention", ["gpu", "ascend"])
def test_conv_factors_float32_under_amp_o2(mode, rng, convention):
    """Under amp O2 the conv runs in float16, but the convention's A (gpu: from the batch mean) is
    computed and stored in float32 from the float16 input."""
    from mindspore import amp

    net = ConvNet("same")
    init_params(net, rng)
    thor(net, Tensor(np.float32(0.0)), Tensor(np.float32(0.03)), 0.9, batch_size=8, factor_convention=convention)
    cell = train_cell(amp.auto_mixed_precision(net, "O2"), nn.SGD(net.trainable_params(), 0.0))
    x = (rng.standard_normal((8, 3, 9, 9)) + 0.3).astype(np.float32)
    assert np.isfinite(cell(Tensor(x), Tensor(rng.integers(0, 5, 8).astype(np.int32))).asnumpy())
    assert net.conv.matrix_a_cov.dtype == mstype.float32
    x16 = x.astype(np.float16).astype(np.float64)
    args = dict(kernel_size=(3, 2), stride=2, dilation=1, pad_mode="same", padding=0)
    want_a, _ = oracle.effective_factors(convention, ("conv", x16, np.zeros((8, 4, 5, 5)), args), 8)
    expected = np.asarray(want_a)
    np.testing.assert_allclose(net.conv.matrix_a_cov.asnumpy(), expected, rtol=1e-4,
                               atol=1e-4 * float(np.abs(expected).max()), err_msg=f"{convention} A under amp O2")


# ----------------------------------------------------------------------------------- ModelThor
@pytest.mark.parametrize("convention", ["gpu", "ascend"])
def test_model_thor_sink_loop_uses_the_convention(mode, convention):
    """ConvertModelUtils/ModelThor (sink mode, sink_size 3, frequency 4) train with the convention thor()
    set: the same parameters as a TrainOneStepCell loop over the same 12 batches, and fc1's stored A is
    the oracle's for the last THOR step's batch (gpu: a^T a / in)."""
    from mindspore.train import Model

    from ms_optim._thor.model import ConvertModelUtils, ModelThor

    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 6)).astype(np.float32)
    y = rng.integers(0, 3, 20).astype(np.int32)

    def build():
        net = MLP(6, 5, 3)
        init_params(net, np.random.default_rng(9))
        opt = thor(net, Tensor(np.full(16, 0.05, np.float32)), Tensor(np.full(16, 0.03, np.float32)), 0.9,
                   batch_size=4, frequency=4, factor_convention=convention)
        return net, opt

    ref_net, ref_opt = build()
    cell = train_cell(ref_net, ref_opt)
    for s in range(12):
        b = s % 5
        cell(Tensor(x[4 * b:4 * b + 4]), Tensor(y[4 * b:4 * b + 4]))
    net, opt = build()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ConvertModelUtils.convert_to_thor_model(Model(net, loss, opt), net, loss_fn=loss, optimizer=opt)
    assert isinstance(model, ModelThor)
    model.train(4, labelled_batches(x, y, 4), dataset_sink_mode=True, sink_size=3)
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 12 and opt.factor_convention == convention
    last = x[4 * (8 % 5):4 * (8 % 5) + 4]                               # step 8 is the last THOR step
    want_a, _ = oracle.effective_factors(convention, ("dense", last, np.zeros((4, 5))), 4)
    _close(net.fc1.matrix_a_cov.asnumpy(), want_a, f"{convention} A of fc1")
    for name, value in param_values(ref_net).items():
        np.testing.assert_allclose(param_values(net)[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


# ----------------------------------------------------------------------------------- "auto"
@pytest.mark.parametrize("target,want", [("GPU", "gpu"), ("Ascend", "ascend"), ("CPU", "kfc")])
def test_auto_resolves_by_device_target(monkeypatch, target, want):
    assert conventions.resolve_factor_convention("auto", device_target=target) == want
    monkeypatch.setattr(conventions, "_device_target", lambda: target)  # the real context is not touched
    assert conventions.resolve_factor_convention("auto") == want
    for explicit in ("gpu", "ascend", "kfc"):
        assert conventions.resolve_factor_convention(explicit) == explicit


def test_auto_on_cpu_is_kfc(mode, rng):
    """thor()'s default ("auto") on CPU is "kfc": the same resolved value and exactly the same run."""
    steps = 3
    batches = [(rng.standard_normal((16, 20)).astype(np.float32), rng.integers(0, 10, 16).astype(np.int32))
               for _ in range(steps)]
    results = []
    for kwargs in ({}, dict(factor_convention="auto"), dict(factor_convention="kfc")):
        net = MLP()
        init_params(net, np.random.default_rng(3))
        opt = thor(net, Tensor(np.float32(0.05)), Tensor(np.float32(0.03)), 0.9, batch_size=16, frequency=2,
                   **kwargs)
        assert opt.factor_convention == "kfc"
        assert all(layer.factor_tap.convention == "kfc" for layer in opt.thor_cells)
        cell = train_cell(net, opt)
        for x, y in batches:
            cell(Tensor(x), Tensor(y))
        results.append(param_values(net))
    for other in results[1:]:
        for name, value in results[0].items():
            np.testing.assert_array_equal(other[name], value, err_msg=name)


# ----------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("bad,exc", [("GPU", ValueError), ("cpu", ValueError), ("", ValueError),
                                     ("Kfc", ValueError), (None, TypeError), (1, TypeError), (b"gpu", TypeError),
                                     (("gpu",), TypeError)])
def test_bad_factor_convention_refused_before_conversion(bad, exc):
    net = MLP(4, 3, 2)
    before = snapshot(net)
    with pytest.raises(exc) as info:
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, factor_convention=bad)
    message = str(info.value)
    assert "'thor'" in message and "'factor_convention'" in message and repr(bad) in message, message
    assert not any(isinstance(cell, ThorLayer) for _, cell in net.cells_and_names())
    assert type(net.fc1) is nn.Dense
    assert_unchanged(before, snapshot(net))
