"""ms_optim.nn.LARS against the float64 NumPy reference (tests/reference/lars_ref.py), step by step,
around MindSpore's Momentum and SGD and ms_optim's Lamb."""
import inspect

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from reference.lamb_ref import LambReference
from reference.lars_ref import LarsReference, MomentumReference, SGDReference, lars_gradient
from support.fused_paths import ATOL_W, RTOL
from support.fused_paths import expect_path as _expect_path
from support.params import make_params

from ms_optim.nn import ASGD, LARS, Lamb
from ms_optim.optim.lars import default_lars_filter

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)


def _check(params, expected, step):
    for p, w in zip(params, expected):
        np.testing.assert_allclose(p.asnumpy(), w, rtol=RTOL, atol=ATOL_W,
                                   err_msg=f"parameter {p.name} after step {step}")


def _steps_list_lr_decay(opt, ref, params, arrays, lrs, rng):
    """One step per entry of lrs on four parameters, weight decay 0.001 on all but the last (a BatchNorm
    beta/gamma, left out by the default filter); check every parameter after each step."""
    for step in range(len(lrs)):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        grads[0] *= 10.0  # ||w|| / ||g|| ~ 0.1: c / lr < 1, not clipped
        opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [lrs[step]] * 4, [0.001, 0.001, 0.001, 0.0])
        _check(params, ref.w, step + 1)


class _InverseTimeLR(LearningRateSchedule):
    """lr = base / (1 + step)."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def construct(self, global_step):
        return self.base / (ops.cast(global_step, ms.float32) + 1.0)


def test_signature_and_default_filter():
    sig = inspect.signature(LARS)
    assert [(n, p.default) for n, p in sig.parameters.items()] == [
        ("optimizer", inspect.Parameter.empty), ("epsilon", 1e-05), ("coefficient", 0.001),
        ("use_clip", False), ("lars_filter", default_lars_filter)]
    keep = [default_lars_filter(Parameter(Tensor(np.zeros(1, np.float32)), name=n))
            for n in ("fc.weight", "fc.bias", "encoder.LayerNorm.gamma", "conv.weight")]
    assert keep == [True, False, False, True]


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_reference_is_mindspore_momentum(mode, rng, nesterov):
    """The Momentum oracle the LARS tests build on follows nn.Momentum itself (incl. its Nesterov)."""
    params, arrays = make_params(rng, [("w", (4, 3), False)])
    opt = nn.Momentum(params, learning_rate=[0.5, 0.3, 0.2], momentum=0.9, use_nesterov=nesterov)
    ref = MomentumReference(arrays, 0.9, use_nesterov=nesterov)
    for step, lr in enumerate([0.5, 0.3, 0.2]):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [lr], [0.0])
        _check(params, ref.w, step + 1)


def test_momentum_groups_custom_filter_loss_scale(mode, path, rng):
    """Momentum with groups (own lr and weight decay; one group without decay), loss_scale 8,
    a custom filter (keeps the bias, rejects the gamma), a zero weight (ratio 1)."""
    spec = [("fc1.weight", (90, 50), False), ("fc1.bias", (6,), False), ("fc2.weight", (3, 6), True),
            ("ln.gamma", (6,), False)]
    params, arrays = make_params(rng, spec)
    groups = [{"params": params[:2], "lr": 0.1, "weight_decay": 0.01}, {"params": params[2:], "lr": 0.05}]
    inner = nn.Momentum(groups, learning_rate=0.2, momentum=0.9, weight_decay=0.0, loss_scale=8.0)
    opt = LARS(inner, epsilon=1e-6, coefficient=0.02, lars_filter=lambda p: "gamma" not in p.name)
    _expect_path(opt, path)
    ref = LarsReference(MomentumReference(arrays, 0.9), keep=[True, True, True, False], coefficient=0.02,
                        epsilon=1e-6)
    for step in range(3):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        opt(tuple(Tensor(g * 8.0) for g in grads))
        ref.step(grads, [0.1, 0.1, 0.05, 0.05], [0.01, 0.01, 0.0, 0.0])
        _check(params, ref.w, step + 1)
    assert int(inner.global_step.asnumpy()[0]) == 3


def test_sgd_use_clip_list_lr_default_filters(mode, rng):
    """SGD with momentum, a per-step lr list, weight decay with the default beta/gamma filter,
    use_clip (some ratios clipped to 1, some not), LARS's default filter (bias rejected)."""
    spec = [("w", (10, 4), False), ("small", (3, 3), False), ("bias", (4,), False), ("bn.beta", (4,), False)]
    params, arrays = make_params(rng, spec)
    arrays[1] *= 0.01
    params[1].set_data(Tensor(arrays[1]))
    lrs = [0.5, 0.3, 0.2]
    inner = nn.SGD(params, learning_rate=lrs, momentum=0.9, weight_decay=0.001)
    opt = LARS(inner, epsilon=1e-5, coefficient=1.0, use_clip=True)
    ref = LarsReference(SGDReference(arrays, momentum=0.9), keep=[True, True, False, True], coefficient=1.0,
                        epsilon=1e-5, use_clip=True)
    _steps_list_lr_decay(opt, ref, params, arrays, lrs, rng)


