"""THOR's damped inverses: the block layout of a factor, the damping, the inversion and its acceptance.

Pure functions of tensors, built only from ``mindspore.ops`` that have CPU, GPU and Ascend kernels
(``MatrixInverse``, ``BatchMatMul``, slicing, ``Stack``, ``Pad``), so they run unchanged in PYNATIVE_MODE and
GRAPH_MODE. Shapes are Python constants fixed when the optimizer is built (:class:`BlockLayout`), so
GRAPH_MODE sees only static shapes.

Blocked inverses (the default, as MindSpore does on GPU and Ascend). A factor ``F`` of size ``n x n`` is split
along its diagonal into ``nblocks = ceil(n / bs)`` blocks of width ``bs`` (the last one ``n - (nblocks - 1) *
bs`` wide); off-diagonal blocks are ignored (the layers never compute them: they store a factor as its
diagonal blocks, ``net/factors.stored_shape``). For damping ``d`` and ``lam = sqrt(d)``, each block ``F_k`` is
replaced by ``(F_k + lam I)^-1``. The result is stored as one ``(nblocks, bs, bs)`` tensor; the last block is
padded with the identity (its padding is never read by the products of ``net/blocks.py``, whose padded inputs
are zero). With ``n <= bs`` (or ``inverse="full"``) there is one block of width ``n``: the whole-matrix
inverse.

Validity. ``MatrixInverse`` returns finite garbage (not an error, not NaN) for a singular matrix and zeros for
a non-finite one. An inverse block is therefore accepted only if the damped block was finite and ``max |F_k
X_k - I| <= INVERSE_TOLERANCE``; a layer with any rejected block keeps its previous inverse (the identity
before its first accepted one). With ``damping > 0`` every damped factor is symmetric positive definite, and
its float32 inverse passes the check unless the block's condition number ``(lambda_max + sqrt(d)) / sqrt(d)``
nears float32's limit; the check is there for ``damping == 0`` with a singular factor (a dead layer) and for
non-finite factors, where it keeps NaN and garbage out of the parameters.
"""
from __future__ import annotations

from typing import Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor, ops

from ms_optim._thor.net.factors import factor_blocks

__all__ = ["INVERSE_TOLERANCE", "BlockLayout", "identity_blocks", "damped_blocks", "invert_blocks",
           "accept_inverse", "residual_accepted", "damped_diagonal_inverse"]

#: Largest accepted entry of ``|F_k X_k - I|`` for an inverse block ``X_k`` of a damped block ``F_k``.
INVERSE_TOLERANCE = 1e-2


