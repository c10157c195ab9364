"""Products with a factor (or an inverse) stored as its diagonal blocks, and the one elementwise select.

A factor of size ``n x n`` is stored as ``(n, n)`` when it is one block, else as its ``nblocks`` diagonal
blocks of width ``bs``, ``(nblocks, bs, bs)``, the last one padded (``factors.stored_shape``); its inverse is
stored as ``(nblocks, bs, bs)`` always. A product reads either through the geometry ``(n, nblocks, bs)``:

* left, ``F x`` for ``x`` of shape ``(n, k)``: pad ``x`` to ``(nblocks * bs, k)``, view it as ``(nblocks, bs,
  k)``, one batched matmul with the blocks, drop the padding;
* right, ``x F`` for ``x`` of shape ``(k, n)``: the same on ``(nblocks, k, bs)`` after a transpose
  (``mint.permute``: MindSpore's CPU ``Transpose`` kernel keeps an index table of about twice its input from
  compilation on, for every weight gradient, and ``permute`` does not).

Built from ops with CPU, GPU and Ascend kernels; shapes are constants fixed when the optimizer is built.
"""
from __future__ import annotations

from mindspore import mint, ops

from ms_optim._thor.net.factors import zero_pad

__all__ = ["apply_left", "apply_right", "keep_if"]


def keep_if(ok, new, old):
    """``new`` if the scalar bool ``ok`` else ``old`` (same shape), as one elementwise select.

    The condition is broadcast to the shape first: MindSpore's CPU ``Select`` kernel given a scalar condition
    builds broadcast index tables of several times the tensor's size when the graph is compiled and keeps
    them; ``BroadcastTo`` and a same-shape ``Select`` do not.
    """
    return ops.select(ops.broadcast_to(ok, new.shape), new, old)


def apply_left(blocks, x, n: int, nblocks: int, bs: int):
    """``F x`` for ``F`` stored as ``blocks`` and ``x`` of shape ``(n, k)``."""
    if nblocks == 1:
        return ops.matmul(ops.reshape(blocks, (n, n)), x)
    k = x.shape[1]
    padded = nblocks * bs
    if padded > n:
        x = zero_pad(x, (0, 0, 0, padded - n))
    y = ops.bmm(blocks, ops.reshape(x, (nblocks, bs, k)))
    y = ops.reshape(y, (padded, k))
    if padded > n:
        y = y[:n]
    return y


def apply_right(x, blocks, n: int, nblocks: int, bs: int):
    """``x F`` for ``x`` of shape ``(k, n)`` and ``F`` stored as ``blocks``."""
    if nblocks == 1:
        return ops.matmul(x, ops.reshape(blocks, (n, n)))
    k = x.shape[0]
    padded = nblocks * bs
    if padded > n:
        x = zero_pad(x, (0, padded - n))
    y = mint.permute(ops.reshape(x, (k, nblocks, bs)), (1, 0, 2))
    y = ops.bmm(y, blocks)
    y = ops.reshape(mint.permute(y, (1, 0, 2)), (k, padded))
    if padded > n:
        y = y[:, :n]
    return y