def test_momentum_nesterov_use_clip_list_lr(mode, path, rng):
    """Nesterov Momentum, a per-step lr list, use_clip (one ratio clipped to 1, one not), weight
    decay with the default beta/gamma filter, LARS's default filter (bias rejected)."""
    spec = [("w", (40, 30), False), ("v", (5, 5), False), ("bias", (5,), False), ("bn.gamma", (5,), False)]
    params, arrays = make_params(rng, spec)
    lrs = [0.5, 0.3, 0.2]
    inner = nn.Momentum(params, learning_rate=lrs, momentum=0.9, weight_decay=0.001, use_nesterov=True)
    opt = LARS(inner, epsilon=1e-5, coefficient=1.0, use_clip=True)
    _expect_path(opt, path)
    ref = LarsReference(MomentumReference(arrays, 0.9, use_nesterov=True), keep=[True, True, False, True],
                        coefficient=1.0, epsilon=1e-5, use_clip=True)
    _steps_list_lr_decay(opt, ref, params, arrays, lrs, rng)


def test_wraps_ms_optim_lamb_with_schedule(mode, path, rng):
    """LARS around ms_optim's Lamb (decay taken over by LARS), lr from a LearningRateSchedule."""
    spec = [("dense.weight", (7, 5), False), ("dense.bias", (7,), False)]
    params, arrays = make_params(rng, spec)
    inner = Lamb(params, learning_rate=_InverseTimeLR(0.05), weight_decay=0.01)
    opt = LARS(inner, epsilon=1e-5, coefficient=0.01)
    _expect_path(inner, path)
    ref = LarsReference(LambReference(arrays), keep=[True, False], coefficient=0.01, epsilon=1e-5)
    for step in range(3):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [0.05 / (1 + step)] * 2, [0.01, 0.01])
        _check(params, ref.w, step + 1)
        np.testing.assert_allclose(inner.moments1[0].asnumpy(), ref.inner.m[0], rtol=RTOL, atol=1e-7)


_OTHER_INNERS = {
    "Adam": lambda ps, wd: nn.Adam(ps, 0.01, weight_decay=wd),
    "AdamWeightDecay": lambda ps, wd: nn.AdamWeightDecay(ps, 0.01, weight_decay=wd),
    "RMSProp": lambda ps, wd: nn.RMSProp(ps, 0.01, weight_decay=wd),
    "ASGD": lambda ps, wd: ASGD(ps, 0.01, weight_decay=wd),
}


@pytest.mark.parametrize("inner_name", sorted(_OTHER_INNERS))
def test_wraps_any_optimizer(mode, rng, inner_name):
    """LARS(X with weight decay) == X without weight decay fed the reference LARS gradient
    c*(g + wd*w) (and the raw gradient for the rejected bias), for other MindSpore/ms_optim X."""
    make = _OTHER_INNERS[inner_name]
    spec = [("fc.weight", (6, 5), False), ("fc.bias", (6,), False)]
    params_a, arrays = make_params(rng, spec)
    params_b = [Parameter(Tensor(a.copy()), name=p.name) for p, a in zip(params_a, arrays)]
    opt = LARS(make(params_a, 0.1), epsilon=1e-5, coefficient=0.01)
    plain = make(params_b, 0.0)
    for step in range(2):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        lars_grad = lars_gradient(params_b[0].asnumpy(), grads[0], 0.01, 0.1, 0.01, 1e-5, False)
        opt(tuple(Tensor(g) for g in grads))
        plain((Tensor(lars_grad.astype(np.float32)), Tensor(grads[1])))
        _check(params_a, [p.asnumpy() for p in params_b], step + 1)


