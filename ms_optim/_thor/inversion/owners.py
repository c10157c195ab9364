r"""THOR's inversions shared across data-parallel ranks (``thor(..., distribute_inverses=True)``).

One layer's inversion is ``ms_optim._thor.inversion.slot.invert_layer``. Sharing (KAISA's idea, as in
kfac-pytorch): under data parallelism every rank holds the same all-reduced factors, so by default
every rank inverts every layer: R times the same work. With
``distribute_inverses=True`` and R > 1 ranks, each layer is inverted by ONE rank, its owner, and the
inverses are then shared:

* cost of a layer: ``c_l = sum of w^3 over the diagonal blocks (width w) of A_l and of G_l``
  (a dense ``w x w`` inversion is O(w^3); an embedding's diagonal A counts ``vocab`` blocks of width 1);
* owners: greedy longest-processing-time (``assign_inversions``): layers in decreasing cost (ties:
  lower index first), each to the rank with the least load so far (ties: lower rank). Its largest
  load is at most 4/3 of the optimum. It is a function of the layer shapes and R only, so every rank
  computes the same owners when the optimizer is built, and its own rank
  (``mindspore.communication.get_rank()``) is known then: the graph of rank r contains the
  inversions of r's layers and no others;
* sharing: on rank r, layer l's contribution is its accepted inverse if r owns l, else zeros; one
  ``AllReduce(SUM)`` per fusion group (the groups of ``split_indices``, ``parallel.fusion_groups``,
  fusion ids distinct from the factors') gives every rank ``inv_l = sum_r contribution_r = the owner's
  inverse`` -- exactly, since ``x + 0 = x`` in floating point. So the parameters are bit-for-bit those
  of the run where every rank inverts everything. The acceptance fallback stays exact too: the
  previous inverse the owner falls back to is the same on every rank.

Why AllReduce of zero-padded contributions rather than AllGather or Broadcast: AllGather concatenates
equal-shaped pieces, but each rank's share is a different set of differently shaped matrices
(padding them all to one shape costs more than the zeros here); Broadcast has one fixed root per
operator, i.e. one collective per layer (or per owner) that cannot be fused with the others, while
the AllReduce reuses the fusion groups of the factor reduction (one fused collective per group, the
same schedule as ``FactorAllReduce``). The price is bandwidth: a ring AllReduce moves about twice the
inverses' bytes, a Broadcast once; the inversions it saves (O(w^3) each) dominate for the wide
layers the option is for. The factors are still mean-all-reduced to every rank (only the owner
needs them; a reduce-to-owner would save bandwidth, not compute).

Order. A collective backend pairs the collectives of the ranks by the order they are issued, and
here the ranks' graphs differ (each holds other inversions), so their schedules may differ: the
order is written into the graph as data dependencies. With sharing on, every rank issues: the
gradient reduction (before the optimizer), then the A factors' reductions in layer order (the first
after ALL the gradients, ``after``), then the G factors' (after the last A), then, once ALL of this
rank's inversions are done, the inverse sharing in the order A_0, G_0, A_1, G_1, ... (after the
last G factor). The inversions themselves wait for the last factor reduction, and the first share
waits for all of this rank's inversions: the ranks then invert concurrently instead of in turn. (Without
the first wait a rank may invert a layer whose factors are reduced between two later factor
reductions, holding the other ranks at the next one, and the ranks' shares are serialised: on 2 CPU
ranks, ResNet-18 width 16, the shared THOR step was then no faster than the unshared one, 1.0x
instead of 1.4x.) (Sequencing the collectives may keep a backend from fusing those of
one group into one transfer; the ``fusion`` attributes are still set.)

Counting: with ``distribute_inverses=True`` (any number of ranks) the sharing Cell keeps
``inversion_count``, an int32 Parameter of shape ``(num_layers,)``: entry l is the number of times
THIS rank inverted layer l (incremented after the inversion, as a data dependency of its result).
With one rank (or ``distribute_inverses=False``) every layer is inverted locally and nothing is
communicated: ``distribute_inverses=True`` then changes no number (only the counter is added).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.parallel import grouped_sum_allreduces

__all__ = ["layout_cost", "layer_cost", "assign_inversions", "InverseSharing"]

# fusion ids of the inverse AllReduce: after any the factor AllReduce uses (its ids are 1 + group index)
_FUSION_BASE = 1 << 10


def layout_cost(layout: Optional[pc.BlockLayout], n: int = 0) -> int:
    """Inversion cost of one factor: ``sum_k w_k^3`` over its diagonal blocks; a diagonal factor
    (``layout`` None, size ``n``) costs ``n``."""
    if layout is None:
        return int(n)
    tail = layout.n - (layout.nblocks - 1) * layout.bs
    return (layout.nblocks - 1) * layout.bs ** 3 + tail ** 3


def layer_cost(slot) -> int:
    """Inversion cost of one layer (a ``LayerSlot``): cost of its A plus cost of its G."""
    a_n = int(slot.a_inv.shape[0]) if slot.a_layout is None else 0
    return layout_cost(slot.a_layout, a_n) + layout_cost(slot.g_layout)


def assign_inversions(costs: Sequence[int], num_ranks: int) -> Tuple[int, ...]:
    """Owner rank of every layer: greedy longest-processing-time over ``costs``.

    Layers are taken in decreasing cost (ties: lower index first) and each goes to the rank with
    the smallest total so far (ties: lower rank). Deterministic: the same ``costs`` and
    ``num_ranks`` give the same owners on every rank. Returns a tuple of ``len(costs)`` ranks.
    """
    num_ranks = int(num_ranks)
    if num_ranks < 1:
        raise ValueError(f"assign_inversions needs at least one rank, but got {num_ranks}.")
    owners = [0] * len(costs)
    loads = [0] * num_ranks
    for layer in sorted(range(len(costs)), key=lambda index: (-costs[index], index)):
        rank = min(range(num_ranks), key=lambda r: (loads[r], r))
        owners[layer] = rank
        loads[rank] += int(costs[layer])
    return tuple(owners)


class InverseSharing(nn.Cell):
    """Which layers this rank inverts, the inversion counter, and the sharing AllReduce.

    Args:
        slots (Sequence[LayerSlot]): the optimizer's per-layer slots (their layouts give the costs).
        split_indices (Optional[Sequence[int]]): fusion groups, as for the factors.
        distribute (bool): ``distribute_inverses``.
        ranks (int): the data-parallel group size (``ThorConfig.ranks``).

    Attributes: ``num_ranks`` (R, 1 unless distributing under data parallelism), ``rank``,
    ``owners`` (tuple: owner rank of each layer), ``owned`` (tuple of bool: this rank inverts layer
    l), ``is_distributed`` (R > 1), ``counts`` (bool) and, if ``distribute``, ``inversion_count``.

    Inputs of ``construct``: ``(new_a, new_g, after)``, tuples of per-layer contributions (the inverse
    on the owner, zeros elsewhere) and what the first share must wait for (the reduced G factors).
    Outputs: the shared inverses (the inputs themselves when R = 1).
    """

    def __init__(self, slots: Sequence, split_indices: Optional[Sequence[int]], distribute: bool, ranks: int):
        super().__init__()
        self.num_layers = len(slots)
        self.is_distributed = bool(distribute) and ranks > 1
        self.num_ranks = int(ranks) if self.is_distributed else 1
        self.rank = 0
        if self.is_distributed:
            from mindspore.communication import get_rank

            self.rank = int(get_rank())
        self.costs = tuple(layer_cost(slot) for slot in slots)
        self.owners = assign_inversions(self.costs, self.num_ranks)
        self.owned = tuple(owner == self.rank for owner in self.owners)
        self.counts = bool(distribute)
        if self.counts:
            self.inversion_count = Parameter(Tensor(np.zeros((self.num_layers,), np.int32)),
                                             name="inversion_count", requires_grad=False)
            self.one_hot = tuple(Tensor(np.eye(self.num_layers, dtype=np.int32)[i])
                                 for i in range(self.num_layers))
        if self.is_distributed:
            self.allreduces: List = grouped_sum_allreduces(self.num_layers, split_indices, _FUSION_BASE)

    def rank_loads(self) -> Tuple[int, ...]:
        """Total cost assigned to each rank."""
        loads = [0] * self.num_ranks
        for cost, owner in zip(self.costs, self.owners):
            loads[owner] += cost
        return tuple(loads)

    def count(self, index: int, inverse):
        """Record one inversion of layer ``index`` on this rank, after ``inverse`` is computed;
        returns ``inverse`` (a no-op without the counter)."""
        if not self.counts:
            return inverse
        done = ops.assign_add(self.inversion_count, ops.depend(self.one_hot[index], inverse))
        return ops.depend(inverse, done)

    def after(self, tensors, anchor):
        """``tensors`` (a tuple) with its first entry made to wait for ``anchor`` (anything, e.g. a
        tuple): when sharing across ranks, so the collectives keep one order on every rank (module
        docstring, "Order"); otherwise ``tensors`` unchanged."""
        if not self.is_distributed:
            return tensors
        return (ops.depend(tensors[0], anchor),) + tensors[1:]

    def construct(self, new_a, new_g, after):
        if not self.is_distributed:
            return new_a, new_g
        previous = ops.depend(ops.depend(after, new_a), new_g)  # all of this rank's inversions first
        out_a = ()
        out_g = ()
        for i in range(self.num_layers):
            shared_a = self.allreduces[i](ops.depend(new_a[i], previous))
            shared_g = self.allreduces[i](ops.depend(new_g[i], shared_a))
            previous = shared_g
            out_a += (shared_a,)
            out_g += (shared_g,)
        return out_a, out_g

