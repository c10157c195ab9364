r"""All of a THOR step's damped inversions: one fused op per factor on CPU, else batched per block width.

On CPU (the fused switch of ``factor_kernels``) each factor is one ``MsOptimBlockInverse`` op: it damps
each diagonal block, inverts it in double precision (Gauss-Jordan with partial pivoting), checks it as
below in float32 and writes the stored inverse in place only when every block is accepted. Its
temporaries are one block's, inside the op, and the graph holds one node per factor, so compile time,
the compiled graph and the THOR step's peak stay below the batched composite inversion's
(:doc:`benchmarks` has the figures). The inverses are those of the formula below rounded once to float32
(MindSpore's float32 ``MatrixInverse`` is much further from the float64 inverse on an ill-conditioned
block), so they differ from the composite path's in the last bits.

Elsewhere (GPU, Ascend, ``MS_OPTIM_FUSED=0``): each layer's factors are stored as square diagonal blocks
(``factors.stored_shape``): ``(n, n)`` when ``n <= bs``, else ``(nblocks, bs, bs)``. Blocks of the same width
``w`` -- of any layer, A or G -- are independent ``w x w`` problems, so a THOR step concatenates them into one
``(total, w, w)`` tensor per width and inverts it with one ``MatrixInverse``. A ResNet with the default blocks
of 128 has a handful of widths (128 and the small factors' own sizes) whatever its depth, so the inversion
part of the compiled graph no longer holds a branch per layer.

Chunks. A width's factors are inverted in chunks of whole factors of at most ``CHUNK_BYTES`` of blocks
(a larger factor is a chunk of its own), one chunk after the other: chunk ``i + 1`` reads its factors
only after chunk ``i`` has stored its inverses. A chunk's temporaries (the concatenated and damped
blocks, their inverse, the residual check, the selection) take several times its blocks' size; the
damping and the residual's ``- I`` change the diagonals only (``MatrixDiagPart``/``MatrixSetDiag``),
so no identity or damping term of the blocks' size is formed. One concatenation of every block of a
width would make the THOR step's peak grow with the net's depth; chunks keep it at one chunk's.
``MatrixInverse`` inverts each block on its own, so chunking changes no number. The per-factor work
that is left (read, slice, store) is written as ``hyper_map`` over tuples: GRAPH_MODE specialises one
small graph per element instead of unrolling a loop that grows a tuple, which compiles several times
slower.

The composite path's numbers are those of ``slot.invert_layer``, block for block
(``u = 1 / factor_loss_scale**2``):

.. code-block:: text

    F_k   = u * (stored block k)  if it belongs to a G, else the stored block   (u applied per G factor)
    F_k   <- mean over data-parallel ranks of F_k            (one all-reduce per chunk; none on one device)
    D_k   = F_k + (sqrt(d) + p_k) * I        p_k = 1 on the zero padding of a layer's last block, else 0
    X_k   = D_k^-1                            (one MatrixInverse of a chunk's concatenated blocks)
    bad_k = not finite(sum |D_k X_k - I|) or max |D_k X_k - I| > INVERSE_TOLERANCE
    ok_m  = no bad_k among the blocks of factor m       (UnsortedSegmentMax over the blocks)
    new_m = X (blocks of m)  if ok_m  else the stored inverse of m

(the fused op: the same, ``X_k`` inverted in double precision and rounded to float32; the all-reduce is
one per factor). An embedding's diagonal A stays per layer (``1 / (a + sqrt(d))``, kept where not finite).
Used when every layer is inverted on every THOR step (no ``trace_thresholds``, no ``distribute_inverses``);
the trace rule and inverse sharing decide per layer: the ``PER_LAYER``/``SHARED`` strategies
(``strategy.py``).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import ParameterTuple, Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.inversion.owners import InverseSharing
from ms_optim._thor.modes import Strategy
from ms_optim._thor.net.blocks import keep_if
from ms_optim._thor.parallel import sum_allreduce

__all__ = ["GroupedInversion", "CHUNK_BYTES", "chunk_members"]

# bytes of float32 blocks per chunk of a width's inversion (see the module docstring)
CHUNK_BYTES = 16 * 2 ** 20

_read_blocks = C.MultitypeFuncGraph("thor_read_blocks")
_store_blocks = C.MultitypeFuncGraph("thor_store_blocks")
_store_diagonal = C.MultitypeFuncGraph("thor_store_diagonal")
_mean_over_ranks = C.MultitypeFuncGraph("thor_mean_over_ranks")
_fused_inverse = C.MultitypeFuncGraph("thor_fused_inverse")


@_mean_over_ranks.register("Function", "Number", "Tensor", "Tensor")
def _mean_over_ranks_tensor(allreduce, mean, anchor, factor):
    """The mean over the data-parallel ranks of a factor read after ``anchor``."""
    return allreduce(ops.depend(factor, anchor)) * mean


@_fused_inverse.register("Function", "Tuple", "Tensor", "Tensor", "Tuple", "Tuple", "Tensor", "Tensor")
def _fused_inverse_tensor(op, reduce, anchor, lam, scales, member, factor, inverse):
    """One factor's damped inversion by the fused CPU op (read after ``anchor``; ``reduce``: ``()`` on one
    device, else ``(allreduce, 1 / ranks)``); ``member`` is ``(is_g, plan)``, ``scales`` ``(1, g_unscale)``: a
    G is divided by the square of its loss scale."""
    factor = ops.depend(factor, anchor)
    if reduce:
        factor = reduce[0](factor) * reduce[1]
    return op(inverse, factor, lam, scales[member[0]], member[1])


@_read_blocks.register("Tensor", "Tensor", "Tuple", "Tensor")
def _read_blocks_tensor(anchor, g_unscale, member, factor):
    """A stored factor, read after ``anchor``, as ``(nblocks, w, w)`` float32 blocks; ``member`` is
    ``(shape, is_g)``: a G is divided by the square of its backward pass's loss scale (``g_unscale``)."""
    blocks = ops.reshape(ops.cast(ops.depend(factor, anchor), mstype.float32), member[0])
    if member[1]:
        return blocks * g_unscale
    return blocks


