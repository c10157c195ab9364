"""Per-step learning-rate and damping schedules for THOR, as MindSpore's model zoo uses them.

Both generators take the model zoo's arguments (``official/cv/ResNet/src/lr_generator.py`` in
mindspore-ai/models), so a ported training script keeps its calls, and return the schedule of every
step from ``global_step`` on, as a float32 NumPy array (or a ``mindspore.Tensor`` with
``as_tensor=True``) ready for ``thor(net, Tensor(lr), Tensor(damping), ...)``.

For step ``s`` (0-based), ``epoch = (s + 1) / steps_per_epoch``:

* learning rate: ``lr = lr_init * (1 - epoch / total_epochs) ** decay``, halved once
  ``epoch >= decay_epochs`` and halved again once ``epoch >= decay_epochs + 1``
  (``total_epochs`` is the model zoo's ``lr_end_epoch``: the rate reaches 0 at its last step);
* damping: ``damping = damping_init * decay_rate ** (epoch / 10)``.

Values are computed in float64 and rounded once to float32.
"""
from __future__ import annotations

from typing import Union

import numpy as np
from mindspore import Tensor

from ms_optim._validation import check_int, check_non_negative, check_number, check_positive, check_range

__all__ = ["get_thor_lr", "get_thor_damping"]


def _epochs(global_step: int, total_epochs: int, steps_per_epoch: int, fn: str) -> np.ndarray:
    check_int("global_step", global_step, fn)
    check_int("total_epochs", total_epochs, fn)
    check_int("steps_per_epoch", steps_per_epoch, fn)
    check_positive("total_epochs", total_epochs, fn)
    check_positive("steps_per_epoch", steps_per_epoch, fn)
    total_steps = total_epochs * steps_per_epoch
    check_range("global_step", global_step, 0, total_steps, high_inclusive=False, cls_name=fn)
    steps = np.arange(global_step, total_steps, dtype=np.float64)
    return (steps + 1.0) / steps_per_epoch


def _finish(values: np.ndarray, as_tensor: bool):
    values = values.astype(np.float32)
    if as_tensor:
        return Tensor(values)
    return values


def get_thor_lr(global_step: int, lr_init: float, decay: float, total_epochs: int, steps_per_epoch: int,
                decay_epochs: Union[int, float] = 100, *, as_tensor: bool = False):
    """THOR's polynomial learning-rate schedule, one value per step from ``global_step`` on.

    lr[s] = lr_init * (1 - e/total_epochs)**decay * 0.5**[e >= decay_epochs] * 0.5**[e >= decay_epochs+1],
    with e = (s + 1) / steps_per_epoch, for s = global_step, ..., total_epochs*steps_per_epoch - 1.

    Args:
        global_step (int): first step returned (0 for a fresh run; the resumed step otherwise).
        lr_init (float): initial learning rate (>= 0).
        decay (float): polynomial power (>= 0).
        total_epochs (int): epochs of the schedule (the model zoo's ``lr_end_epoch``), > 0.
        steps_per_epoch (int): steps per epoch, > 0.
        decay_epochs (Union[int, float]): epoch at which the rate is halved (and again one epoch
            later). Default: 100.
        as_tensor (bool): return a float32 ``mindspore.Tensor`` instead of a NumPy array.

    Returns:
        float32 array (or Tensor) of ``total_epochs*steps_per_epoch - global_step`` values.

    Raises:
        TypeError: an argument of the wrong type. ValueError: a value outside its range.
    """
    fn = "get_thor_lr"
    check_number("lr_init", lr_init, fn)
    check_number("decay", decay, fn)
    check_number("decay_epochs", decay_epochs, fn)
    check_non_negative("lr_init", lr_init, fn)
    check_non_negative("decay", decay, fn)
    epoch = _epochs(global_step, total_epochs, steps_per_epoch, fn)
    base = np.clip(1.0 - epoch / total_epochs, 0.0, None)
    lr = float(lr_init) * base ** float(decay)
    lr = np.where(epoch >= decay_epochs, lr * 0.5, lr)
    lr = np.where(epoch >= decay_epochs + 1, lr * 0.5, lr)
    return _finish(lr, as_tensor)


def get_thor_damping(global_step: int, damping_init: float, decay_rate: float, total_epochs: int,
                     steps_per_epoch: int, *, as_tensor: bool = False):
    """THOR's exponential damping schedule, one value per step from ``global_step`` on.

    damping[s] = damping_init * decay_rate ** (e / 10), e = (s + 1) / steps_per_epoch.

    Args:
        global_step (int): first step returned.
        damping_init (float): initial damping (>= 0).
        decay_rate (float): decay per 10 epochs (> 0).
        total_epochs (int): epochs of the schedule, > 0.
        steps_per_epoch (int): steps per epoch, > 0.
        as_tensor (bool): return a float32 ``mindspore.Tensor`` instead of a NumPy array.

    Returns:
        float32 array (or Tensor) of ``total_epochs*steps_per_epoch - global_step`` values.

    Raises:
        TypeError: an argument of the wrong type. ValueError: a value outside its range.
    """
    fn = "get_thor_damping"
    check_number("damping_init", damping_init, fn)
    check_number("decay_rate", decay_rate, fn)
    check_non_negative("damping_init", damping_init, fn)
    check_positive("decay_rate", decay_rate, fn)
    epoch = _epochs(global_step, total_epochs, steps_per_epoch, fn)
    damping = float(damping_init) * float(decay_rate) ** (epoch / 10.0)
    return _finish(damping, as_tensor)
