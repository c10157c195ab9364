"""ms_optim.nn.Lamb against the float64 NumPy reference (tests/reference/lamb_ref.py), step by step."""
import inspect
import shutil

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from reference.lamb_ref import LambReference, centralize
from support.fused_paths import ATOL_W, RTOL
from support.fused_paths import expect_path as _expect_path
from support.params import make_params

from ms_optim.nn import Lamb
from ms_optim.optim import _fused
from ms_optim.optim._trust_ratio import l2_norm, trust_ratio

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)


def test_fused_kernels_build_where_gxx_exists():
    if shutil.which("g++") is not None:
        assert _fused.library_path() is not None, _fused._failed


def _check(opt, params, ref, step):
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=RTOL, atol=ATOL_W,
                                   err_msg=f"parameter {p.name} after step {step}")
        np.testing.assert_allclose(opt.moments1[i].asnumpy(), ref.m[i], rtol=RTOL, atol=1e-7,
                                   err_msg=f"lamb_m of {p.name} after step {step}")
        np.testing.assert_allclose(opt.moments2[i].asnumpy(), ref.v[i], rtol=RTOL, atol=1e-9,
                                   err_msg=f"lamb_v of {p.name} after step {step}")


@ms.jit
def _ratios(w, u, g, wd, eps, coefficient):
    lamb_ratio = trust_ratio(l2_norm(w), l2_norm(u))
    w_norm, g_norm = l2_norm(w), l2_norm(g)
    lars_ratio = trust_ratio(w_norm, g_norm, g_norm + wd * w_norm + eps, coefficient)
    return lamb_ratio, lars_ratio


@pytest.mark.parametrize("w, u, g, lamb_expected, lars_expected", [
    ([3.0, 4.0], [0.0, 2.0], [1.0, 0.0], 2.5, 0.5 * 5 / (1 + 0.1 * 5 + 0.5)),
    ([0.0, 0.0], [1.0, 2.0], [1.0, 0.0], 1.0, 1.0),  # zero weight
    ([3.0, 4.0], [0.0, 0.0], [0.0, 0.0], 1.0, 1.0),  # zero update / zero gradient
])
def test_shared_trust_ratio(mode, w, u, g, lamb_expected, lars_expected):
    """The one trust-ratio function used by Lamb and LARS, with its zero rules."""
    f32 = lambda x: Tensor(np.array(x, np.float32))  # noqa: E731
    lamb_ratio, lars_ratio = _ratios(f32(w), f32(u), f32(g), f32(0.1), f32(0.5), f32(0.5))
    assert np.isclose(float(lamb_ratio.asnumpy()), lamb_expected, rtol=1e-6)
    assert np.isclose(float(lars_ratio.asnumpy()), lars_expected, rtol=1e-6)


def test_signature_and_state_names():
    sig = inspect.signature(Lamb)
    assert [(n, p.default) for n, p in sig.parameters.items()] == [
        ("params", inspect.Parameter.empty), ("learning_rate", inspect.Parameter.empty),
        ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-6), ("weight_decay", 0.0)]
    net = nn.Dense(3, 2)
    opt = Lamb(net.trainable_params(), 0.1)
    assert isinstance(opt, nn.Optimizer)
    names = {p.name for p in opt.get_parameters()}
    assert {"lamb_m.weight", "lamb_m.bias", "lamb_v.weight", "lamb_v.bias", "global_step"} <= names


def test_groups_dynamic_list_lr_decay_and_centralization(mode, path, rng):
    """Groups with their own lr (fixed / per-step list), weight decay, gradient centralization,
    order_params, a zero-initialised parameter (ratio 1), and a 'gamma' that decays because grouped."""
    spec = [("conv.weight", (4, 16, 3, 3), False), ("dense.weight", (70, 61), False),
            ("dense.bias", (5,), True), ("norm.gamma", (6,), False)]
    params, arrays = make_params(rng, spec)
    conv_w, dense_w, bias, gamma = params
    list_lr = [0.1, 0.08, 0.06, 0.04]
    groups = [{"params": [conv_w, dense_w], "lr": 0.05, "weight_decay": 0.01, "grad_centralization": True},
              {"params": [bias, gamma], "lr": list_lr},
              {"order_params": [dense_w, bias, conv_w, gamma]}]
    opt = Lamb(groups, learning_rate=0.1, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.02)
    _expect_path(opt, path)
    order = [p.name for p in opt.parameters]
    assert order == ["dense.weight", "dense.bias", "conv.weight", "norm.gamma"]
    by_name = {n: a for (n, _, _), a in zip(spec, arrays)}
    ref = LambReference([by_name[n] for n in order])
    wds = {"dense.weight": 0.01, "conv.weight": 0.01, "dense.bias": 0.02, "norm.gamma": 0.02}
    for step in range(4):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in opt.parameters]
        opt(tuple(Tensor(g) for g in grads))
        lrs = [0.05 if n in ("dense.weight", "conv.weight") else list_lr[step] for n in order]
        ref_grads = [centralize(g.astype(np.float64)) if n == "conv.weight" else g for n, g in zip(order, grads)]
        ref.step(ref_grads, lrs, [wds[n] for n in order])
        _check(opt, list(opt.parameters), ref, step + 1)
    assert int(opt.global_step.asnumpy()[0]) == 4


