"""THOR's fused damped inversion (``MsOptimBlockInverse``, ``inversion/batched.py`` on CPU) against float64 NumPy.

The op damps each diagonal block of a factor (``D = scale * F + (lam + p) I``, ``p = 1`` on the last block's
padding), inverts it in double precision, and writes the float32 inverse in place only when every block
passes the acceptance check of ``preconditioner.residual_accepted`` (``sum |D X - I|`` finite, ``max <=
INVERSE_TOLERANCE``). Checked in PYNATIVE and GRAPH mode: whole and blocked factors with a padded last block,
a G's scale, more accurate than MindSpore's float32 ``MatrixInverse`` on an ill-conditioned block, and every
rejection (non-finite factor, singular block, inaccurate inverse, one bad block among good ones) leaving the
stored inverse untouched and NaN-free; the pure variant (``MsOptimBlockInverseOut``, the layer-by-layer
inversion's) gives the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._thor.inversion.preconditioner import INVERSE_TOLERANCE
from ms_optim._thor.net import factor_kernels as fk

pytestmark = pytest.mark.core  # selected by CI's version leg on the oldest MindSpore (.ci/run)


@pytest.fixture(scope="module")
def inverse_op():
    found = fk.factor_kernels()
    assert found is not None, "the fused kernels must be available on CPU here"
    return found[4]


class _Invert(nn.Cell):
    """``op(inverse, factor, lam, scale, plan)`` in a Cell, so that GRAPH mode compiles it."""

    def __init__(self, op, inverse):
        super().__init__()
        self.op = op
        self.inverse = inverse

    def construct(self, factor, lam, scale, plan):
        return self.op(self.inverse, factor, lam, scale, plan)


def _invert(op, factor, lam, scale=1.0, pad=0, start=None):
    """Run the op on ``factor`` (nblocks, bs, bs); returns (stored inverse, written)."""
    start = np.full(factor.shape, 7.0, np.float32) if start is None else start
    inverse = Parameter(Tensor(start.copy()), name="inverse")
    plan = Tensor(np.array([factor.shape[0], pad, INVERSE_TOLERANCE], np.float64))
    written = _Invert(op, inverse)(Tensor(factor), Tensor(np.float32(lam)), Tensor(np.float32(scale)), plan)
    return inverse.asnumpy(), float(written.asnumpy()[0])


def _damped(factor, lam, scale, pad):
    """The float64 damped blocks of the documented formula."""
    d = factor.astype(np.float64) * np.float64(np.float32(scale))
    nblocks, bs, _ = factor.shape
    for k in range(nblocks):
        extra = np.zeros(bs)
        if k == nblocks - 1 and pad:
            extra[bs - pad:] = 1.0
        d[k] += np.diag(lam + extra)
    return d


def _grams(rng, nblocks, bs, pad=0):
    """Stored-form factor blocks: grams of random rows, the last block's last ``pad`` rows and columns zero."""
    rows = rng.standard_normal((nblocks, 3 * bs, bs)).astype(np.float32) / np.sqrt(3 * bs)
    if pad:
        rows[-1, :, bs - pad:] = 0.0
    return np.einsum("kri,krj->kij", rows, rows).astype(np.float32)


@pytest.mark.parametrize("nblocks,bs,pad,scale", [(1, 9, 0, 1.0), (3, 16, 5, 1.0), (2, 128, 17, 1.0 / 64 ** 2),
                                                  (1, 200, 0, 0.25)])
