"""The loss-scale checks: a loss scale that cannot train is refused, when it is given and while training.

A loss scale ``s`` seeds the backward pass (gradients times ``s``), and the gradients are divided by ``s``
before the optimizer. With ``s`` NaN, infinite or 0 every gradient is non-finite, so every step counts
as an overflow and is skipped: the parameters never move and nothing says why. A negative ``s`` or a
bool/integer Tensor is a mistake of the same family. MindSpore accepts all of these; ms_optim refuses
them with an error naming the argument and the value:

* :func:`check_scale_sense`: ``TrainOneStepWithLossScaleCell(network, optimizer, scale_sense)`` and its
  ``set_sense_scale``. ``scale_sense`` is a floating-point Tensor of shape () or (1,) holding a finite
  value > 0, or a loss-scale *update cell*: a Cell with ``get_loss_scale()`` (the initial scale, a finite
  number > 0) whose ``construct(loss_scale, overflow)`` updates ``loss_scale`` in place and returns
  ``overflow``: MindSpore's ``DynamicLossScaleUpdateCell`` (whose ``scale_factor`` must also be finite
  and > 0) and ``FixedLossScaleUpdateCell``, or any Cell providing that interface.
* :func:`check_loss_scale_manager`: the ``loss_scale_manager`` of ``Model`` (through
  ``ms_optim.amp.build_train_network``, which ``Model`` calls under ``ms_optim.use()``) and of
  ``ModelThor``: one function, so both give the same error for the same manager.
* :func:`check_loss_scale_at_step`: inside the training step, before anything of the step runs: a
  dynamic manager's updates can still drive the scale to infinity (a long run without overflow
  multiplies it by ``scale_factor`` every ``scale_window`` steps) or to 0 (a ``scale_factor`` below 1).
  The run stops with a ``ValueError`` naming the scale and the step; the step does not run, so the
  parameters are those after the previous step. Eager and compiled alike (GRAPH_MODE compiles the
  ``raise`` under a tensor condition into a runtime check), at the cost of a few scalar ops per step.
"""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Optional

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import DynamicLossScaleManager, FixedLossScaleManager

from ms_optim._validation import describe

__all__ = ["check_scale_sense", "check_loss_scale_manager", "check_loss_scale_at_step"]

_CELL = "TrainOneStepWithLossScaleCell"
_WANTED = ("a floating-point Tensor or a loss-scale update cell (a Cell with get_loss_scale() and "
           "construct(loss_scale, overflow), such as DynamicLossScaleUpdateCell or FixedLossScaleUpdateCell)")
# the argument of MindSpore's managers that get_loss_scale() returns (named in the message)
_MANAGER_SCALE_ARGUMENT = ((FixedLossScaleManager, "loss_scale"),
                           (DynamicLossScaleManager, "init_loss_scale"))


def _item(tensor: Tensor) -> Any:
    """The value of a one-element Tensor as a Python number (bfloat16 read through float32)."""
    if tensor.dtype == mstype.bfloat16:
        tensor = tensor.astype(mstype.float32)
    return tensor.asnumpy().reshape(()).item()


def _as_number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a real number (Python, NumPy, or a one-element floating-point Tensor);
    None for anything else, bool and integer Tensors included."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Tensor) and value.dtype in mstype.float_type and value.size == 1:
        return float(_item(value))
    return None


def _usable(value: float) -> bool:
    """A loss scale that can train: finite and > 0 (NaN fails both)."""
    return math.isfinite(value) and value > 0


def _check_tensor(scale: Tensor, owner: str) -> None:
    if tuple(scale.shape) not in ((), (1,)):
        return  # MindSpore's own ValueError names the shape
    shown = _item(scale)
    if scale.dtype not in mstype.float_type:
        raise TypeError(f"For '{owner}', the argument 'scale_sense' must be {_WANTED}, but got a Tensor of "
                        f"dtype {scale.dtype}: {shown!r}.")
    if not _usable(float(shown)):
        raise ValueError(f"For '{owner}', the argument 'scale_sense' must be a finite loss scale > 0, but "
                         f"got {shown!r} (Tensor of dtype {scale.dtype}, shape {tuple(scale.shape)}).")


