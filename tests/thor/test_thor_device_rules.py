"""MindSpore's device inverse rules (``ms_optim._thor.inversion.device_rules``) against float64 NumPy, both modes.

* ``whitening_blocks``: ``L^-1`` of every block (``F = L L^T``), blocked with a padded last block, and
  ``gpu_embedding_g_inverse``: ``L^-1 L^-1`` accepted for an SPD block, rejected (no NaN out) for a
  singular or non-finite one;
* Ascend's max-abs scale (``finish_inverses``): G times ``max|Ginv| / max|Ainv|`` over the real entries
  (not the padding); a layer with one rejected inverse keeps BOTH stored ones; on a conv net whose
  layers are dead (damping 0: singular factors) the parameters stay finite;
* ``distribute_inverses=True`` with an inverse-averaging convention is refused before the net is
  touched, naming both arguments.
"""
import numpy as np
import pytest
from mindspore import Tensor, nn
from support.nets import ConvNet, EmbedNet
from support.snapshot import assert_unchanged, snapshot
from support.thor_runs import init_params, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.inversion import device_rules as rules
from ms_optim._thor.modes import Strategy
from ms_optim._thor.net import conventions
from ms_optim._thor.net.layers import ThorLayer


class _Whiten(nn.Cell):
    """The two rule functions as a Cell (so GRAPH_MODE compiles them)."""

    def __init__(self, slot):
        super().__init__()
        self.slot = slot

    def construct(self, blocks):
        return rules.whitening_blocks(blocks, self.slot.lead), rules.gpu_embedding_g_inverse(blocks, self.slot)


def _gpu_embedding_slot(dim, block_size):
    net = EmbedNet(dim=dim)
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, batch_size=8, block_size=block_size,
               factor_convention="gpu")
    slot = opt.slots[0]
    assert slot.g_rule == rules.GPU_EMBEDDING and slot.a_diagonal
    return slot


def _spd_blocks(rng, slot):
    n, nblocks, bs = slot.g_geom
    full = rng.standard_normal((n, 3 * n))
    full = full @ full.T / (3 * n) + 0.1 * np.eye(n)
    blocks = np.tile(np.eye(bs), (nblocks, 1, 1))
    for k in range(nblocks):
        stop = min(n, (k + 1) * bs)
        blocks[k, :stop - k * bs, :stop - k * bs] = full[k * bs:stop, k * bs:stop]
    return blocks


@pytest.mark.parametrize("dim,block_size", [(6, 128), (10, 4)])  # one block; three blocks, the last padded
def test_gpu_embedding_product_is_lower_inverse_squared(mode, rng, dim, block_size):
    slot = _gpu_embedding_slot(dim, block_size)
    blocks = _spd_blocks(rng, slot)
    whitening, (product, ok) = _Whiten(slot)(Tensor(blocks.astype(np.float32)))
    for k in range(blocks.shape[0]):
        want = np.linalg.inv(np.linalg.cholesky(blocks[k]))
        np.testing.assert_allclose(whitening.asnumpy()[k], want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
        np.testing.assert_allclose(product.asnumpy()[k], want @ want, rtol=1e-3, atol=1e-4 * np.abs(want @ want).max())
        assert not np.allclose(want @ want, np.linalg.inv(blocks[k]), rtol=0.05)  # it is not the inverse
    assert bool(ok.asnumpy())


@pytest.mark.parametrize("fault", ["singular", "nan", "inf"])
def test_gpu_embedding_product_rejects_bad_blocks(mode, rng, fault):
    slot = _gpu_embedding_slot(6, 128)
    blocks = _spd_blocks(rng, slot)
    if fault == "singular":
        blocks[0] = np.outer(blocks[0][0], blocks[0][0])  # rank one
    else:
        blocks[0, 1, 2] = np.nan if fault == "nan" else np.inf
    _, (_, ok) = _Whiten(slot)(Tensor(blocks.astype(np.float32)))
    assert not bool(ok.asnumpy())


class _Finish(nn.Cell):
    def __init__(self, slot):
        super().__init__()
        self.slot = slot

    def construct(self, new_a, ok_a, new_g, ok_g):
        return rules.finish_inverses(self.slot, new_a, ok_a, new_g, ok_g)


@pytest.mark.parametrize("ok_a,ok_g", [(True, True), (False, True), (True, False)])
def test_ascend_scale_folded_into_g_and_layer_kept_whole(mode, rng, ok_a, ok_g):
    net = ConvNet("pad")
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, batch_size=8, block_size=64,
               factor_convention="ascend")
    slot = opt.slots[1]  # fc: A 100 wide in blocks of 64 (the last padded), G 5 wide
    assert slot.max_scale and slot.a_geom == (100, 2, 64)
    new_a = np.tile(np.eye(64), (2, 1, 1)) * 7.0  # the padding's diagonal (7.0) must not count
    new_a[0] = rng.standard_normal((64, 64)) * 0.5
    new_a[1, :36, :36] = rng.standard_normal((36, 36)) * 0.5
    new_g = rng.standard_normal((1, 5, 5))
    got_a, got_g = _Finish(slot)(Tensor(new_a.astype(np.float32)), Tensor(ok_a), Tensor(new_g.astype(np.float32)),
                                 Tensor(ok_g))
    if ok_a and ok_g:
        real_a_max = max(np.abs(new_a[0]).max(), np.abs(new_a[1, :36, :36]).max())
        np.testing.assert_allclose(got_a.asnumpy(), new_a, rtol=1e-6)
        np.testing.assert_allclose(got_g.asnumpy(), new_g * np.abs(new_g).max() / real_a_max, rtol=1e-5)
    else:  # both stored inverses (here the identity), whichever was rejected
        np.testing.assert_array_equal(got_a.asnumpy(), np.tile(np.eye(64), (2, 1, 1)))
        np.testing.assert_array_equal(got_g.asnumpy(), np.eye(5)[None])


