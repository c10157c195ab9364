r"""Preconditioning of the layers that share one geometry, as one stacked product per geometry.

A deep net repeats its blocks: ResNet-101's third stage holds 22 bottlenecks whose convolutions
have three shapes. Their weight gradients ``g`` (``out x in*kh*kw``) and stored inverses have the
same shapes, so the ``L`` layers of one geometry are preconditioned together,

.. code-block:: text

    X = stack_l g_l          (L, out, k)           Gi = stack_l Ginv_l,  Ai = stack_l Ainv_l
    Y = Gi X                  left product,  one batched matmul over the L layers' diagonal blocks
    Z = Y Ai                  right product, likewise
    g_l <- Z[l]

exactly ``G^-1 g A^-1`` of each layer (``preconditioner.precondition_matrix``), with one set of ops
per geometry instead of per layer, so the compiled graph grows with the number of distinct
geometries more than with depth. Geometries held by a single layer keep the per-layer product.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import mindspore.common.dtype as mstype
from mindspore import ParameterTuple, mint, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

__all__ = ["StackedPreconditioning"]

_pick_matrix = C.MultitypeFuncGraph("thor_pick_matrix")


@_pick_matrix.register("Tuple", "Tuple", "Number")
def _pick_matrix_tensor(gradients, shape, index):
    """Gradient ``index`` as a float32 ``shape`` matrix."""
    return ops.reshape(ops.cast(gradients[index], mstype.float32), shape)


def _stacked_left(inverses, x, geom):
    """``Ginv_l x_l`` for stacked inverses ``(L, nblocks, bs, bs)`` and ``x`` of shape ``(L, n, k)``."""
    n, nblocks, bs = geom
    count, _, k = x.shape
    if nblocks == 1:
        return ops.bmm(ops.reshape(inverses, (count, n, n)), x)
    padded = nblocks * bs
    if padded > n:
        x = ops.pad(x, (0, 0, 0, padded - n))
    y = ops.bmm(ops.reshape(inverses, (count * nblocks, bs, bs)), ops.reshape(x, (count * nblocks, bs, k)))
    y = ops.reshape(y, (count, padded, k))
    if padded > n:
        y = ops.slice(y, (0, 0, 0), (count, n, k))
    return y


def _stacked_right(x, inverses, geom):
    """``x_l Ainv_l`` for ``x`` of shape ``(L, k, n)`` and stacked inverses ``(L, nblocks, bs, bs)``."""
    n, nblocks, bs = geom
    count, k, _ = x.shape
    if nblocks == 1:
        return ops.bmm(x, ops.reshape(inverses, (count, n, n)))
    padded = nblocks * bs
    if padded > n:
        x = ops.pad(x, (0, padded - n))
    y = mint.permute(ops.reshape(x, (count, k, nblocks, bs)), (0, 2, 1, 3))
    y = ops.bmm(ops.reshape(y, (count * nblocks, k, bs)), ops.reshape(inverses, (count * nblocks, bs, bs)))
    y = mint.permute(ops.reshape(y, (count, nblocks, k, bs)), (0, 2, 1, 3))
    y = ops.reshape(y, (count, k, padded))
    if padded > n:
        y = ops.slice(y, (0, 0, 0), (count, k, n))
    return y


class _GeometryGroup(nn.Cell):
    """The layers of one geometry: their parameter indices, stored inverses and the two geometries."""

    def __init__(self, indices: Sequence[int], shape: Tuple[int, int], g_inverses: Sequence, a_inverses: Sequence,
                 g_geom: Tuple[int, int, int], a_geom: Tuple[int, int, int]):
        super().__init__(auto_prefix=False)
        self.indices = tuple(indices)
        self.shapes = tuple(shape for _ in indices)
        self.g_inverses = ParameterTuple(g_inverses)
        self.a_inverses = ParameterTuple(a_inverses)
        self.g_geom, self.a_geom = g_geom, a_geom
        self.hyper_map = C.HyperMap()

    def construct(self, gradients):
        x = ops.stack(self.hyper_map(F.partial(_pick_matrix, gradients), self.shapes, self.indices))
        y = _stacked_left(ops.stack(self.g_inverses), x, self.g_geom)
        return _stacked_right(y, ops.stack(self.a_inverses), self.a_geom)


class StackedPreconditioning(nn.Cell):
    """Groups the Dense/Conv weights of identical geometry (``MIN_GROUP`` or more layers each).

    ``place``: per parameter, ``(group, member)`` where its preconditioned gradient is in the output
    of ``construct`` (``(-1, -1)``: not stacked). ``construct(gradients)`` returns one float32
    ``(L, out, in*kh*kw)`` tensor per group.
    """

    #: Fewest layers of one geometry that are stacked (a larger value only serves tests of the per-layer path).
    MIN_GROUP = 2

    def __init__(self, treatments: Sequence[Tuple], shapes: Sequence[Tuple[int, ...]], slots: Sequence, matrix: int):
        super().__init__(auto_prefix=False)
        by_geometry: Dict[Tuple, List[int]] = {}
        for j, (kind, _, g_geom, a_geom) in enumerate(treatments):
            if kind == matrix:
                rows = int(shapes[j][0])
                cols = 1
                for size in shapes[j][1:]:
                    cols *= int(size)
                by_geometry.setdefault((g_geom, a_geom, rows, cols), []).append(j)
        groups, place = [], [(-1, -1)] * len(treatments)
        for (g_geom, a_geom, rows, cols), members in by_geometry.items():
            if len(members) < self.MIN_GROUP:
                continue
            layers = [treatments[j][1] for j in members]
            groups.append(_GeometryGroup(members, (rows, cols), [slots[i].g_inv for i in layers],
                                         [slots[i].a_inv for i in layers], g_geom, a_geom))
            for m, j in enumerate(members):
                place[j] = (len(groups) - 1, m)
        self.groups = nn.CellList(groups, auto_prefix=False)
        self.place = tuple(place)

    def construct(self, gradients):
        out = ()
        for group in self.groups:
            out = out + (group(gradients),)
        return out
