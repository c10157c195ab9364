r"""How a THOR step refreshes the inverses: one strategy, chosen when the optimizer is built.

Every strategy is a Cell with the same call, ``strategy(anchor, lam, factor_loss_scale) -> token``: on a THOR
step it reads every layer's stored factors (after the gradients ``anchor`` stands for: the backward pass
has written the factors by then), divides each G by ``factor_loss_scale**2``, inverts with damping
``lam = sqrt(damping[t])``, stores the accepted inverses in the slots (``slot.a_inv``/``slot.g_inv``) and
returns an int32 ``(1,)`` token that depends on every store. ``strategy.anchor(gradients)`` is what the
step hands to the THOR branch in place of the gradients.

=================  ============================================================  =========================
strategy           when                                                          module
=================  ============================================================  =========================
``BATCHED``        every layer inverted by the formula (no trace rule, no         ``batched.py``
                   device rule, no ``distribute_inverses``)
``PER_LAYER``      otherwise on one rank, or "kfc" on R > 1 ranks without         ``per_layer.py``
                   ``distribute_inverses``
``SHARED``         ``distribute_inverses`` on R > 1 ranks                         ``shared.py``
``AVERAGED``       "gpu"/"ascend" on R > 1 ranks (MindSpore's inverse averaging)  ``averaged.py``
=================  ============================================================  =========================

The trace rule (``trace_thresholds``) is a property of the strategy: the per-layer strategies decide
per layer with the :class:`~ms_optim._thor.inversion.trace.TraceSchedule` they hold (``trace``, None without
the rule); the batched one is never chosen with it. Every strategy holds ``sharing``
(:class:`~ms_optim._thor.inversion.owners.InverseSharing`: which rank inverts which layer, and the inversion
counter of ``distribute_inverses``) and ``trace``.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion.averaged import AveragedInversion
from ms_optim._thor.inversion.batched import GroupedInversion
from ms_optim._thor.inversion.device_rules import InverseRule, averages_inverses
from ms_optim._thor.inversion.per_layer import LayerwiseInversion
from ms_optim._thor.inversion.shared import SharedInversion
from ms_optim._thor.modes import Strategy

__all__ = ["choose_strategy", "build_inversion", "STRATEGIES"]

#: The strategy Cell of each :class:`~ms_optim._thor.modes.Strategy`.
STRATEGIES = {Strategy.BATCHED: GroupedInversion, Strategy.PER_LAYER: LayerwiseInversion,
              Strategy.SHARED: SharedInversion, Strategy.AVERAGED: AveragedInversion}


def choose_strategy(config: ThorConfig, rules: Sequence[InverseRule]) -> str:
    """The :class:`~ms_optim._thor.modes.Strategy` for ``config`` and the layers' inverse ``rules``."""
    if config.ranks > 1 and averages_inverses(config.factor_convention):
        return Strategy.AVERAGED
    if config.ranks > 1 and config.distribute_inverses:
        return Strategy.SHARED
    if (config.trace_thresholds is None and not config.distribute_inverses
            and all(rule.plain for rule in rules)):
        return Strategy.BATCHED
    return Strategy.PER_LAYER


def build_inversion(strategy: str, slots: nn.CellList, layers: Sequence, config: ThorConfig,
                    kernels: Optional[object]) -> nn.Cell:
    """The strategy Cell named ``strategy`` (:func:`choose_strategy`) over the built ``slots``; ``kernels``:
    THOR's fused CPU ops (``factor_kernels.FactorKernels``) or None."""
    return STRATEGIES[strategy](slots, layers, config, kernels)
