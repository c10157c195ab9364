"""The ``AVERAGED`` strategy, MindSpore's data-parallel rule for ``factor_convention="gpu"``/``"ascend"``.

``ThorGpu`` and ``ThorAscend`` mean-all-reduce each layer's *inverses* of the ranks' local factors
(Ascend also its maxima a_max, g_max), not the factors; ``"kfc"`` all-reduces the factors and inverts
their mean (``ms_optim._thor.parallel``). On R > 1 ranks with gpu/ascend, a THOR step here is
:class:`AveragedInversion`: every rank inverts every (refreshed) layer from its own factors
(``slot.layer_inverses``), contributes ``device_rules.contribution`` (the inverses if it accepted
both, else zeros, and ``[ok, a_max, g_max]``), and ``InverseAveraging`` mean-all-reduces the three
(fusion groups of ``split_indices``); ``device_rules.averaged_inverses`` stores the means where every
rank accepted and keeps the stored inverses elsewhere, identically on every rank.

``trace_thresholds``: each rank's local factors differ, so the rule decides from the mean-all-reduced
traces ``[mean_r tr(A_r), mean_r tr(G_r)]`` (one more small all-reduce): the trace of the mean factor,
the decision ``"kfc"``'s factor averaging would take, identical on every rank. A layer it skips
contributes zeros with ok 0 on every rank and keeps its inverses.

``distribute_inverses=True`` is refused with these conventions (``config.validate_thor``): every rank must
invert every layer's own local factors, so there is no identical inversion left to share.
"""
from __future__ import annotations

from typing import Optional, Sequence

import mindspore.common.dtype as mstype
from mindspore import nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion import device_rules as rules
from ms_optim._thor.inversion.per_layer import LayerInversion
from ms_optim._thor.inversion.slot import layer_inverses
from ms_optim._thor.inversion.trace import decide_trace, factor_trace
from ms_optim._thor.modes import Strategy

__all__ = ["AveragedInversion"]


class AveragedInversion(LayerInversion):
    """The ``AVERAGED`` strategy (module docstring): "gpu"/"ascend" on R > 1 ranks."""

    strategy = Strategy.AVERAGED

    def __init__(self, slots: nn.CellList, layers: Sequence, config: ThorConfig,
                 kernels: Optional[object] = None):
        super().__init__(slots, layers, config, kernels)
        self.reduce_a, self.reduce_g, self.reduce_stats, self.reduce_traces = self._reductions(config, 4)

    def _decisions(self, a_factors, g_factors):
        """The trace rule's per-layer decisions from the ranks' mean traces, and its bookkeeping."""
        pairs = ()
        for i in range(self.num_layers):
            pairs += (ops.stack((factor_trace(a_factors[i], self.slots[i].a_diagonal),
                                 factor_trace(g_factors[i], False))),)
        pairs = self.reduce_traces(pairs)
        decisions, done = (), ()
        for i in range(self.num_layers):
            decision, bookkeeping = decide_trace(self.trace, i, pairs[i][0] * pairs[i][1])
            decisions += (decision,)
            done += bookkeeping
        return decisions, done

    def construct(self, gradients, lam, factor_loss_scale):
        a_factors, g_factors = self.read_factors(gradients, factor_loss_scale)
        done = ()
        refresh = (True,) * self.num_layers
        if self.trace is not None:
            refresh, done = self._decisions(a_factors, g_factors)
        a_parts, g_parts, stats = (), (), ()
        for i in range(self.num_layers):
            slot = self.slots[i]
            if refresh[i]:
                part = rules.contribution(slot, *layer_inverses(slot, a_factors[i], g_factors[i], lam))
            else:
                part = (ops.zeros_like(slot.a_inv), ops.zeros_like(slot.g_inv),
                        ops.zeros((3,), mstype.float32))
            a_parts += (part[0],)
            g_parts += (part[1],)
            stats += (part[2],)
        mean_a, mean_g, mean_stats = self.reduce_a(a_parts), self.reduce_g(g_parts), self.reduce_stats(stats)
        for i in range(self.num_layers):
            a_inv, g_inv = rules.averaged_inverses(self.slots[i], mean_a[i], mean_g[i], mean_stats[i])
            done += (ops.assign(self.slots[i].a_inv, a_inv), ops.assign(self.slots[i].g_inv, g_inv))
        return F.depend(self.zero_step, done)
