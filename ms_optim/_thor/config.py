"""``ThorConfig``: what ``thor()`` was given, checked (``validate.py``), in the types the optimizer stores.

A leaf record: it imports nothing of THOR's but the names of the modes, so every part of THOR can read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from mindspore import Tensor

from ms_optim._thor.modes import Inverse, Mode

__all__ = ["ThorConfig", "DEFAULT_ADAPT_EVERY", "DEFAULT_DAMPING_BOUNDS"]

#: steps between two damping adaptations (Martens & Grosse's T1, kfac-jax's default interval)
DEFAULT_ADAPT_EVERY = 5
#: the range the adaptive damping is clipped to
DEFAULT_DAMPING_BOUNDS = (1e-8, 1e4)


@dataclass(frozen=True, eq=False)
class ThorConfig:
    """``thor()``'s arguments after validation.

    The modes (each a :class:`~ms_optim._thor.modes.Mode`) say where a step's numbers come from:
    ``lr_mode`` (``SCHEDULED``: the ``learning_rate`` Tensor; ``ADAPTIVE``: the quadratic model's step size),
    ``damping_mode`` (``SCHEDULED``: the ``damping`` Tensor; ``ADAPTIVE``: the Levenberg-Marquardt rule, with
    ``adapt_every`` and ``damping_bounds``) and ``momentum_mode`` (``SCHEDULED``: the number ``momentum``;
    ``ADAPTIVE``: solved with the step size). A schedule a mode does not read is a 0-D zero Tensor, the
    ``momentum`` of ``momentum_mode=ADAPTIVE`` is 0.0, and ``adapt_every``/``damping_bounds`` hold their
    defaults when the damping is scheduled.

    ``split_indices`` is the fusion split as the all-reduces use it (None: one group); ``factor_convention``
    is the concrete convention (``"auto"`` resolved); ``ranks`` is the data-parallel group size (1 on one
    device); ``kl_clip`` is None (off) or the bound; ``trace_thresholds`` is None (off) or ``(omega_1,
    omega_2)``.
    """

    learning_rate: Tensor
    damping: Tensor
    momentum: float
    lr_mode: str
    damping_mode: str
    momentum_mode: str
    weight_decay: float
    loss_scale: float
    batch_size: int
    use_nesterov: bool
    decay_filter: Callable
    split_indices: Optional[Tuple[int, ...]]
    enable_clip_grad: bool
    frequency: int
    inverse: str
    block_size: int
    kl_clip: Optional[float]
    factor_convention: str
    distribute_inverses: bool
    trace_thresholds: Optional[Tuple[float, float]]
    ranks: int
    adapt_every: int = DEFAULT_ADAPT_EVERY
    damping_bounds: Tuple[float, float] = DEFAULT_DAMPING_BOUNDS

    @property
    def factor_block_size(self) -> Optional[int]:
        """The block width the factors are stored and inverted in (None: whole matrices)."""
        return self.block_size if self.inverse == Inverse.BLOCKED else None

    @property
    def schedule_limits(self) -> Tuple[Tuple[str, int], ...]:
        """``(argument, length)`` of each per-step (1-D) schedule a mode reads: the step must stay inside."""
        schedules = (("learning_rate", self.learning_rate, self.lr_mode),
                     ("damping", self.damping, self.damping_mode))
        return tuple((name, int(value.shape[0])) for name, value, mode in schedules
                     if mode == Mode.SCHEDULED and value.ndim == 1)

    @property
    def measures_loss(self) -> bool:
        """Whether a step needs the loss after it on its own batch (an adaptive learning rate or damping): the
        training cell's extra forward pass."""
        return Mode.ADAPTIVE in (self.lr_mode, self.damping_mode)
