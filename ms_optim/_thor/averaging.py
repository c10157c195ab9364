"""MindSpore's data-parallel rule for ``factor_convention="gpu"``/``"ascend"``: average the inverses.

``ThorGpu`` and ``ThorAscend`` mean-all-reduce each layer's *inverses* of the ranks' local factors
(Ascend also its maxima a_max, g_max), not the factors; ``"kfc"`` all-reduces the factors and inverts
their mean (``ms_optim._thor.parallel``). On R > 1 ranks with gpu/ascend, a THOR step here is
:func:`refresh_averaged`: every rank inverts every (refreshed) layer from its own factors
(``slot.layer_inverses``), contributes ``device_rules.contribution`` (the inverses if it accepted
both, else zeros, and ``[ok, a_max, g_max]``), and ``InverseAveraging`` mean-all-reduces the three
(fusion groups of ``split_indices``); ``device_rules.averaged_inverses`` stores the means where every
rank accepted and keeps the stored inverses elsewhere, identically on every rank.

``trace_thresholds``: each rank's local factors differ, so the rule decides from the mean-all-reduced
traces ``[mean_r tr(A_r), mean_r tr(G_r)]`` (one more small all-reduce): the trace of the mean factor,
the decision ``"kfc"``'s factor averaging would take, identical on every rank. A layer it skips
contributes zeros with ok 0 on every rank and keeps its inverses.

``distribute_inverses=True`` is refused with these conventions (``factory.thor``): every rank must
invert every layer's own local factors, so there is no identical inversion left to share.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import nn, ops

from ms_optim._thor import device_rules as rules
from ms_optim._thor.parallel import FactorAllReduce, data_parallel_group_size
from ms_optim._thor.slot import layer_inverses
from ms_optim._thor.trace import decide_trace, factor_trace

__all__ = ["InverseAveraging", "refresh_averaged"]


class InverseAveraging(nn.Cell):
    """The mean all-reduces of the inverse-averaging rule; ``is_distributed`` is False (and nothing
    is built) for "kfc" or on a single rank."""

    def __init__(self, num_layers: int, split_indices, convention: str):
        super().__init__()
        self.is_distributed = rules.averages_inverses(convention) and data_parallel_group_size() > 1
        if self.is_distributed:
            self.reduce_a = FactorAllReduce(num_layers, split_indices)
            self.reduce_g = FactorAllReduce(num_layers, split_indices)
            self.reduce_stats = FactorAllReduce(num_layers, split_indices)
            self.reduce_traces = FactorAllReduce(num_layers, split_indices)

    def traces(self, pairs):
        """Mean over the ranks of per-layer ``[tr A, tr G]`` vectors."""
        return self.reduce_traces(pairs)

    def construct(self, a_parts, g_parts, stats):
        return self.reduce_a(a_parts), self.reduce_g(g_parts), self.reduce_stats(stats)


def refresh_averaged(averaging, slots, trace, a_factors, g_factors, lam):
    """A THOR step under inverse averaging (module docstring) from this rank's local factors (G
    already divided by the loss scale); returns the assignments of the stored inverses (and of the
    trace rule's state)."""
    num_layers = len(a_factors)
    done = ()
    refresh = (True,) * num_layers
    if trace is not None:
        pairs = ()
        for i in range(num_layers):
            pairs += (ops.stack((factor_trace(a_factors[i], slots[i].is_embedding),
                                 factor_trace(g_factors[i], False))),)
        pairs = averaging.traces(pairs)
        decisions = ()
        for i in range(num_layers):
            decision, bookkeeping = decide_trace(trace, i, pairs[i][0] * pairs[i][1])
            decisions += (decision,)
            done += bookkeeping
        refresh = decisions
    a_parts, g_parts, stats = (), (), ()
    for i in range(num_layers):
        slot = slots[i]
        if refresh[i]:
            part = rules.contribution(slot, *layer_inverses(slot, a_factors[i], g_factors[i], lam))
        else:
            part = (ops.zeros_like(slot.a_inv), ops.zeros_like(slot.g_inv), ops.zeros((3,), mstype.float32))
        a_parts += (part[0],)
        g_parts += (part[1],)
        stats += (part[2],)
    mean_a, mean_g, mean_stats = averaging(a_parts, g_parts, stats)
    for i in range(num_layers):
        a_inv, g_inv = rules.averaged_inverses(slots[i], mean_a[i], mean_g[i], mean_stats[i])
        done += (ops.assign(slots[i].a_inv, a_inv), ops.assign(slots[i].g_inv, g_inv))
    return done