def test_inverse_is_damped_block_inverse(mode, rng, inverse_op, nblocks, bs, pad, scale):
    lam = 0.05
    factor = _grams(rng, nblocks, bs, pad) / np.float32(scale)
    got, written = _invert(inverse_op, factor, lam, scale, pad)
    assert written == 1.0
    want = np.linalg.inv(_damped(factor, lam, scale, pad))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_more_accurate_than_float32_matrix_inverse(mode, rng, inverse_op):
    """An ill-conditioned block (condition number about 3e4, accepted): the double-precision inversion is
    closer to the float64 inverse than MindSpore's float32 MatrixInverse of the same damped block."""
    q, _ = np.linalg.qr(rng.standard_normal((64, 64)))
    factor = ((q * np.geomspace(1.0, 1e-4, 64)) @ q.T)[None].astype(np.float32)
    lam = 3e-5
    got, written = _invert(inverse_op, factor, lam)
    assert written == 1.0
    damped = factor + np.float32(lam) * np.eye(64, dtype=np.float32)  # formed in float32, as the op forms it
    want = np.linalg.inv(damped.astype(np.float64))
    composite = ops.MatrixInverse()(Tensor(damped)).asnumpy()
    error, composite_error = np.abs(got - want).max(), np.abs(composite - want).max()
    assert error < composite_error / 10, (error, composite_error)


def _rejected(op, factor, lam, pad=0):
    start = np.arange(factor.size, dtype=np.float32).reshape(factor.shape)
    got, written = _invert(op, factor, lam, pad=pad, start=start)
    assert written == 0.0
    np.testing.assert_array_equal(got, start)  # untouched, no NaN written


def test_non_finite_factor_keeps_the_inverse(mode, rng, inverse_op):
    for bad in (np.nan, np.inf):
        factor = _grams(rng, 3, 8)
        factor[1, 2, 5] = bad
        _rejected(inverse_op, factor, 0.1)


def test_singular_block_keeps_the_inverse(mode, rng, inverse_op):
    factor = _grams(rng, 2, 8)
    factor[1] = 0.0  # no damping: a zero pivot
    _rejected(inverse_op, factor, 0.0)


def test_inaccurate_inverse_keeps_the_inverse(mode, inverse_op):
    """A block whose inverse float32 cannot hold accurately (the 8x8 Hilbert matrix, condition number about
    1e10): its float32 residual is far above INVERSE_TOLERANCE, so the factor (its first block the identity)
    is not stored."""
    hilbert = (1.0 / (np.arange(8)[:, None] + np.arange(8)[None, :] + 1.0)).astype(np.float32)
    factor = np.stack([np.eye(8, dtype=np.float32), hilbert])
    x = np.linalg.inv(hilbert.astype(np.float64)).astype(np.float32)
    assert np.abs(hilbert @ x - np.eye(8)).max() > 10 * INVERSE_TOLERANCE  # the case is far from the threshold
    _rejected(inverse_op, factor, 0.0)


def test_padding_is_damped_by_one(mode, inverse_op):
    """A last block that is all padding past its first row: the padded diagonal gets lam + 1, not lam."""
    factor = np.zeros((1, 4, 4), np.float32)
    factor[0, 0, 0] = 3.0
    got, written = _invert(inverse_op, factor, 0.5, pad=3)
    assert written == 1.0
    np.testing.assert_allclose(got[0], np.diag([1 / 3.5, 1 / 1.5, 1 / 1.5, 1 / 1.5]), rtol=1e-6)


class _InvertOut(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, factor, lam, scale, plan):
        return self.op(factor, lam, scale, plan)


@pytest.mark.parametrize("bad", [False, True])
def test_pure_op_equals_the_in_place_op(mode, rng, inverse_op, bad):
    """``MsOptimBlockInverseOut`` (the layer-by-layer inversion's) gives the in-place op's inverse bit for bit and
    its acceptance; a rejected factor gives zeros and 0."""
    factor = _grams(rng, 3, 16, 0) * np.float32(64.0)
    if bad:
        factor[2, 0, 0] = np.nan
    want, written = _invert(inverse_op, factor, 0.05, 1.0 / 64, 5)
    plan = Tensor(np.array([3, 5, INVERSE_TOLERANCE], np.float64))
    inverse, ok = _InvertOut(fk.factor_kernels()[5])(Tensor(factor), Tensor(np.float32(0.05)),
                                                     Tensor(np.float32(1.0 / 64)), plan)
    assert float(ok.asnumpy()[0]) == written == (0.0 if bad else 1.0)
    np.testing.assert_array_equal(inverse.asnumpy(), np.zeros_like(factor) if bad else want)
