"""THOR's preconditioner: damping, (blocked) damped inverses and the ``G^-1 dW A^-1`` products.

Pure functions of tensors, built only from ``mindspore.ops`` that have CPU, GPU and Ascend kernels
(``MatrixInverse``, ``BatchMatMul``/``MatMul``, slicing, ``Stack``, ``Pad``, ``permute``), so they run
unchanged in PYNATIVE_MODE and GRAPH_MODE. Shapes are Python constants fixed when the optimizer is built
(:class:`BlockLayout`), so GRAPH_MODE sees only static shapes.

Blocked inverses (the default, as MindSpore does on GPU and Ascend). A factor ``F`` of size ``n x n``
is split along its diagonal into ``nblocks = ceil(n / bs)`` blocks of width ``bs`` (the last one
``n - (nblocks - 1) * bs`` wide); off-diagonal blocks are ignored (the layers never compute them:
they store a factor as its diagonal blocks, ``factors.stored_shape``). For damping ``d`` and
``lam = sqrt(d)``, each block ``F_k`` is replaced by ``(F_k + lam I)^-1``. The result is stored as one
``(nblocks, bs, bs)`` tensor; the last block is padded with the identity (its padding is never read
by the products, whose padded inputs are zero). With ``n <= bs`` (or ``inverse="full"``) there is one
block of width ``n``: the whole-matrix inverse ``(F + lam I)^-1``.

Products (``P = nblocks * bs``):

* left, ``G^-1 X`` for ``X`` of shape ``(n, k)``: pad ``X`` to ``(P, k)``, view it as
  ``(nblocks, bs, k)``, one batched matmul with the inverse blocks, drop the padding;
* right, ``X A^-1`` for ``X`` of shape ``(k, n)``: the same on ``(nblocks, k, bs)`` after a transpose
  (``mint.permute``: MindSpore's CPU ``Transpose`` kernel keeps an index table of about twice its
  input from compilation on, for every weight gradient, and ``permute`` does not).

Nothing else is computed on a step that only applies stored inverses.

Validity. ``MatrixInverse`` returns finite garbage (not an error, not NaN) for a singular matrix and
zeros for a non-finite one. An inverse block is therefore accepted only if the damped block was
finite and ``max |F_k X_k - I| <= INVERSE_TOLERANCE``; a layer with any rejected block keeps its
previous inverse (the identity before its first accepted one). With ``damping > 0`` every damped
factor is symmetric positive definite, and its float32 inverse passes the check unless the block's
condition number ``(lambda_max + sqrt(d)) / sqrt(d)`` nears float32's limit (around 1e5 and
beyond), far from THOR's usual damping; the check is there for ``damping == 0`` with a singular
factor (a dead layer) and for non-finite factors, where it keeps NaN and garbage out of the
parameters.
"""
from __future__ import annotations

from typing import Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor, mint, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim._thor.factors import factor_blocks, zero_pad
from ms_optim._thor.modes import Treatment

__all__ = [
    "INVERSE_TOLERANCE",
    "BlockLayout",
    "identity_blocks",
    "damped_blocks",
    "invert_blocks",
    "accept_inverse",
    "residual_accepted",
    "keep_if",
    "apply_left",
    "apply_right",
    "precondition_matrix",
    "damped_diagonal_inverse",
    "precondition_embedding",
    "precondition_layernorm",
    "PLAIN",
    "MATRIX",
    "EMBEDDING",
    "LAYERNORM",
    "precondition_parameter",
]

# How a parameter's gradient is preconditioned (its treatment's first entry; see precondition_parameter)
PLAIN = Treatment.PLAIN
MATRIX = Treatment.MATRIX
EMBEDDING = Treatment.EMBEDDING
LAYERNORM = Treatment.LAYERNORM

#: Largest accepted entry of ``|F_k X_k - I|`` for an inverse block ``X_k`` of a damped block ``F_k``.
INVERSE_TOLERANCE = 1e-2


