"""The ``SHARED`` strategy: ``distribute_inverses`` on R > 1 ranks, each layer inverted by its owner only.

The factors are mean-all-reduced in layer order (A then G), so every rank holds the same factors and
takes the same trace decisions; each rank inverts the (refreshed) layers it owns
(``sharing.InverseSharing.owned``), contributes zeros for the others (a kept inverse is contributed as
stored), and the sharing all-reduce sums the contributions: every rank stores the owner's inverse.
Why and in which order the collectives are issued: ``ms_optim._thor.inversion.owners``.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion.per_layer import LayerInversion
from ms_optim._thor.inversion.slot import invert_layer
from ms_optim._thor.inversion.trace import decide
from ms_optim._thor.modes import Strategy

__all__ = ["SharedInversion"]


class SharedInversion(LayerInversion):
    """``distribute_inverses`` across R > 1 ranks (module docstring); the call of every strategy."""

    strategy = Strategy.SHARED

    def __init__(self, slots: nn.CellList, layers: Sequence, config: ThorConfig,
                 kernels: Optional[object] = None):
        super().__init__(slots, layers, config, kernels)
        self.reduce_a, self.reduce_g = self._reductions(config, 2, ordered=True)

    def construct(self, gradients, lam, factor_loss_scale):
        a_factors, g_factors = self.read_factors(gradients, factor_loss_scale)
        a_factors = self.reduce_a(self.sharing.after(a_factors, gradients))
        g_factors = self.reduce_g(self.sharing.after(g_factors, a_factors))
        # No inversion may start before the last factor reduction: a rank inverting between two
        # collectives would hold the other ranks at the next one, and the ranks would invert in turn.
        last_reduced = g_factors[self.num_layers - 1]
        a_factors = tuple(ops.depend(a, last_reduced) for a in a_factors)
        g_factors = tuple(ops.depend(g, last_reduced) for g in g_factors)
        new_a, new_g = (), ()
        for i in range(self.num_layers):
            slot = self.slots[i]
            refresh = True
            if self.trace is not None:
                refresh, decided = decide(self.trace, i, a_factors[i], g_factors[i], slot.a_diagonal)
                gradients = F.depend(gradients, decided)
            if not self.sharing.owned[i]:
                a_inv, g_inv = ops.zeros_like(slot.a_inv), ops.zeros_like(slot.g_inv)
            elif refresh:
                a_inv, g_inv = invert_layer(slot, a_factors[i], g_factors[i], lam)
                a_inv = self.sharing.count(i, a_inv)
            else:
                a_inv, g_inv = slot.a_inv * 1, slot.g_inv * 1
            new_a += (a_inv,)
            new_g += (g_inv,)
        new_a, new_g = self.sharing(new_a, new_g, F.depend(g_factors, gradients))
        done = ()
        for i in range(self.num_layers):
            done += (ops.assign(self.slots[i].a_inv, new_a[i]), ops.assign(self.slots[i].g_inv, new_g[i]))
        return F.depend(self.zero_step, done)
