r"""THOR's damping rules: where a step's damping comes from, chosen when the optimizer is built.

Two rules, one interface (the optimizer's step calls them alike and tests no flag):

* :class:`ScheduledDamping` (a damping Tensor, MindSpore's THOR): ``d = damping[t]`` (a 0-D Tensor: the same
  every step); inverses refreshed on THOR steps only; nothing after the update.
* :class:`~ms_optim._thor.adaptive.AdaptiveDamping` (``damping="adaptive"``): the Levenberg-Marquardt rule.

The interface: ``rule(step, anchor, factor_loss_scale)`` -> the damping ``d`` of step ``step`` (float32
scalar; ``anchor`` orders reads of the factors after the backward pass); ``rule.refresh(thor_step, d)`` ->
whether this step inverts; ``rule.inversion_scale(thor_step, factor_loss_scale, d)`` -> the loss scale the
stored G is divided by (squared), called inside the inversion branch; ``rule.after_update(success, step,
gradients, lr, moments)`` -> ``success``, after the update; ``rule.needs_probe``: whether the training cell
must run the extra forward pass (``probe.py``).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn, ops

from ms_optim._thor.adaptive import AdaptiveDamping
from ms_optim._thor.config import ThorConfig

__all__ = ["ScheduledDamping", "build_damping_rule"]


class ScheduledDamping(nn.Cell):
    """``d = damping[t]``: the damping Tensor as ``thor()`` was given it (MindSpore's THOR).

    ``damping`` (float32 1-D Tensor; a 0-D one as one element), ``steps`` (its length, None for a 0-D one:
    the optimizer's end-of-schedule check reads it), ``is_scalar``.
    """

    needs_probe = False

    def __init__(self, damping: Tensor):
        super().__init__(auto_prefix=False)
        self.damping = Tensor(damping.asnumpy().astype(np.float32).reshape(-1))
        self.steps = int(damping.shape[0]) if damping.ndim == 1 else None
        self.is_scalar = damping.ndim == 0

    def construct(self, step, anchor, factor_loss_scale):
        """``damping[step]``."""
        if self.is_scalar:
            return ops.reshape(self.damping, ())
        return ops.reshape(ops.gather(self.damping, step, 0), ())

    def refresh(self, thor_step, damping):
        """Invert on THOR steps only."""
        return thor_step

    def inversion_scale(self, thor_step, factor_loss_scale, damping):
        """The loss scale of this step's backward pass (the one that stored the factors)."""
        return factor_loss_scale

    def after_update(self, success, step, gradients, lr, moments):
        """Nothing."""
        return success


def build_damping_rule(config: ThorConfig, layers: Sequence, treatments: Tuple, batch_size: float) -> nn.Cell:
    """The rule for ``config``: :class:`ScheduledDamping` for a damping Tensor, else ``AdaptiveDamping``."""
    if config.adaptive_damping:
        return AdaptiveDamping(config, layers, treatments, batch_size)
    return ScheduledDamping(config.damping)