class BlockLayout:
    """Static block geometry of one ``n x n`` factor: ``nblocks`` diagonal blocks of width ``bs``.

    ``block_size=None`` means one whole-matrix block (``inverse="full"``). ``padded = nblocks * bs``.
    ``eye`` and ``pad_eye`` (the identity blocks and the pad mask, the constants of the layer-by-layer
    inversion) are made when read: each is the size of the factor, and the batched inversion
    (``_thor.grouped``) uses neither (made for every layer, with a NumPy copy, they were 0.12 GiB of
    ResNet-50's resident set).
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
    (the batched inversion of ``grouped.py`` decides per block with :func:`residual_accepted` itself).

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


def keep_if(ok, new, old):
    """``new`` if the scalar bool ``ok`` else ``old`` (same shape), as one elementwise select.

    The condition is broadcast to the shape first: MindSpore's CPU ``Select`` kernel given a scalar
    condition builds broadcast index tables of about six times the tensor's size when the graph is
    compiled (24 MB for a 4 MB tensor) and keeps them; ``BroadcastTo`` and a same-shape ``Select`` do not.
    """
    return ops.select(ops.broadcast_to(ok, new.shape), new, old)


def apply_left(inverse, x, n: int, nblocks: int, bs: int):
    """``F^-1 x`` for a stored (blocked) inverse ``(nblocks, bs, bs)`` and ``x`` of shape ``(n, k)``."""
    if nblocks == 1:
        return ops.matmul(ops.reshape(inverse, (n, n)), x)
    k = x.shape[1]
    padded = nblocks * bs
    if padded > n:
        x = zero_pad(x, (0, 0, 0, padded - n))
    y = ops.bmm(inverse, ops.reshape(x, (nblocks, bs, k)))
    y = ops.reshape(y, (padded, k))
    if padded > n:
        y = y[:n]
    return y


def apply_right(x, inverse, n: int, nblocks: int, bs: int):
    """``x F^-1`` for ``x`` of shape ``(k, n)`` and a stored (blocked) inverse ``(nblocks, bs, bs)``."""
    if nblocks == 1:
        return ops.matmul(x, ops.reshape(inverse, (n, n)))
    k = x.shape[0]
    padded = nblocks * bs
    if padded > n:
        x = zero_pad(x, (0, padded - n))
    y = mint.permute(ops.reshape(x, (k, nblocks, bs)), (1, 0, 2))
    y = ops.bmm(y, inverse)
    y = ops.reshape(mint.permute(y, (1, 0, 2)), (k, padded))
    if padded > n:
        y = y[:, :n]
    return y


def precondition_matrix(grad2d, g_inverse, a_inverse, g_geom, a_geom):
    """``G^-1 dW A^-1`` for a Dense weight gradient (or a conv gradient as ``out x (in*kh*kw)``).

    ``g_geom``/``a_geom`` are ``(n, nblocks, bs)`` tuples of the two layouts.
    """
    y = apply_left(g_inverse, grad2d, g_geom[0], g_geom[1], g_geom[2])
    return apply_right(y, a_inverse, a_geom[0], a_geom[1], a_geom[2])


def damped_diagonal_inverse(diagonal, lam):
    """``1 / (a + lam)`` for the diagonal ``a`` of an embedding's A (a vector of id frequencies)."""
    return ops.reciprocal(ops.cast(diagonal, mstype.float32) + lam)


def precondition_embedding(grad, a_inverse, g_inverse, g_geom):
    """Embedding table gradient ``(vocab, dim)``: rows scaled by ``A^-1`` (diagonal), then ``x G^-1``."""
    scaled = grad * ops.expand_dims(a_inverse, 1)
    return apply_right(scaled, g_inverse, g_geom[0], g_geom[1], g_geom[2])


def precondition_layernorm(grad, lam, batch_size: float):
    """LayerNorm gamma/beta: elementwise ``g / (g^2 / batch_size + lam)``."""
    return grad / (ops.square(grad) / batch_size + lam)


#: ``hyper_map(F.partial(precondition_parameter, kernel, lam, batch_size), treatments, gradients, g_inverses,
#: a_inverses)``, the last two per parameter
precondition_parameter = C.MultitypeFuncGraph("thor_precondition_parameter")


@precondition_parameter.register("Tuple", "Tensor", "Number", "Tuple", "Tensor", "Tensor", "Tensor")
def _precondition_parameter(kernel, lam, batch_size, treatment, gradient, g_inv, a_inv):
    """One parameter's preconditioned gradient. ``kernel``: ``()``, or ``(op,)`` with the fused CPU op
    ``op(g, g_inv, a_inv) = G^-1 g A^-1`` (``factor_kernels``) that replaces :func:`precondition_matrix`
    (one graph node instead of a dozen per layer). ``treatment = (kind, g_geom, a_geom)``: its kind
    (:data:`PLAIN`, :data:`MATRIX`, :data:`EMBEDDING`, :data:`LAYERNORM`) and its THOR layer's ``(n, nblocks,
    bs)`` geometries; ``g_inv``/``a_inv``: that layer's stored inverses (a placeholder for the other kinds).
    Each parameter is given its own layer's inverses, not every layer's to index: passed whole into every
    parameter's call, the inverse tuples kept 22 MiB more of compiled graph at ResNet-50."""
    kind, g_geom, a_geom = treatment
    if kind == MATRIX:
        # the op reads a conv kernel's gradient as out x (in*kh*kw) itself: no reshapes in the graph
        if kernel:
            return ops.cast(kernel[0](ops.cast(gradient, mstype.float32), g_inv, a_inv), F.dtype(gradient))
        shape = gradient.shape
        g2 = precondition_matrix(ops.reshape(ops.cast(gradient, mstype.float32), (shape[0], -1)), g_inv,
                                 a_inv, g_geom, a_geom)
        return ops.cast(ops.reshape(g2, shape), F.dtype(gradient))
    if kind == EMBEDDING:
        g32 = ops.cast(gradient, mstype.float32)
        return ops.cast(precondition_embedding(g32, a_inv, g_inv, g_geom), F.dtype(gradient))
    if kind == LAYERNORM:
        return precondition_layernorm(gradient, lam, batch_size)
    return gradient
