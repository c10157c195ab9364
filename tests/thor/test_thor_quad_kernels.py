"""The fused CPU ops of adaptive THOR (``ms_optim._thor.net.factor_kernels``): the curvature product
``MsOptimBlockProduct`` and, over every parameter at once, ``MsOptimQuadProducts`` (the quadratic model's inner
products, against NumPy float64), ``MsOptimQuadTrial`` and ``MsOptimQuadMove`` (the moves, bit for bit the
float32 arithmetic of the composite ops they replace); in PYNATIVE and GRAPH mode."""
from __future__ import annotations

import numpy as np
import pytest
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_optim._thor.net import factor_kernels as fk
from ms_optim._thor.step import quad_model as qm

SHAPES = [(4, 3), (5,), (2, 3, 2, 2)]


@pytest.fixture(scope="module")
def kernels():
    found = fk.factor_kernels()
    assert found is not None, "the fused kernels must be available on CPU here"
    return found


class _Call(nn.Cell):
    """An op over tuples of Parameters and Tensors, in a Cell (GRAPH mode compiles it)."""

    def __init__(self, op, written, read):
        super().__init__()
        self.op = op
        self.written = ParameterTuple(written)
        self.read = read

    def construct(self, coefs):
        return self.op(*(self.written + self.read + (coefs,)))


def _parameters(rng, name):
    return [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=f"{name}{i}")
            for i, s in enumerate(SHAPES)]


def test_block_product_is_scaled_g_v_a_with_whole_and_blocked_factors(mode, rng, kernels):
    v = rng.standard_normal((5, 6)).astype(np.float32)
    g = rng.standard_normal((5, 5)).astype(np.float32)                   # one block, stored 2-D
    a_blocks = rng.standard_normal((2, 4, 4)).astype(np.float32)         # two blocks of 4 over 6
    a = np.zeros((8, 8))
    a[:4, :4], a[4:, 4:] = a_blocks[0], a_blocks[1]
    out = kernels.product(Tensor(v), Tensor(g), Tensor(a_blocks), Tensor(np.float32(0.25))).asnumpy()
    want = 0.25 * g.astype(np.float64) @ v @ a[:6, :6]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("directions", [1, 2])
def test_quad_products_are_the_models_inner_products(mode, rng, directions):
    ops_ = fk.quad_kernels(len(SHAPES))
    arrays = {k: [rng.standard_normal(s).astype(np.float32) for s in SHAPES] for k in "xygwpq"}
    decayed, curved = (True, False, True), (True, True, False)
    plan = qm.fused_plan(directions, decayed, curved)
    groups = [arrays[k] for k in "xygwpq"]
    out = ops_.products(*[Tensor(a) for group in groups for a in group], plan).asnumpy().astype(np.float64)
    vs = [arrays["x"], arrays["y"]][:directions]
    ks = [arrays["p"], arrays["q"]][:directions]
    dot = lambda a, b, keep: sum(float(np.sum(a[j].astype(np.float64) * b[j])) for j in range(3) if keep[j])  # noqa: E731
    every = (True,) * 3
    for i in range(directions):
        assert out[3][0][i] == pytest.approx(dot(arrays["g"], vs[i], every), rel=1e-6)
        assert out[3][1][i] == pytest.approx(dot(arrays["w"], vs[i], decayed), rel=1e-6)
        for k in range(directions):
            assert out[0][i][k] == pytest.approx(dot(vs[i], vs[k], every), rel=1e-6)
            assert out[1][i][k] == pytest.approx(dot(vs[i], vs[k], decayed), rel=1e-6)
            want = 0.5 * (dot(ks[i], vs[k], curved) + dot(ks[k], vs[i], curved))  # symmetrised
            assert out[2][i][k] == pytest.approx(want, rel=1e-6)
    if directions == 1:  # the second direction's entries stay 0
        assert out[0][1][1] == out[2][0][1] == out[3][0][1] == 0.0


def test_quad_trial_and_move_are_the_composite_arithmetic(mode, rng):
    ops_ = fk.quad_kernels(len(SHAPES))
    weights, stored, previous = (_parameters(rng, n) for n in ("w", "s", "y"))
    directions = tuple(Tensor(rng.standard_normal(s).astype(np.float32)) for s in SHAPES)
    w0 = [p.asnumpy().copy() for p in weights]
    y0 = [p.asnumpy().copy() for p in previous]
    a0, b0 = np.float32(0.37), np.float32(0.9)
    _Call(ops_.trial, weights + stored, tuple(previous) + directions)(Tensor(np.array([a0, b0])))
    for j in range(len(SHAPES)):
        x = -directions[j].asnumpy()
        np.testing.assert_array_equal(stored[j].asnumpy(), x)
        np.testing.assert_array_equal(weights[j].asnumpy(), w0[j] + (a0 * x + b0 * y0[j]))
    w1 = [p.asnumpy().copy() for p in weights]
    c = np.array([0.11, -0.3, 0.48, 0.6], np.float32)
    _Call(ops_.move, weights + previous, tuple(ops.stop_gradient(s) for s in stored))(Tensor(c))
    for j in range(len(SHAPES)):
        v = stored[j].asnumpy()
        np.testing.assert_array_equal(weights[j].asnumpy(), w1[j] + (c[0] * v + c[1] * y0[j]))
        np.testing.assert_array_equal(previous[j].asnumpy(), c[2] * v + c[3] * y0[j])