class _StepWeightDecay(nn.Cell):
    """Dynamic weight decay: 0.02 + 0.01 * step."""

    def construct(self, global_step):
        return ops.cast(global_step, ms.float32) * 0.01 + 0.02


def test_schedule_lr_cell_weight_decay_default_filter_zero_norms(mode, path, rng):
    """Ungrouped: LearningRateSchedule, weight decay Cell, no decay on beta/gamma names, a zero
    gradient without decay (||r|| = 0 -> ratio 1, no change) and a zero weight (ratio 1)."""
    spec = [("w", (8, 3), False), ("ln.gamma", (3,), False), ("ln.beta", (3,), False), ("zero_w", (4,), True)]
    params, arrays = make_params(rng, spec)
    schedule = nn.ExponentialDecayLR(0.1, 0.9, 1)
    opt = Lamb(params, learning_rate=schedule, beta1=0.8, beta2=0.99, eps=1e-4, weight_decay=_StepWeightDecay())
    _expect_path(opt, path)
    ref = LambReference(arrays, beta1=0.8, beta2=0.99, eps=1e-4)
    for step in range(3):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        grads[1] = np.zeros_like(grads[1])  # gamma: no gradient and no decay
        opt(tuple(Tensor(g) for g in grads))
        wd = 0.02 + 0.01 * step
        ref.step(grads, [0.1 * 0.9 ** step] * 4, [wd, 0.0, 0.0, wd])
        _check(opt, params, ref, step + 1)
    np.testing.assert_array_equal(params[1].asnumpy(), arrays[1])  # the gamma never moved


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"beta1": 1}, TypeError, ["beta1", "float"]),
    ({"beta2": 0.999, "beta1": 1.0}, ValueError, ["beta1", "(0.0, 1.0)"]),
    ({"beta2": 0.0}, ValueError, ["beta2"]),
    ({"eps": 0.0}, ValueError, ["eps", "> 0"]),
    ({"eps": 1}, TypeError, ["eps"]),
    ({"weight_decay": -0.1}, ValueError, ["weight_decay", "-0.1"]),
    ({"weight_decay": "0.1"}, TypeError, ["weight_decay"]),
    ({"learning_rate": -1.0}, ValueError, ["learning_rate"]),
])
def test_invalid_arguments(kwargs, exc, words):
    args = {"params": nn.Dense(2, 2).trainable_params(), "learning_rate": 0.1, **kwargs}
    with pytest.raises(exc) as info:
        Lamb(**args)
    for word in words + ["Lamb"]:
        assert word in str(info.value)


def _spike_run(loss_scaled, path_name):
    """Two normal steps, one batch whose gradient is finite but above 1e19, three normal steps."""
    from ms_optim.loss_scale import TrainOneStepWithLossScaleCell

    ms.set_seed(5)
    net = nn.Dense(4, 2)
    opt = Lamb(net.trainable_params(), learning_rate=0.01)
    _expect_path(opt, path_name)
    with_loss = nn.WithLossCell(net, nn.MSELoss())
    if loss_scaled:
        manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0 ** 24, scale_factor=2, scale_window=1000)
        cell = TrainOneStepWithLossScaleCell(with_loss, opt, scale_sense=manager.get_update_cell())
    else:
        cell = nn.TrainOneStepCell(with_loss, opt)
    cell.set_train()
    data = np.random.default_rng(3)
    x = data.standard_normal((8, 4)).astype(np.float32)
    y = data.standard_normal((8, 2)).astype(np.float32)
    spike = x.copy()
    spike[0, 0] = 1e17  # weight gradient ~1e33: finite, its square is not
    outputs = []
    for batch in (x, x, spike, x, x, x):
        out = cell(Tensor(batch), Tensor(y))
        # read now: the loss-scale cell returns its scale Parameter itself
        outputs.append([float(t.asnumpy().reshape(-1)[0]) for t in out] if loss_scaled else out)
    return net, opt, outputs


def test_huge_finite_gradient_makes_v_inf_unless_a_loss_scale_cell_skips_it(mode, path):
    """Documented in Lamb's docstring: one finite gradient above ~1e19 overflows g*g, so lamb_v is inf for
    good (as in MindSpore); ms_optim's TrainOneStepWithLossScaleCell with a dynamic manager keeps the run
    finite: the scaled gradient overflows, the step is skipped and the scale lowered."""
    _, opt, _ = _spike_run(False, path)
    assert not np.isfinite(opt.moments2[0].asnumpy()).all()  # still inf three steps later

    net, opt, outputs = _spike_run(True, path)
    overflow = [bool(o[1]) for o in outputs]
    scales = [o[2] for o in outputs]
    assert overflow == [False, False, True, False, False, False], overflow
    assert scales[2] == scales[1] / 2
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 5  # the spike step was skipped
    for tensor in (*net.trainable_params(), *opt.moments1, *opt.moments2):
        assert np.isfinite(tensor.asnumpy()).all(), tensor.name
