"""THOR's fused factor kernels (``ms_optim._thor.net.factor_kernels``) against the float64 NumPy oracle.

Each op writes its factor Parameter in place; checked in PYNATIVE and GRAPH mode: conv patch grams over
every geometry the layers allow (strides, dilations, "same" with asymmetric padding, "valid", explicit
4-tuple padding, strided 1x1 kernels, non-square kernels), whole factors and diagonal blocks with a
zero-padded last block, patch panels cut into sample chunks, float16 inputs, Dense row grams, Embedding
id counts with out-of-range ids; a False flag and a non-finite result leave the factor untouched.
The layers' own factor tests (``test_thor_layers.py``) run both the fused and the composite taps.
"""
from __future__ import annotations

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from reference.thor_factors import conv_factors, dense_factors, embedding_factors, stored_form

from ms_optim._thor.net import factor_kernels as fk
from ms_optim._thor.net.blocks import apply_left, apply_right
from ms_optim._thor.net.factors import conv_output_geometry, stored_shape

RTOL = 1e-5


@pytest.fixture(scope="module")
def kernels():
    found = fk.factor_kernels()
    assert found is not None, "the fused factor kernels must be available on CPU here"
    return found


class _Apply(nn.Cell):
    """``op(factor, x, flag, plan)`` in a Cell, so that GRAPH mode compiles it."""

    def __init__(self, op, factor):
        super().__init__()
        self.op = op
        self.factor = factor

    def construct(self, x, flag, plan):
        return self.op(self.factor, x, flag, plan)


def _run(op, shape, x, plan, flag=True, start=None):
    factor = Parameter(Tensor(np.zeros(shape, np.float32) if start is None else start), name="factor")
    written = _Apply(op, factor)(Tensor(x), Tensor(np.array(flag)), plan)
    return factor.asnumpy(), float(written.asnumpy()[0])


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * max(np.abs(expected).max(), 1e-12))


CONV_CASES = [  # (input shape, kernel, stride, dilation, pad_mode, padding, block_size)
    ((2, 3, 9, 8), (3, 2), (2, 1), (1, 2), "same", 0, 4),
    ((2, 3, 8, 8), (3, 3), (2, 2), (1, 1), "same", 0, None),
    ((3, 2, 7, 9), (3, 3), (1, 1), (2, 1), "valid", 0, 5),
    ((2, 4, 6, 7), (2, 3), (1, 2), (1, 1), "pad", (1, 0, 2, 1), 8),
    ((2, 5, 7, 7), (1, 1), (2, 2), (1, 1), "same", 0, 3),
    ((2, 3, 12, 12), (7, 7), (2, 2), (1, 1), "pad", 3, 128),
    ((1, 6, 5, 5), (1, 1), (1, 1), (1, 1), "valid", 0, None),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_patch_gram_is_conv_a_and_g(mode, rng, kernels, case):
    """A conv's A (``1 / (B T)`` sum p p^T) and G (``B`` sum d d^T over the positions of dL/ds)."""
    shape, kernel, stride, dilation, pad_mode, padding, block = case
    x = rng.standard_normal(shape).astype(np.float32)
    out_h, out_w = conv_output_geometry(shape[2], shape[3], kernel, stride, dilation, pad_mode, padding)[4:]
    ds = rng.standard_normal((shape[0], 4, out_h, out_w)).astype(np.float32)
    want_a, want_g = conv_factors(x, ds, kernel, stride, dilation, pad_mode, padding)
    n = shape[1] * kernel[0] * kernel[1]
    plan = fk.patch_plan_tensor(shape, kernel, stride, dilation, pad_mode, padding, block, 2.0, True)
    got, written = _run(kernels[0], stored_shape(n, block), x, plan)
    _close(got, stored_form(2.0 * want_a, block))
    assert written == 1.0
    plan = fk.patch_plan_tensor(ds.shape, (1, 1), (1, 1), (1, 1), "valid", 0, 3, 0.5, False)
    got, _ = _run(kernels[0], stored_shape(4, 3), ds, plan)
    _close(got, stored_form(0.5 * want_g, 3))


def test_patch_panels_in_sample_chunks_and_float16(mode, rng, kernels, monkeypatch):
    """Panels smaller than the batch (chunks of 2, 2 and 1 samples) sum to the whole batch's A, and a
    float16 input gives the gram of its float16 values in float32."""
    monkeypatch.setattr(fk, "PANEL_FLOATS", 4 * 2 * 36)  # bs 4, 36 positions: two samples per panel
    x = rng.standard_normal((5, 3, 6, 6)).astype(np.float16)
    plan = fk.patch_plan_tensor(x.shape, (3, 3), (1, 1), (1, 1), "same", 0, 4, 1.0, True)
    want = conv_factors(x.astype(np.float64), np.zeros((5, 1, 6, 6)), (3, 3))[0]
    got, _ = _run(kernels[0], stored_shape(27, 4), x, plan)
    _close(got, stored_form(want, 4))


@pytest.mark.parametrize("rows,width,block", [(6, 5, None), (7, 10, 4), (3, 9, 9), (4, 300, 128)])
def test_row_gram_is_dense_a_and_g(mode, rng, kernels, rows, width, block):
    """A Dense layer's A (``a^T a / N``) and G (``N d^T d``), whole or in blocks; float16 rows too."""
    a = rng.standard_normal((rows, width)).astype(np.float32)
    want_a, want_g = dense_factors(a, a)
    got, _ = _run(kernels[1], stored_shape(width, block), a, fk.row_plan_tensor(a.shape, block, 1.0, True))
    _close(got, stored_form(want_a, block))
    got, _ = _run(kernels[1], stored_shape(width, block), a, fk.row_plan_tensor(a.shape, block, 3.0, False))
    _close(got, stored_form(3.0 * want_g, block))
    half = a.astype(np.float16)
    got, _ = _run(kernels[1], stored_shape(width, block), half, fk.row_plan_tensor(a.shape, block, 1.0, True))
    _close(got, stored_form(dense_factors(half.astype(np.float64), a)[0], block))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_id_counts_are_embedding_a(mode, rng, kernels, dtype):
    """An Embedding's A: ``counts / N``, ids outside ``[0, vocab_size)`` not counted."""
    ids = rng.integers(-2, 9, size=(3, 5)).astype(dtype).reshape(-1)
    want = embedding_factors(ids, np.zeros((15, 1)), 7)[0]
    got, _ = _run(kernels[2], (7,), ids, fk.count_plan_tensor(15, 1.0))
    _close(got, want)


def test_false_flag_and_non_finite_result_leave_the_factor(mode, rng, kernels):
    """Flag False: nothing is written (0.0); a non-finite input: the factor keeps its value (0.0);
    otherwise it is written (1.0)."""
    start = rng.standard_normal((4, 4)).astype(np.float32)
    rows = rng.standard_normal((5, 4)).astype(np.float32)
    plan = fk.row_plan_tensor(rows.shape, None, 1.0, True)
    got, written = _run(kernels[1], (4, 4), rows, plan, flag=False, start=start)
    np.testing.assert_array_equal(got, start)
    assert written == 0.0
    rows[2, 1] = np.inf
    got, written = _run(kernels[1], (4, 4), rows, plan, start=start)
    np.testing.assert_array_equal(got, start)
    assert written == 0.0
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    x[0, 1, 1, 1] = np.nan
    plan = fk.patch_plan_tensor(x.shape, (1, 1), (1, 1), (1, 1), "valid", 0, None, 1.0, True)
    got, written = _run(kernels[0], (2, 2), x, plan, start=start[:2, :2].copy())
    np.testing.assert_array_equal(got, start[:2, :2])
    assert written == 0.0


class _Precondition(nn.Cell):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, grad, g_inv, a_inv):
        return self.op(grad, g_inv, a_inv)


