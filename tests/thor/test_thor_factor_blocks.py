"""THOR factors stored as their diagonal blocks (``ms_optim._thor.net.factors``: ``stored_shape``).

A layer whose factor is wider than the optimizer's ``block_size`` computes and keeps only the diagonal
blocks the blocked inverse reads. Checked against the float64 NumPy reference: the block helpers
themselves, the stored factors of a conv and a Dense layer, a whole THOR trajectory with small blocks
(padded last blocks included) in both modes, ``inverse="full"`` keeping whole matrices, the trace of
blocked factors, and the refusal of a layer whose blocks do not match the optimizer's.
"""
from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor, nn
from reference.thor_factors import conv_factors, stored_form
from reference.thor_ref import ConvRef, ThorReference
from support.nets import ConvNet
from support.params import param_values
from support.thor_runs import init_params, run_against_oracle, schedules, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.inversion.slot import LayerSlot
from ms_optim._thor.inversion.trace import factor_trace as _trace
from ms_optim._thor.net import factors
from ms_optim._thor.net.layers import Conv2dThor, DenseThor

RTOL = 1e-5


class _Helpers(nn.Cell):
    def __init__(self, block_size):
        super().__init__()
        self.block_size = block_size

    def construct(self, full, columns):
        return (factors.diagonal_blocks(full, self.block_size), factors.batch_gram(columns, 0.5, self.block_size),
                _trace(factors.diagonal_blocks(full, self.block_size), False))


@pytest.mark.parametrize("n,block_size", [(10, 4), (8, 4), (5, None), (5, 8), (9, 3), (5, 4), (7, 6), (20, 8)])
def test_block_helpers_match_numpy(mode, rng, n, block_size):
    """diagonal_blocks, batch_gram (0.5 * sum_b c_b c_b^T) and the trace of the stored form, against NumPy."""
    full = rng.standard_normal((n, n))
    columns = rng.standard_normal((3, n, 7))
    blocks, gram, trace = _Helpers(block_size)(Tensor(full.astype(np.float32)), Tensor(columns.astype(np.float32)))
    assert blocks.shape == factors.stored_shape(n, block_size) == stored_form(full, block_size).shape
    np.testing.assert_array_equal(blocks.asnumpy(), stored_form(full.astype(np.float32), block_size))
    want = 0.5 * np.einsum("bit,bjt->ij", columns, columns)
    np.testing.assert_allclose(gram.asnumpy(), stored_form(want, block_size), rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(float(trace.asnumpy()), np.trace(full), rtol=RTOL)


class _ConvA(nn.Cell):
    def construct(self, x):
        return factors.conv_a(x, (3, 2), (2, 1), (1, 2), "same", 0, 4)


@pytest.mark.parametrize("limit,size", [(None, 5), (10000, 3), (6000, 2), (1, 1)])
def test_conv_a_in_batch_chunks_matches_reference(mode, rng, monkeypatch, limit, size):
    """Patches larger than PATCH_CHUNK_BYTES are built in batch chunks (the last one smaller, down
    to one sample); the summed A equals the whole batch's (NumPy reference, stored form)."""
    x = rng.standard_normal((5, 3, 9, 8))
    geometry = factors.conv_output_geometry(9, 8, (3, 2), (2, 1), (1, 2), "same", 0)
    patch_bytes = 4 * 5 * 3 * 6 * geometry[4] * geometry[5]
    if limit is not None:
        monkeypatch.setattr(factors, "PATCH_CHUNK_BYTES", limit)
    assert factors.patch_chunk_size(5, patch_bytes) == size
    want = conv_factors(x, np.zeros((5, 1, geometry[4], geometry[5])), (3, 2), (2, 1), (1, 2), "same")[0]
    np.testing.assert_allclose(_ConvA()(Tensor(x.astype(np.float32))).asnumpy(), stored_form(want, 4),
                               rtol=RTOL, atol=1e-6)


def test_blocked_factors_and_trajectory_match_reference(mode, path, rng):
    """block_size 5: conv A (18 wide: blocks 5, 5, 5, 3 padded) and fc A (80 wide: 16 blocks) are stored as
    diagonal blocks, equal to the reference's factors in that form, and five THOR steps follow the
    reference THOR with 5-wide blocked inverses."""
    steps = 5
    net = ConvNet(dilation=2)
    init_params(net, rng)
    lr, damping = schedules(steps)
    model = ConvRef((3, 2), 2, 2, 1)
    ref = ThorReference(model, param_values(net), lr, damping, 0.9, batch_size=8, frequency=3, block_size=5)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=3, block_size=5)
    assert net.conv.matrix_a_cov.shape == (4, 5, 5) and net.conv.matrix_g_cov.shape == (4, 4)
    assert net.fc.matrix_a_cov.shape == (16, 5, 5) and net.fc.matrix_g_cov.shape == (5, 5)
    batches = [(rng.standard_normal((8, 3, 9, 9)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32))
               for _ in range(steps)]
    _, _, want = model.forward_backward(ref.params, *batches[0])
    run_against_oracle(net, ref, train_cell(net, opt), batches[:1])
    for layer in ("conv", "fc"):
        cell = getattr(net, layer)
        for got, full in zip((cell.matrix_a_cov, cell.matrix_g_cov), want[layer]):
            np.testing.assert_allclose(got.asnumpy(), stored_form(full, 5), rtol=1e-4, atol=1e-6, err_msg=layer)
    run_against_oracle(net, ref, train_cell(net, opt), batches[1:])


def test_full_inverse_keeps_whole_factors_and_default_blocks_wide_ones():
    """inverse="full": a 150-wide A is stored whole; the default (blocks of 128): as 2 blocks."""
    for kwargs, want in (({"inverse": "full"}, (150, 150)), ({}, (2, 128, 128))):
        net = nn.SequentialCell([nn.Conv2d(6, 4, 5, pad_mode="valid"), nn.Flatten(), nn.Dense(16, 3)])
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.03)), 0.9, batch_size=4, **kwargs)
        assert net[0].matrix_a_cov.shape == want, kwargs


def test_set_factor_block_size_keeps_names_and_a_mismatch_is_refused():
    """set_factor_block_size reshapes the factors (zeros, same names); an optimizer slot whose blocks
    differ from the layer's refuses it with a message that says what to call."""
    layer = DenseThor(150, 10)
    names = (layer.matrix_a_cov.name, layer.matrix_g_cov.name)
    assert layer.factor_block_size == 128 and layer.matrix_a_cov.shape == (2, 128, 128)
    layer.set_factor_block_size(50)
    assert layer.matrix_a_cov.shape == (3, 50, 50) and layer.matrix_g_cov.shape == (10, 10)
    assert (layer.matrix_a_cov.name, layer.matrix_g_cov.name) == names
    layer.set_factor_block_size(None)
    assert layer.matrix_a_cov.shape == (150, 150) and not layer.matrix_a_cov.asnumpy().any()
    with pytest.raises(ValueError, match=r"inverts blocks of 64"):
        LayerSlot(0, layer, 0, 64)
    conv = Conv2dThor(16, 200, 3)
    assert conv.matrix_a_cov.shape == (2, 128, 128) and conv.matrix_g_cov.shape == (2, 128, 128)