def test_filter_rejecting_all_is_the_inner_optimizer(mode, path, rng):
    """Degenerate case: nothing passes the filter -> exactly the wrapped optimizer alone."""
    spec = [("a.weight", (6, 4), False), ("a.bias", (6,), False)]
    params_a, arrays = make_params(rng, spec)
    params_b = [Parameter(Tensor(a.copy()), name=p.name) for p, a in zip(params_a, arrays)]
    alone = nn.Momentum(params_a, learning_rate=0.1, momentum=0.9, use_nesterov=True)
    wrapped = LARS(nn.Momentum(params_b, learning_rate=0.1, momentum=0.9, use_nesterov=True),
                   lars_filter=lambda p: False)
    _expect_path(wrapped, path)
    for step in range(3):
        grads = tuple(Tensor(rng.standard_normal(a.shape).astype(np.float32)) for a in arrays)
        alone(grads)
        wrapped(grads)
        for pa, pb in zip(params_a, params_b):
            np.testing.assert_array_equal(pb.asnumpy(), pa.asnumpy(), err_msg=f"{pa.name} step {step + 1}")


def test_wrapped_optimizer_is_not_modified(mode, path, rng):
    """The user's optimizer keeps its weight decay: used alone between LARS steps it still decays,
    LARS and it share one state, and LARS exposes its parameters, learning rate and step."""
    spec = [("fc.weight", (5, 4), False), ("fc.bias", (5,), False)]
    params, arrays = make_params(rng, spec)
    inner = nn.Momentum(params, learning_rate=0.1, momentum=0.9, weight_decay=0.05)
    before = (inner.decay_flags, inner.exec_weight_decay, inner.dynamic_weight_decay, inner.need_scale,
              float(inner.weight_decay.asnumpy()))
    opt = LARS(inner, epsilon=1e-5, coefficient=0.01)
    _expect_path(opt, path)
    assert opt.optimizer is inner
    assert tuple(opt.parameters) == tuple(inner.parameters)
    assert opt.learning_rate is inner.learning_rate and opt.global_step is inner.global_step
    names = {p.name for p in opt.get_parameters()}
    assert {"moments.fc.weight", "moments.fc.bias", "learning_rate", "global_step"} <= names
    assert not any("placeholder" in n for n in names)
    momentum = MomentumReference(arrays, 0.9)
    lars = LarsReference(momentum, keep=[True, False], coefficient=0.01, epsilon=1e-5)
    for step, runner in enumerate(["alone", "lars", "alone", "lars"]):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        if runner == "alone":
            inner(tuple(Tensor(g) for g in grads))
            momentum.step(grads, [0.1, 0.1], [0.05, 0.05])
        else:
            opt(tuple(Tensor(g) for g in grads))
            lars.step(grads, [0.1, 0.1], [0.05, 0.05])
        _check(params, momentum.w, f"{step + 1} ({runner})")
        after = (inner.decay_flags, inner.exec_weight_decay, inner.dynamic_weight_decay, inner.need_scale,
                 float(inner.weight_decay.asnumpy()))
        assert after == before
    assert int(inner.global_step.asnumpy()[0]) == 4


@pytest.mark.parametrize("args, kwargs, exc, word", [
    (("sgd",), {}, TypeError, "optimizer"),
    ((None,), {}, TypeError, "optimizer"),
    ((), {"epsilon": 1}, TypeError, "epsilon"),
    ((), {"coefficient": 1}, TypeError, "coefficient"),
    ((), {"use_clip": 1}, TypeError, "use_clip"),
    ((), {"lars_filter": 3}, TypeError, "lars_filter"),
])
def test_invalid_arguments(args, kwargs, exc, word):
    if not args:
        args = (nn.Momentum(nn.Dense(2, 2).trainable_params(), 0.1, 0.9),)
    with pytest.raises(exc) as info:
        LARS(*args, **kwargs)
    assert word in str(info.value) and "LARS" in str(info.value)