def _blocks(rng, n, block):
    """Random inverse blocks in stored form, the last block's padding the identity (as stored)."""
    nblocks, bs = (1, n) if block is None or block >= n else (-(-n // block), block)
    blocks = rng.standard_normal((nblocks, bs, bs)).astype(np.float32)
    tail = n - (nblocks - 1) * bs
    blocks[-1, tail:, :] = 0.0
    blocks[-1, :, tail:] = 0.0
    blocks[-1, tail:, tail:] = np.eye(bs - tail, dtype=np.float32)
    return blocks


def _block_diagonal(blocks, n):
    full = np.zeros((blocks.shape[0] * blocks.shape[1],) * 2)
    for k, block in enumerate(blocks):
        full[k * block.shape[0]:(k + 1) * block.shape[0], k * block.shape[0]:(k + 1) * block.shape[0]] = block
    return full[:n, :n]


@pytest.mark.parametrize("rows,cols,g_block,a_block", [(4, 6, None, None), (10, 18, 4, 5), (7, 300, 128, 128),
                                                       (9, 9, 3, 4)])
def test_precondition_is_g_inverse_grad_a_inverse(mode, rng, kernels, rows, cols, g_block, a_block):
    """``G^-1 g A^-1`` with block-diagonal inverses (padded last blocks), equal to the NumPy product and
    to the composite products of ``net/blocks.py``."""
    grad = rng.standard_normal((rows, cols)).astype(np.float32)
    g_inv, a_inv = _blocks(rng, rows, g_block), _blocks(rng, cols, a_block)
    want = _block_diagonal(g_inv, rows) @ grad.astype(np.float64) @ _block_diagonal(a_inv, cols)
    got = _Precondition(kernels[3])(Tensor(grad), Tensor(g_inv), Tensor(a_inv)).asnumpy()
    _close(got, want)
    left = apply_left(Tensor(g_inv), Tensor(grad), rows, *g_inv.shape[:2])
    composite = apply_right(left, Tensor(a_inv), cols, *a_inv.shape[:2]).asnumpy()
    _close(got, composite)


def test_precondition_reads_a_conv_gradient_as_its_matrix(mode, rng, kernels):
    """A conv kernel's gradient (out, in, kh, kw) is preconditioned as its (out, in*kh*kw) matrix, bit for bit,
    and keeps its shape (the optimizer passes it without reshapes)."""
    grad = rng.standard_normal((10, 3, 3, 2)).astype(np.float32)
    g_inv, a_inv = _blocks(rng, 10, 4), _blocks(rng, 18, 5)
    got = _Precondition(kernels[3])(Tensor(grad), Tensor(g_inv), Tensor(a_inv)).asnumpy()
    matrix = _Precondition(kernels[3])(Tensor(grad.reshape(10, 18)), Tensor(g_inv), Tensor(a_inv)).asnumpy()
    assert got.shape == grad.shape
    np.testing.assert_array_equal(got.reshape(10, 18), matrix)
    want = _block_diagonal(g_inv, 10) @ grad.reshape(10, 18).astype(np.float64) @ _block_diagonal(a_inv, 18)
    _close(got.reshape(10, 18), want)