@_store_blocks.register("Tensor", "Tuple", "Tensor")
def _store_blocks_tensor(chosen, span, inverse):
    """Write blocks ``span = (start, stop)`` of the group's accepted inverses into one stored inverse."""
    return ops.assign(inverse, chosen[span[0]:span[1]])


@_store_diagonal.register("Tensor", "Tensor", "Tensor", "Tensor")
def _store_diagonal_tensor(anchor, lam, factor, inverse):
    """An embedding's diagonal A (read after ``anchor``): ``1 / (a + lam)``, stored where finite (else the
    stored one is kept)."""
    new = pc.damped_diagonal_inverse(ops.depend(factor, anchor), lam)
    return ops.assign(inverse, keep_if(ops.all(ops.isfinite(new)), new, inverse))


def chunk_members(width: int, members: Sequence) -> List[List]:
    """``members`` (factors of block width ``width``, each with its ``BlockLayout`` at index 2) in order, cut
    into runs of whole factors holding at most ``CHUNK_BYTES`` of float32 blocks (a larger factor alone)."""
    limit = max(1, CHUNK_BYTES // (4 * width * width))
    chunks: List[List] = []
    blocks = 0
    for member in members:
        nblocks = member[2].nblocks
        if not chunks or blocks + nblocks > limit:
            chunks.append([])
            blocks = 0
        chunks[-1].append(member)
        blocks += nblocks
    return chunks


class _WidthGroup(nn.Cell):
    """The factors of one block width ``w``: their Parameters, stored inverses and block bookkeeping."""

    def __init__(self, width: int, members: Sequence[Tuple[object, object, object, bool]], ranks: int):
        super().__init__(auto_prefix=False)
        self.factors = ParameterTuple([m[0] for m in members])
        self.inverses = ParameterTuple([m[1] for m in members])
        shapes, spans, pad_rows, segments = [], [], [], []
        start = 0
        for m, (_, _, layout, g) in enumerate(members):
            shapes.append(((layout.nblocks, width, width), g))
            spans.append((start, start + layout.nblocks))
            pad_rows.append(layout.pad_diagonal())
            segments += [m] * layout.nblocks
            start += layout.nblocks
        self.total, self.count, self.width = start, len(members), width
        self.shapes, self.spans = tuple(shapes), tuple(spans)
        self.pads = Tensor(np.concatenate(pad_rows, 0))
        self.main_diagonal = Tensor(0, mstype.int32)  # MatrixDiagPartV3's k and padding value
        self.no_padding = Tensor(0.0, mstype.float32)
        self.segments = Tensor(np.array(segments, np.int32))
        self.hyper_map = C.HyperMap()
        self.inverse = ops.MatrixInverse()
        self.is_distributed = ranks > 1
        if self.is_distributed:
            self.allreduce = sum_allreduce(fusion=0)
            self.mean = 1.0 / ranks

    def _add_to_diagonal(self, blocks, values):
        """``blocks`` with ``values`` (broadcast to ``(k, w)``) added to each block's diagonal."""
        return ops.matrix_set_diag(blocks,
                                   ops.matrix_diag_part(blocks, self.main_diagonal, self.no_padding) + values)

    def construct(self, lam, g_unscale, anchor):
        blocks = self.hyper_map(F.partial(_read_blocks, anchor, g_unscale), self.shapes, self.factors)
        blocks = ops.concat(blocks, 0) if self.count > 1 else blocks[0]
        if self.is_distributed:
            blocks = self.allreduce(blocks) * self.mean
        # the damping and the residual's "- I" touch the diagonals only (MatrixDiagPart/MatrixSetDiag): the
        # same values as adding (lam + p) * I and subtracting I, without an identity, a damping and a product
        # of the blocks' full size (each a chunk-sized temporary of the THOR step)
        damped = self._add_to_diagonal(blocks, lam + self.pads)
        inverse = self.inverse(damped)
        good = pc.residual_accepted(ops.abs(self._add_to_diagonal(ops.bmm(damped, inverse), -1.0)), (1, 2))
        bad = ops.unsorted_segment_max(1.0 - ops.cast(good, mstype.float32), self.segments, self.count)
        keep = ops.reshape(ops.gather(bad, self.segments, 0) < 0.5, (self.total, 1, 1))
        old = ops.concat(self.inverses, 0) if self.count > 1 else self.inverses[0]
        chosen = ops.select(ops.broadcast_to(keep, damped.shape), inverse, old)
        return self.hyper_map(F.partial(_store_blocks, chosen), self.spans, self.inverses)


class GroupedInversion(nn.Cell):
    """The ``BATCHED`` strategy (``strategy.py``): every layer's damped inversion on a THOR step, one fused
    op per factor on CPU, else one :class:`_WidthGroup` per chunk of a block width.

    ``slots``: the optimizer's ``LayerSlot``\\ s; ``layers``: the THOR layers in the same order (their factor
    Parameters are read); ``kernels``: THOR's fused CPU ops (``factor_kernels.FactorKernels``) or None.
    ``construct(anchor, lam, factor_loss_scale)`` reads the factors after ``anchor``, inverts and stores every
    inverse (``slot.a_inv`` / ``slot.g_inv``) and returns a token depending on the stores. ``trace`` is None
    (the trace rule decides per layer: never this strategy) and ``sharing`` records no owners' work.
    """

    strategy = Strategy.BATCHED

    def __init__(self, slots: Sequence, layers: Sequence, config: ThorConfig, kernels=None):
        super().__init__(auto_prefix=False)
        self.trace = None
        self.sharing = InverseSharing(slots, config.split_indices, False, config.ranks)
        self.zero_step = Tensor([0], mstype.int32)
        by_width: Dict[int, List] = {}
        embedding_factors, embedding_inverses = [], []
        for slot, layer in zip(slots, layers):
            a_cov, g_cov = layer.matrix_a_cov, layer.matrix_g_cov
            if slot.a_layout is None:
                embedding_factors.append(a_cov)
                embedding_inverses.append(slot.a_inv)
            else:
                by_width.setdefault(slot.a_layout.bs, []).append((a_cov, slot.a_inv, slot.a_layout, False))
            by_width.setdefault(slot.g_layout.bs, []).append((g_cov, slot.g_inv, slot.g_layout, True))
        self.fused = () if kernels is None else (kernels.block_inverse,)
        if self.fused:  # one fused op per factor (CPU): no width groups, no chunk temporaries in the graph
            members = [m for w in sorted(by_width) for m in by_width[w]]
            self.factors = ParameterTuple([m[0] for m in members])
            self.inverses = ParameterTuple([m[1] for m in members])
            self.members = tuple((int(m[3]), m[2].inverse_plan) for m in members)
            self.one = Tensor(1.0, mstype.float32)
        groups = [] if self.fused else [_WidthGroup(w, chunk, config.ranks) for w in sorted(by_width)
                                        for chunk in chunk_members(w, by_width[w])]
        self.groups = nn.CellList(groups, auto_prefix=False)
        self.num_groups = len(self.groups)
        self.widths = tuple(sorted(by_width))
        self.has_embedding = bool(embedding_factors)
        if self.has_embedding:
            self.embedding_factors = ParameterTuple(embedding_factors)
            self.embedding_inverses = ParameterTuple(embedding_inverses)
        self.hyper_map = C.HyperMap()
        self.is_distributed = config.ranks > 1
        self.reduce = ()
        if self.is_distributed:
            self.allreduce = sum_allreduce()
            self.mean = 1.0 / config.ranks
            self.reduce = (self.allreduce, self.mean)

    def anchor(self, gradients):
        """One tensor that waits for every gradient: the THOR branch captures it instead of the gradient tuple
        (a tuple captured by a branch is flattened by MindSpore's tuple_transform pass, which then re-infers
        the whole graph)."""
        return F.depend(self.zero_step, gradients)

    def construct(self, anchor, lam, factor_loss_scale):
        return F.depend(self.zero_step,
                        self._invert_all(lam, ops.reciprocal(ops.square(factor_loss_scale)), anchor))

    def _invert_all(self, lam, g_unscale, anchor):
        done = ()
        if self.fused:
            done = done + (self.hyper_map(F.partial(_fused_inverse, self.fused[0], self.reduce, anchor, lam,
                                                    (self.one, g_unscale)),
                                          self.members, self.factors, self.inverses),)
        for group in self.groups:
            stores = group(lam, g_unscale, anchor)
            # the next chunk reads after these stores: one chunk's temporaries live
            anchor = F.depend(anchor, stores)
            done = done + (stores,)
        if self.has_embedding:
            factors = self.embedding_factors
            if self.is_distributed:
                factors = self.hyper_map(F.partial(_mean_over_ranks, self.allreduce, self.mean, anchor),
                                         factors)
            done = done + (self.hyper_map(F.partial(_store_diagonal, anchor, lam), factors,
                                          self.embedding_inverses),)
        return done