class BlockLayout:
    """Static block geometry of one ``n x n`` factor: ``nblocks`` diagonal blocks of width ``bs``.

    ``block_size=None`` means one whole-matrix block (``inverse="full"``). ``padded = nblocks * bs``.
    ``eye`` and ``pad_eye`` (the identity blocks and the pad mask, the constants of the layer-by-layer
    inversion) are made when read, not kept: each is the size of the factor, and the batched inversion
    (``batched.py``) uses neither.
    """

    def __init__(self, n: int, block_size=None):
        if n < 1:
            raise ValueError(f"A THOR factor must have a positive size, but got {n}.")
        nblocks, bs = factor_blocks(int(n), None if block_size is None else int(block_size))
        self.n = int(n)
        self.bs = int(bs)
        self.nblocks = int(nblocks)
        self.padded = self.nblocks * self.bs
        self.pad = self.padded - self.n

    def pad_diagonal(self) -> np.ndarray:
        """``(nblocks, bs)`` float32: 1 where the diagonal runs through the last block's padding, else 0."""
        marks = np.zeros((self.nblocks, self.bs), np.float32)
        if self.pad:
            marks[-1, self.bs - self.pad:] = 1.0
        return marks

    def pad_identity(self) -> np.ndarray:
        """``(nblocks, bs, bs)`` float32: :meth:`pad_diagonal` on the blocks' diagonals, 0 elsewhere."""
        return np.eye(self.bs, dtype=np.float32)[None] * self.pad_diagonal()[:, None, :]

    @property
    def eye(self) -> Tensor:
        """:func:`identity_blocks` as a new Tensor (read once per slot by the layer-by-layer inversion)."""
        return Tensor(identity_blocks(self), mstype.float32)

    @property
    def pad_eye(self) -> Tensor:
        """:meth:`pad_identity` as a new Tensor."""
        return Tensor(self.pad_identity(), mstype.float32)

    @property
    def inverse_plan(self) -> Tensor:
        """The fused CPU inversion's plan of this factor (``MsOptimBlockInverse[Out]``, ``factor_kernels``):
        ``(nblocks, pad, INVERSE_TOLERANCE)`` as float64."""
        return Tensor(np.array([self.nblocks, self.pad, INVERSE_TOLERANCE], np.float64))

    @property
    def geom(self) -> Tuple[int, int, int]:
        """``(n, nblocks, bs)``: the layout as the graph's products read it (a tuple of constants)."""
        return (self.n, self.nblocks, self.bs)

    @property
    def shape(self) -> Tuple[int, int, int]:
        """Shape of the stored inverse: ``(nblocks, bs, bs)``."""
        return (self.nblocks, self.bs, self.bs)

    def __repr__(self) -> str:
        return f"BlockLayout(n={self.n}, nblocks={self.nblocks}, bs={self.bs})"


def identity_blocks(layout: BlockLayout) -> np.ndarray:
    """The identity in stored form (the initial inverse and the fallback), as a NumPy array."""
    return np.broadcast_to(np.eye(layout.bs, dtype=np.float32), layout.shape).copy()


def damped_blocks(factor, lam, n: int, nblocks: int, bs: int, eye, pad_eye):
    """Diagonal blocks of ``factor + lam I`` as ``(nblocks, bs, bs)``; padding is the identity.

    ``factor``: float32, in the layers' stored form (``factors.stored_shape``): ``(n, n)`` when it is one
    block, else its ``(nblocks, bs, bs)`` diagonal blocks, zero-padded past ``n``; ``lam``: scalar
    float32 tensor (``sqrt(damping)``).
    """
    factor = ops.cast(factor, mstype.float32)
    if nblocks == 1:
        factor = ops.reshape(factor, (1, n, n))
    return factor + lam * eye + pad_eye


def invert_blocks(blocks):
    """Batched inverse of ``(nblocks, bs, bs)`` blocks (``MatrixInverse``: CPU, GPU and Ascend kernels)."""
    return ops.MatrixInverse()(blocks)


def accept_inverse(blocks, inverse, eye):
    """Scalar bool: every block and inverse finite and ``max |blocks @ inverse - I| <= INVERSE_TOLERANCE``
    (the batched inversion of ``batched.py`` decides per block with :func:`residual_accepted` itself).

    Finiteness is read from the residual ``R = |blocks @ inverse - I|`` alone: a NaN or infinite entry
    in either factor makes some entry of the product NaN or infinite (``inf * 0`` is NaN), so
    ``sum(R)`` is finite exactly when both are (three kernels fewer per factor than checking each).
    """
    return residual_accepted(ops.abs(ops.bmm(blocks, inverse) - eye))


def residual_accepted(residual, axis=()):
    """``sum(residual)`` finite and ``max(residual) <= INVERSE_TOLERANCE`` over ``axis`` (``()``: all of it)
    for an absolute residual such as ``|F X - I|``: the acceptance of every inverse THOR stores."""
    return ops.logical_and(ops.isfinite(ops.reduce_sum(residual, axis)),
                           ops.reduce_max(residual, axis) <= INVERSE_TOLERANCE)


def damped_diagonal_inverse(diagonal, lam):
    """``1 / (a + lam)`` for the diagonal ``a`` of an embedding's A (a vector of id frequencies)."""
    return ops.reciprocal(ops.cast(diagonal, mstype.float32) + lam)