def test_ascend_scale_on_dead_conv_net_stays_finite(mode, rng):
    net = ConvNet("pad")
    init_params(net, rng)
    net.conv.bias.set_data(Tensor(np.full((4,), -1e3, np.float32)))  # every ReLU dead: fc's A and G are zero
    steps = 3
    opt = thor(net, Tensor(np.full(steps, 0.05, np.float32)), Tensor(np.zeros(steps, np.float32)), 0.9,
               batch_size=8, frequency=2, factor_convention="ascend")
    assert [slot.max_scale for slot in opt.slots] == [True, True]
    cell = train_cell(net, opt)
    for _ in range(steps):
        x = rng.standard_normal((8, 3, 9, 9)).astype(np.float32)
        cell(Tensor(x), Tensor(rng.integers(0, 5, 8).astype(np.int32)))
        for p in net.trainable_params():
            assert np.all(np.isfinite(p.asnumpy())), p.name
    np.testing.assert_array_equal(opt.slots[1].a_inv.asnumpy()[0], np.eye(100))   # fc's zero A: both kept
    np.testing.assert_array_equal(opt.slots[1].g_inv.asnumpy()[0], np.eye(5))
    for p in list(opt.matrix_a_inv) + list(opt.matrix_g_inv):
        assert np.all(np.isfinite(p.asnumpy())), p.name


@pytest.mark.parametrize("requested,resolved", [("gpu", "gpu"), ("ascend", "ascend"), ("auto", "gpu"),
                                                ("auto", "ascend")])
def test_distribute_inverses_refused_with_inverse_averaging(monkeypatch, requested, resolved):
    monkeypatch.setattr(conventions, "_device_target", lambda: {"gpu": "GPU", "ascend": "Ascend"}[resolved])
    net = ConvNet("pad")
    before = snapshot(net)
    with pytest.raises(ValueError) as info:
        thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, factor_convention=requested,
             distribute_inverses=True)
    message = str(info.value)
    for part in ("'thor'", "'distribute_inverses'", "'factor_convention'", repr(requested), repr(resolved), "True"):
        assert part in message, message
    assert not any(isinstance(cell, ThorLayer) for _, cell in net.cells_and_names())
    assert_unchanged(before, snapshot(net))


def test_distribute_inverses_accepted_with_kfc():
    opt = thor(ConvNet("pad"), Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, factor_convention="kfc",
               distribute_inverses=True)
    assert opt.sharing.counts and opt.strategy == Strategy.PER_LAYER  # counted, on one rank: not averaged
