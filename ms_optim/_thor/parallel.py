"""Data-parallel reduction of THOR's Kronecker factors.

Interface used by the optimizer: ``FactorAllReduce(num_layers, split_indices, ranks=R)`` is a Cell whose
``construct(factors)`` takes a tuple of ``num_layers`` per-layer factor tensors (the optimizer calls
it once for the A factors and once for the G factors) and returns a tuple of the same shapes,
averaged over the data-parallel ranks:

    F_l <- (1/R) * sum_r F_l^(r)          (R = number of ranks)

Why the mean is the right reduction: with the per-device batch normalisation of the layers,
A = a^T a / B and G = B * d^T d where d = dL/ds for the mean loss over the local batch of B samples
(so d_i = g_i / B with g_i the per-sample output gradient, and G = (1/B) sum_i g_i g_i^T). Averaging
over R ranks of equal local batches gives (1/(R*B)) sum over all R*B samples of a_i a_i^T (resp.
g_i g_i^T): exactly the factors of one process that sees the concatenated batch, as the gradient
mean of ``gradients_mean=True`` is exactly that process's gradient.

Fusion: layers are split into consecutive groups at ``split_indices`` (MindSpore's meaning: each
index is the *last* layer of a group, so ``[26, 53]`` on 54 layers gives layers 0..26 and 27..53,
and ``[0]`` gives layer 0 alone and then all the others); the default ``None`` is one group. Every
group gets its own ``AllReduce`` primitive with a distinct ``fusion`` attribute, so the backend
fuses the reductions of a group into one communication.

Outside data-parallel training (stand-alone, or a group of one device) the Cell is the identity and
builds no communication ops.

``ordered=True`` sequences the reductions: reduction l starts after reduction l-1 has finished (a
data dependency). A collective backend matches collectives across ranks by the order they are
issued; ranks running the same graph issue them in the same order anyway, but when the graphs differ
between ranks (``distribute_inverses``: each rank inverts other layers) the schedule may not, so the
order must be written into the graph.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from mindspore import context, nn, ops
from mindspore.communication import get_group_size

__all__ = ["FactorAllReduce", "RankMean", "data_parallel_group_size", "fusion_groups", "sum_allreduce",
           "grouped_sum_allreduces"]

_DATA_PARALLEL_MODES = ("data_parallel", "hybrid_parallel")


def data_parallel_group_size() -> int:
    """Number of data-parallel ranks: 1 unless the parallel mode is data (or hybrid) parallel."""
    mode = context.get_auto_parallel_context("parallel_mode")
    if mode not in _DATA_PARALLEL_MODES:
        return 1
    try:
        return int(get_group_size())
    except (RuntimeError, ValueError):  # communication not initialised
        return 1


def fusion_groups(num_layers: int, split_indices: Optional[Sequence[int]] = None) -> List[int]:
    """Group index of every layer: layer l is in group #{s in split_indices : s < l}."""
    if split_indices is None:
        return [0] * num_layers
    splits = sorted(int(s) for s in split_indices)
    return [sum(1 for s in splits if s < layer) for layer in range(num_layers)]


def sum_allreduce(fusion: Optional[int] = None) -> ops.AllReduce:
    """THE builder of THOR's collectives: a summing ``AllReduce`` over the data-parallel group, with the
    ``fusion`` attribute when given (equal ids are fused into one transfer; 0 means not fused)."""
    op = ops.AllReduce(ops.ReduceOp.SUM)
    if fusion is not None:
        op.add_prim_attr("fusion", int(fusion))
    return op


class RankMean(nn.Cell):
    """``values`` (a Tensor) averaged over ``ranks`` data-parallel ranks with one summing all-reduce; the
    identity on one rank (no collective is built). The adaptive rules' scalars go through it, so that every
    rank decides alike."""

    def __init__(self, ranks: int):
        super().__init__(auto_prefix=False)
        self.ranks = int(ranks)
        if self.ranks > 1:
            self.allreduce = sum_allreduce()
            self.scale = 1.0 / self.ranks

    def construct(self, values):
        if self.ranks > 1:
            return self.allreduce(values) * self.scale
        return values


def grouped_sum_allreduces(num_layers: int, split_indices: Optional[Sequence[int]], fusion_base: int) -> List:
    """One :func:`sum_allreduce` per layer, shared within each fusion group of ``split_indices``
    (:func:`fusion_groups`), the group ``g`` fused under id ``fusion_base + g``."""
    groups = fusion_groups(num_layers, split_indices)
    per_group = {g: sum_allreduce(fusion_base + g) for g in sorted(set(groups))}
    return [per_group[g] for g in groups]


class FactorAllReduce(nn.Cell):
    """Mean all-reduce of a tuple of per-layer factor tensors, fused in groups split at ``split_indices``.

    Args:
        num_layers (int): number of THOR layers (length of the tuples passed to ``construct``).
        split_indices (Optional[Sequence[int]]): last layer index of each fusion group; None: one group.
        ordered (bool): issue the reductions strictly in layer order (see the module docstring).
        ranks (Optional[int]): the data-parallel group size, as ``thor()``'s config read it; None reads
            :func:`data_parallel_group_size` (for a reduction built outside ``thor()``).

    Inputs:
        factors (tuple[Tensor]): one factor per layer.

    Outputs:
        tuple[Tensor]: the factors averaged over the data-parallel ranks (unchanged on one device).
    """

    def __init__(self, num_layers: int, split_indices: Optional[Sequence[int]] = None, ordered: bool = False,
                 ranks: Optional[int] = None):
        super().__init__()
        self.num_layers = int(num_layers)
        self.split_indices = list(split_indices) if split_indices is not None else None
        self.group_size = data_parallel_group_size() if ranks is None else int(ranks)
        self.is_distributed = self.group_size > 1
        self.ordered = bool(ordered)
        self.groups = fusion_groups(self.num_layers, self.split_indices)
        if self.is_distributed:
            # fusion id 0: not fused
            self.allreduces = grouped_sum_allreduces(self.num_layers, self.split_indices, 1)
            self.scale = 1.0 / self.group_size

    def construct(self, factors):
        if not self.is_distributed:
            return factors
        out = ()
        for i in range(self.num_layers):
            factor = factors[i]
            if self.ordered and i > 0:
                factor = ops.depend(factor, out[i - 1])
            out = out + (self.allreduces[i](factor) * self.scale,)
        return out
