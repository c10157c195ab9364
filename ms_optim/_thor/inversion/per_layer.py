"""THOR's layer-by-layer inversion: the ``PER_LAYER`` strategy and the base of the strategies that decide per
layer.

A THOR step under ``PER_LAYER`` (``inversion.choose_strategy``: MindSpore's device rules, the trace rule, or
the inversion counter of ``distribute_inverses`` on one rank) reads every layer's factors after its weight's
gradient, mean-all-reduces them over data-parallel ranks ("kfc"; nothing on one rank), and inverts each
layer with ``slot.invert_layer``; with ``trace_thresholds`` only the layers the trace rule selects
(``trace.decide``), each under an ``if`` on its decision.
"""
from __future__ import annotations

from typing import Optional, Sequence

import mindspore.common.dtype as mstype
from mindspore import ParameterTuple, Tensor, nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion.owners import InverseSharing
from ms_optim._thor.inversion.slot import invert_layer
from ms_optim._thor.inversion.trace import TraceSchedule, decide
from ms_optim._thor.modes import Strategy
from ms_optim._thor.parallel import FactorAllReduce

__all__ = ["LayerInversion", "LayerwiseInversion"]


class LayerInversion(nn.Cell):
    """What the strategies that invert layer by layer share: the slots, the factor Parameters, the
    trace rule, the sharing record and the anchored factor read.

    Args:
        slots (nn.CellList): the optimizer's ``LayerSlot``\\ s, built with their layer-by-layer constants.
        layers (Sequence[ThorLayer]): the THOR layers, in the slots' order.
        config (ThorConfig): the validated settings.
        kernels: THOR's fused CPU ops or None (read by the slots, not here).
    """

    strategy = ""

    def __init__(self, slots: nn.CellList, layers: Sequence, config: ThorConfig,
                 kernels: Optional[object] = None):
        super().__init__(auto_prefix=False)  # the trace rule's and the counter's Parameters keep their names
        self.slots = slots
        self.num_layers = len(layers)
        self.matrix_a_cov = ParameterTuple([layer.matrix_a_cov for layer in layers])
        self.matrix_g_cov = ParameterTuple([layer.matrix_g_cov for layer in layers])
        thresholds = config.trace_thresholds
        self.trace = None if thresholds is None else TraceSchedule(self.num_layers, thresholds)
        self.sharing = InverseSharing(slots, config.split_indices, config.distribute_inverses, config.ranks)
        self.zero_step = Tensor([0], mstype.int32)

    def _reductions(self, config: ThorConfig, count: int, ordered: bool = False) -> tuple:
        """``count`` mean all-reduces of per-layer tuples over the data-parallel ranks (identities on one
        rank), fused in the ``split_indices`` groups; ``ordered``: issued in layer order
        (``parallel.FactorAllReduce``)."""
        return tuple(FactorAllReduce(self.num_layers, config.split_indices, ordered=ordered,
                                     ranks=config.ranks) for _ in range(count))

    def anchor(self, gradients):
        """What the THOR branch reads the factors after: every layer waits for its own weight's gradient."""
        return gradients

    def read_factors(self, gradients, factor_loss_scale):
        """Every layer's ``(A, G / factor_loss_scale**2)``, each read after its weight's gradient."""
        g_unscale = ops.reciprocal(ops.square(factor_loss_scale))
        a_factors, g_factors = (), ()
        for i in range(self.num_layers):
            anchor = gradients[self.slots[i].grad_index]
            a_factors += (ops.depend(self.matrix_a_cov[i], anchor),)
            g_factors += (ops.depend(self.matrix_g_cov[i], anchor) * g_unscale,)
        return a_factors, g_factors


class LayerwiseInversion(LayerInversion):
    """``PER_LAYER``: factors mean-all-reduced ("kfc"; identity on one rank), then every layer inverted by
    ``slot.invert_layer`` (MindSpore's device rules included), or with the trace rule only the layers it
    selects."""

    strategy = Strategy.PER_LAYER

    def __init__(self, slots: nn.CellList, layers: Sequence, config: ThorConfig,
                 kernels: Optional[object] = None):
        super().__init__(slots, layers, config, kernels)
        self.reduce_a, self.reduce_g = self._reductions(config, 2)

    def construct(self, gradients, lam, factor_loss_scale):
        a_factors, g_factors = self.read_factors(gradients, factor_loss_scale)
        a_factors = self.reduce_a(a_factors)
        g_factors = self.reduce_g(g_factors)
        done = ()
        for i in range(self.num_layers):
            if self.trace is None:
                done += self._invert_into(i, a_factors[i], g_factors[i], lam)
            else:
                refresh, decided = decide(self.trace, i, a_factors[i], g_factors[i],
                                          self.slots[i].a_diagonal)
                inverted = self.zero_step
                if refresh:
                    inverted = F.depend(self.zero_step, self._invert_into(i, a_factors[i], g_factors[i], lam))
                done += (decided, inverted)
        return F.depend(self.zero_step, done)

    def _invert_into(self, i, a_factor, g_factor, lam):
        """Invert layer ``i`` (counted when ``sharing`` counts) and store; returns the two assignments."""
        slot = self.slots[i]
        a_inv, g_inv = invert_layer(slot, a_factor, g_factor, lam)
        a_inv = self.sharing.count(i, a_inv)
        return ops.assign(slot.a_inv, a_inv), ops.assign(slot.g_inv, g_inv)