def _check_update_cell(cell: nn.Cell, owner: str) -> None:
    getter = getattr(cell, "get_loss_scale", None)
    if not callable(getter):
        raise TypeError(f"For '{owner}', the argument 'scale_sense' must be {_WANTED}, but got "
                        f"{describe(cell)}: it has no get_loss_scale().")
    try:
        inspect.signature(cell.construct).bind(None, None)
    except TypeError:
        raise TypeError(f"For '{owner}', the argument 'scale_sense' must be {_WANTED}, but got "
                        f"{describe(cell)}: its construct cannot be called with "
                        f"(loss_scale, overflow).") from None
    except ValueError:  # no signature to read (a builtin): leave it to the first step
        pass
    subject = f"For '{owner}', the argument 'scale_sense' ({type(cell).__name__})"
    _refuse_unless_usable(getter(), subject, "give a number from get_loss_scale()",
                          "give a finite loss scale > 0 from get_loss_scale()")
    if isinstance(cell, nn.DynamicLossScaleUpdateCell):
        factor = _as_number(cell.scale_factor)
        if factor is None or not _usable(factor):
            raise ValueError(f"{subject} must have a finite scale_factor > 0, but got {factor!r}.")


def check_scale_sense(scale_sense: Any, owner: str = _CELL) -> None:
    """Refuse a ``scale_sense`` that cannot train (module docstring); ``owner`` is the class in the message.

    Raises:
        TypeError: not a Tensor or a Cell; a bool or integer Tensor; a Cell without ``get_loss_scale()`` or
            whose ``construct`` does not take ``(loss_scale, overflow)``; a ``get_loss_scale()`` that is not a
            number.
        ValueError: a Tensor or an initial scale that is NaN, infinite or <= 0; a
            ``DynamicLossScaleUpdateCell`` whose ``scale_factor`` is NaN, infinite or <= 0. A Tensor of
            another shape than () or (1,) is left to MindSpore's own ValueError.
    """
    if isinstance(scale_sense, nn.Cell):
        _check_update_cell(scale_sense, owner)
    elif isinstance(scale_sense, Tensor):
        _check_tensor(scale_sense, owner)
    else:
        raise TypeError(f"For '{owner}', the argument 'scale_sense' must be {_WANTED}, but got "
                        f"{describe(scale_sense)}.")


def _refuse_unless_usable(value: Any, subject: str, number: str, usable: str) -> None:
    """TypeError ``"<subject> must <number>, but got ..."`` unless ``value`` is a number, ValueError
    ``"<subject> must <usable>, ..."`` unless it is finite and > 0."""
    as_number = _as_number(value)
    if as_number is None:
        raise TypeError(f"{subject} must {number}, but got {describe(value)}.")
    if not _usable(as_number):
        raise ValueError(f"{subject} must {usable}, but got {value!r}.")


def _refuse_manager(manager: Any, argument: str, value: Any) -> None:
    _refuse_unless_usable(value, f"The argument 'loss_scale_manager' ({type(manager).__name__})",
                          f"have a number as '{argument}'", f"have a finite '{argument}' > 0")


def check_loss_scale_manager(manager: Any) -> None:
    """Refuse a loss-scale manager whose scale cannot train, before anything is built (None passes).

    The scale is ``manager.get_loss_scale()`` (named as the manager's argument: ``loss_scale`` for
    ``FixedLossScaleManager``, ``init_loss_scale`` for ``DynamicLossScaleManager``); a dynamic manager's
    ``scale_factor`` is checked too. MindSpore's managers refuse a scale below 1 themselves, but take NaN
    and infinity.

    Raises:
        TypeError: the scale is not a number.
        ValueError: the scale, or a ``DynamicLossScaleManager``'s ``scale_factor``, is NaN, infinite or <= 0.
    """
    if manager is None:
        return
    getter = getattr(manager, "get_loss_scale", None)
    if callable(getter):
        argument = next((name for kind, name in _MANAGER_SCALE_ARGUMENT if isinstance(manager, kind)),
                        "get_loss_scale()")
        _refuse_manager(manager, argument, getter())
    if isinstance(manager, DynamicLossScaleManager):
        _refuse_manager(manager, "scale_factor", getattr(manager, "scale_factor", None))


def check_loss_scale_at_step(scale: Tensor, step: Tensor, owner: str = _CELL) -> Tensor:
    """Stop training when the loss scale about to be used is not finite or not > 0.

    ``scale``: the scale this step would use (shape () or (1,)); ``step``: this step's 1-based number (an
    int32 Tensor). Usable eagerly and inside ``construct`` (as ``check_schedule_length``). Returns
    ``scale`` (for ordering: what the step computes from it runs after the check).

    Raises:
        ValueError: ``For '<owner>', the loss scale 'scale_sense' must stay finite and > 0, but it is <scale>
            at step <step> ...``.
    """
    usable = ops.logical_and(ops.isfinite(scale), scale > 0).all()
    if not usable:
        raise ValueError(f"For '{owner}', the loss scale 'scale_sense' must stay finite and > 0, but it is "
                         f"{scale} at step {step}: training stops before this step, the parameters are as "
                         f"after step {step - 1}. A dynamic manager's updates lead there (check its "
                         f"scale_factor and scale_window), or a value assigned to 'scale_sense'.")
    return scale
