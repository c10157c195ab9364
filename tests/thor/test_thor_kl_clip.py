"""``thor(..., kl_clip=c)`` vs the NumPy float64 oracle (tests/reference/thor_ref.py, ``kl_clip``), every
parameter after every step, in PYNATIVE and GRAPH mode: a case where the clip is active on every step
(nu < 1), one where it never is (nu == 1, the same trajectory as kl_clip=None), a conv + embedding/
LayerNorm case; ``kl_clip_factor``'s guard (nu = 1 for a zero or non-finite denominator); validation.
"""
import math

import numpy as np
import pytest
from mindspore import Tensor, nn
from reference.thor_ref import ConvRef, EmbedRef, MLPRef, ThorReference
from support.nets import MLP, ConvNet, EmbedNet
from support.params import param_values
from support.thor_runs import init_params, mlp_batches, run_against_oracle, schedules, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.step.kl_clip import kl_clip_factor

STEPS = 5


@pytest.mark.parametrize("kl_clip,active", [(1e-4, True), (1e4, False)], ids=["active", "inactive"])
def test_mlp_kl_clip_matches_reference(mode, rng, kl_clip, active):
    net = MLP()
    init_params(net, rng)
    lr, damping = schedules(STEPS)
    ref = ThorReference(MLPRef(), param_values(net), lr, damping, 0.9, batch_size=16, frequency=3,
                        weight_decay=0.01, enable_clip_grad=True, kl_clip=kl_clip)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, weight_decay=0.01, batch_size=16, frequency=3,
               enable_clip_grad=True, kl_clip=kl_clip)
    assert opt.kl_clip == kl_clip
    run_against_oracle(net, ref, train_cell(net, opt), mlp_batches(rng, STEPS))
    if active:
        assert all(nu < 0.5 for nu in ref.kl_nu), ref.kl_nu  # the clip changed every step substantially
    else:
        assert ref.kl_nu == [1.0] * STEPS


def test_inactive_kl_clip_equals_no_clip(mode, rng):
    """A kl_clip that never binds gives the kl_clip=None trajectory (same data, same start)."""
    batches = mlp_batches(rng, 3)
    results = []
    for kl_clip in (None, 1e6):
        net = MLP(20, 30, 10)
        init_params(net, np.random.default_rng(5))
        opt = thor(net, Tensor(np.float32(0.05)), Tensor(np.float32(0.03)), 0.9, batch_size=16, frequency=2,
                   kl_clip=kl_clip)
        cell = train_cell(net, opt)
        for x, y in batches:
            cell(Tensor(x), Tensor(y))
        results.append(param_values(net))
    for name in results[0]:
        np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_conv_kl_clip_matches_reference(mode, rng):
    net = ConvNet(dilation=2)
    init_params(net, rng)
    lr, damping = schedules(4)
    ref = ThorReference(ConvRef((3, 2), 2, 2, 1), param_values(net), lr, damping, 0.9, batch_size=8,
                        frequency=3, kl_clip=1e-4)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=3, kl_clip=1e-4)
    batches = [(rng.standard_normal((8, 3, 9, 9)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32))
               for _ in range(4)]
    run_against_oracle(net, ref, train_cell(net, opt), batches)
    assert all(nu < 1.0 for nu in ref.kl_nu)


def test_embedding_layernorm_kl_clip_matches_reference(mode, rng):
    net = EmbedNet()
    init_params(net, rng)
    lr, damping = schedules(4)
    ref = ThorReference(EmbedRef(1e-7), param_values(net), lr, damping, 0.9, batch_size=8, frequency=2,
                        layernorm=("ln",), kl_clip=3e-4, use_nesterov=True)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=2, kl_clip=3e-4, use_nesterov=True)
    batches = [(rng.integers(0, 12, (8, 3)).astype(np.int32), rng.integers(0, 4, 8).astype(np.int32))
               for _ in range(4)]
    run_against_oracle(net, ref, train_cell(net, opt), batches)
    assert any(nu < 1.0 for nu in ref.kl_nu)


class _Factor(nn.Cell):
    def construct(self, v, g, lr, c):
        return kl_clip_factor((v,), (g,), lr, c)


@pytest.mark.parametrize("v,g,lr,want", [
    ([0.0, 0.0], [1.0, 2.0], 0.1, 1.0),                 # sum v.g = 0: no clipping
    ([np.nan, 1.0], [1.0, 2.0], 0.1, 1.0),              # non-finite: nu = 1 (the step is non-finite anyway)
    ([np.inf, 1.0], [1.0, 2.0], 0.1, 1.0),
    ([1.0, 2.0], [1.0, 2.0], 0.0, 1.0),                 # lr 0
    ([3.0, -4.0], [3.0, -4.0], 0.1, math.sqrt(1e-3 / (0.01 * 25.0))),
    ([-3.0, 4.0], [3.0, -4.0], 0.1, math.sqrt(1e-3 / (0.01 * 25.0))),   # |sum v.g|
    ([0.01, 0.0], [0.01, 0.0], 0.1, 1.0),               # q below kl_clip: nu = 1
])
def test_kl_clip_factor_guard(mode, v, g, lr, want):
    nu = _Factor()(Tensor(np.array(v, np.float32)), Tensor(np.array(g, np.float32)), Tensor(np.float32(lr)),
                   Tensor(np.float32(1e-3)))
    assert float(nu.asnumpy()) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("value,exc,shows", [
    (0.0, ValueError, "0.0"), (-1e-3, ValueError, "-0.001"), (float("nan"), ValueError, "nan"),
    (float("inf"), ValueError, "inf"), (1e300, ValueError, "1e+300"), ("1e-3", TypeError, "'1e-3'"),
    (True, TypeError, "True"), ([1e-3], TypeError, "[0.001]"),
])
def test_kl_clip_validation(value, exc, shows):
    net = MLP(4, 3, 2)
    with pytest.raises(exc) as info:
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, kl_clip=value)
    message = str(info.value)
    assert "For 'thor'" in message and "'kl_clip'" in message and shows in message, message
    assert type(net.fc1) is nn.Dense  # refused before conversion


def test_kl_clip_none_builds_no_clip_branch():
    net = MLP(4, 3, 2)
    assert thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9).kl_clip is None
    assert thor(MLP(4, 3, 2), Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, kl_clip=1).kl_clip == 1.0
