"""ms_optim.nn.ASGD against the float64 NumPy reference (tests/reference/asgd_ref.py) every step,
and against mindspore.nn.ASGD (which runs on CPU) on the same inputs, in both execution modes.

The generic behaviour every optimizer shares (argument table, signatures, train cells, loss scaling,
Model.train, checkpoints) is in test_optim_generic.py.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from reference.asgd_ref import ASGDReference
from support.params import make_params

from ms_optim.nn import ASGD

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)

RTOL = 1e-4
# float32 keeps ~1e-7 absolute rounding on elements the update carries near 0 from |w| ~ 1;
# a wrong update moves w by ~lr*|g| >> 1e-6.
ATOL = 1e-6


def _check(opt, ref, step):
    for i, p in enumerate(opt.parameters):
        where = f"{p.name} after step {step}"
        np.testing.assert_allclose(p.asnumpy(), ref.w[i], rtol=RTOL, atol=ATOL, err_msg="w of " + where)
        np.testing.assert_allclose(opt.ax[i].asnumpy(), ref.ax[i], rtol=RTOL, atol=ATOL, err_msg="ax of " + where)
        np.testing.assert_allclose(opt.eta[i].asnumpy(), ref.eta[i], rtol=RTOL, atol=0, err_msg="eta of " + where)
        np.testing.assert_allclose(opt.mu[i].asnumpy(), ref.mu[i], rtol=RTOL, atol=0, err_msg="mu of " + where)


class _StepWeightDecay(nn.Cell):
    """Dynamic weight decay: 0.01 + 0.005 * step (step = global_step before the update)."""

    def construct(self, global_step):
        return ops.cast(ops.reshape(global_step, ()), ms.float32) * 0.005 + 0.01


class _HalvingLR(LearningRateSchedule):
    """lr = 0.4 / 2**step."""

    def construct(self, global_step):
        return 0.4 / ops.pow(2.0, ops.cast(global_step, ms.float32))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composite"])
def test_reference_list_lr_decay_filter_and_averaging(mode, rng, fused, monkeypatch):
    """Ungrouped: per-step lr list, weight decay skipping 'gamma'/'beta', t0 = 2 so that averaging
    (mu < 1) starts at step 4 and the ax update takes both branches. Both the fused in-place update
    (CPU default) and the composite ops (other devices, MS_OPTIM_FUSED=0)."""
    monkeypatch.setenv("MS_OPTIM_FUSED", "1" if fused else "0")
    spec = [("dense.weight", (5, 6)), ("dense.bias", (5,)), ("norm.gamma", (6,)), ("norm.beta", (6,))]
    params, arrays = make_params(rng, spec)
    lrs = [0.3, 0.2, 0.15, 0.1, 0.08, 0.05]
    opt = ASGD(params, learning_rate=lrs, lambd=0.05, alpha=0.6, t0=2.0, weight_decay=0.02)
    assert opt.use_fused == fused
    ref = ASGDReference(arrays, lambd=0.05, alpha=0.6, t0=2.0)
    wds = [0.02, 0.02, 0.0, 0.0]
    for step in range(len(lrs)):
        grads = [rng.standard_normal(shape).astype(np.float32) for _, shape in spec]
        assert opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [lrs[step]] * 4, wds)
        _check(opt, ref, step + 1)
    assert ref.mu[0] < 0.5  # the averaging branch ran
    assert int(opt.global_step.asnumpy()[0]) == len(lrs)


def test_reference_groups_order_schedule_dynamic_decay_centralization(mode, rng):
    """Groups with their own fixed lr, a LearningRateSchedule, a dynamic weight-decay Cell,
    gradient centralization on a (4, 16, ...) weight, and order_params."""
    spec = [("conv.weight", (4, 16, 2, 2)), ("dense.weight", (3, 4)), ("dense.bias", (3,)), ("bn.gamma", (4,))]
    params, arrays = make_params(rng, spec)
    conv_w, dense_w, bias, gamma = params
    groups = [{"params": [conv_w, dense_w], "lr": 0.05, "weight_decay": 0.03, "grad_centralization": True},
              {"params": [bias, gamma], "lr": _HalvingLR()},
              {"order_params": [dense_w, bias, conv_w, gamma]}]
    opt = ASGD(groups, learning_rate=0.1, lambd=0.1, alpha=0.75, t0=1.0, weight_decay=_StepWeightDecay())
    order = [p.name for p in opt.parameters]
    assert order == ["dense.weight", "dense.bias", "conv.weight", "bn.gamma"]
    by_name = {n: a for (n, _), a in zip(spec, arrays)}
    ref = ASGDReference([by_name[n] for n in order], lambd=0.1, alpha=0.75, t0=1.0,
                        centralize_flags=[n in ("dense.weight", "conv.weight") for n in order])
    for step in range(5):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in opt.parameters]
        opt(tuple(Tensor(g) for g in grads))
        lrs = [0.05 if n.endswith("weight") else 0.4 / 2 ** step for n in order]
        # grouped: 'gamma' decays too; the group without its own weight decay uses the dynamic Cell
        wds = [0.03 if n.endswith("weight") else 0.01 + 0.005 * step for n in order]
        ref.step(grads, lrs, wds)
        _check(opt, ref, step + 1)


def test_reference_fused_form_edge_cases(mode, rng):
    """lambd*eta == 1 (1 - lambd*eta is exactly 0 in float32) and lambd*eta > 1 (negative factor):
    the fused in-place form must still give w*(1 - lambd*eta) - eta*g; lambd = 0 is plain SGD."""
    for lambd, lr in ((1.0, 1.0), (2.0, 1.0), (0.0, 0.25)):
        params, arrays = make_params(rng, [("w", (7,)), ("v", (2, 3))])
        opt = ASGD(params, learning_rate=lr, lambd=lambd, alpha=0.5)
        assert opt.use_fused  # CPU, float32
        ref = ASGDReference(arrays, lambd=lambd, alpha=0.5)
        for step in range(2):
            grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
            opt(tuple(Tensor(g) for g in grads))
            ref.step(grads, [float(lr)] * 2, [0.0, 0.0])
            _check(opt, ref, step + 1)


def _pair(rng, spec, groups_fn, dtype=np.float32, **kwargs):
    """The same parameters (values and names) for ms_optim's ASGD and for MindSpore's."""
    arrays = [rng.standard_normal(shape).astype(dtype) for _, shape in spec]
    out = []
    for cls in (ASGD, nn.ASGD):
        params = [Parameter(Tensor(a.copy()), name=n) for (n, _), a in zip(spec, arrays)]
        out.append((params, cls(groups_fn(params), **kwargs)))
    return out


def _assert_same_state(ours, theirs, step, rtol, atol):
    ours_state = {p.name: p.asnumpy() for p in ours.get_parameters()}
    theirs_state = {p.name: p.asnumpy() for p in theirs.get_parameters()}
    assert set(ours_state) == set(theirs_state)
    for name, value in theirs_state.items():
        assert ours_state[name].shape == value.shape and ours_state[name].dtype == value.dtype, name
        np.testing.assert_allclose(ours_state[name].astype(np.float64), value.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=f"{name} after step {step}")


@pytest.mark.parametrize("case", ["list_lr_decay", "groups_schedule"])
def test_agrees_with_mindspore_asgd(mode, rng, case):
    """Same inputs into mindspore.nn.ASGD and ms_optim's: every Parameter (weights, ax_, eta_, mu_,
    global_step, learning rates) agrees after every step, names/shapes/dtypes identical."""
    spec = [("conv.weight", (4, 16, 2, 2)), ("dense.weight", (3, 4)), ("dense.bias", (3,)), ("bn.gamma", (4,))]
    if case == "list_lr_decay":
        pairs = _pair(rng, spec, lambda ps: ps, learning_rate=[0.2, 0.1, 0.1, 0.05, 0.02], lambd=0.05,
                      alpha=0.75, t0=2.0, weight_decay=0.01)
    else:
        # (no grad_centralization here: MindSpore's Centralization op has no CPU kernel)
        pairs = _pair(rng, spec, lambda ps: [
            {"params": ps[:2], "lr": 0.05, "weight_decay": 0.03},
            {"params": ps[2:], "lr": _HalvingLR()},
            {"order_params": [ps[1], ps[2], ps[0], ps[3]]}],
            learning_rate=0.1, lambd=0.1, alpha=0.75, t0=1.0, weight_decay=0.0)
    (_, ours), (_, theirs) = pairs
    for step in range(5):
        grads = tuple(Tensor(rng.standard_normal(shape).astype(np.float32)) for _, shape in spec)
        order = [p.name for p in ours.parameters]
        by_name = dict(zip([n for n, _ in spec], grads))
        grads = tuple(by_name[n] for n in order)
        ours(grads)
        theirs(grads)
        # one fused kernel instead of four ops rounds differently: a few float32 ulps
        _assert_same_state(ours, theirs, step + 1, rtol=1e-6, atol=1e-7)


def test_float16_parameters_agree_with_mindspore(rng):
    """Non-float32 parameters take the composite path (float32 math, cast back), as MindSpore does."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        spec = [("w", (6, 5)), ("b", (5,))]
        (_, ours), (_, theirs) = _pair(rng, spec, lambda ps: ps, dtype=np.float16, learning_rate=0.1,
                                       lambd=0.01, t0=1.0)
        for step in range(3):
            grads = tuple(Tensor(rng.standard_normal(shape).astype(np.float16)) for _, shape in spec)
            ours(grads)
            theirs(grads)
            _assert_same_state(ours, theirs, step + 1, rtol=1e-3, atol=1e-3)  # float16: ~1e-3 is one ulp
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_inside_lars_matches_reference(mode, rng):
    """LARS(ASGD): LARS hands c*(g + wd*w) to ASGD, which then adds no decay of its own; the biases
    (rejected by LARS's default filter) get g unchanged. The wrapped ASGD keeps its own settings."""
    from reference.lars_ref import LarsReference

    from ms_optim.nn import LARS

    spec = [("dense.weight", (5, 6)), ("dense.bias", (5,)), ("norm.gamma", (6,))]
    params, arrays = make_params(rng, spec)
    inner = ASGD(params, learning_rate=0.1, lambd=0.05, t0=1.0, weight_decay=0.01)
    opt = LARS(inner, epsilon=1e-5, coefficient=0.02)
    ref = LarsReference(ASGDReference(arrays, lambd=0.05, t0=1.0), keep=[True, False, True], coefficient=0.02,
                        epsilon=1e-5)
    for step in range(4):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
        opt(tuple(Tensor(g) for g in grads))
        ref.step(grads, [0.1] * 3, [0.01, 0.01, 0.0])  # ASGD's own decay filter: no decay on 'gamma'
        _check(inner, ref.inner, step + 1)
    assert inner.exec_weight_decay and inner.decay_flags == (True, True, False)


def test_arguments_are_checked_once(monkeypatch):
    """ASGD's arguments go through ms_optim's checks once (the base class runs them, in signature order)."""
    from ms_optim import _validation

    calls = []
    original = _validation.check_non_negative

    def counting(name, value, cls_name=None):
        calls.append(name)
        return original(name, value, cls_name)

    monkeypatch.setattr(_validation, "check_non_negative", counting)
    params = [Parameter(Tensor(np.ones(3, np.float32)), name="w")]
    ASGD(params, learning_rate=0.1, weight_decay=0.01)
    assert sorted(calls) == ["alpha", "lambd", "learning_rate", "weight_decay"], calls
    assert not hasattr(ASGD, "_eta_next")
