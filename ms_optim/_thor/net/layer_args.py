"""Checks of the THOR layers' numeric constructor arguments that ``nn.Dense``/``nn.Conv2d``/``nn.Conv1d``/
``nn.Embedding`` do not make (or make with a message that does not name the argument); run before the plain
layer is built.

* sizes and geometry (channels, vocab/embedding sizes, kernel, stride, dilation, padding, group,
  padding_idx) must fit int32: a larger int is a ValueError naming the argument (the ops would wrap);
* ``kernel_size``/``stride``/``dilation`` must be an int or a tuple of ints >= 1, a conv's channel counts
  and an embedding's sizes ints (>= 1): TypeError / ValueError naming the argument; ``embedding_table``
  a str, number, Tensor or Initializer (MindSpore's own message names neither the argument nor the layer);
* a number given as an initializer (``weight_init``, ``bias_init``, ``embedding_table``) must be
  finite in float32: a NaN, infinite or overflowing constant initializer is a ValueError naming the
  argument.

Everything else is left to the plain layer's own checks (its exception types and messages).
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from ms_optim._validation import describe

__all__ = ["check_int", "check_int32", "check_positive_int", "check_int_or_tuple", "check_initializer",
           "check_init_number"]

_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int32(cls_name: str, name: str, value: Any) -> None:
    """An int argument (or every int of a tuple) must be within int32; other types are left alone."""
    for item in (value if isinstance(value, tuple) else (value,)):
        if _is_int(item) and not -_INT32_MAX - 1 <= item <= _INT32_MAX:
            raise ValueError(f"For '{cls_name}', the argument '{name}' must fit int32 "
                             f"(|value| <= {_INT32_MAX}), but got {value!r}.")


def check_int(cls_name: str, name: str, value: Any) -> None:
    """A Python int (bool refused) within int32: TypeError / ValueError naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"For '{cls_name}', the argument '{name}' must be an int, but got {describe(value)}.")
    check_int32(cls_name, name, value)


def check_positive_int(cls_name: str, name: str, value: Any) -> None:
    """A Python int >= 1 within int32 (sizes): TypeError / ValueError naming the argument."""
    check_int(cls_name, name, value)
    if value < 1:
        raise ValueError(f"For '{cls_name}', the argument '{name}' must be >= 1, but got {value!r}.")


def check_int_or_tuple(cls_name: str, name: str, value: Any) -> None:
    """``kernel_size``/``stride``/``dilation``: a Python int or a tuple of Python ints, each >= 1, int32."""
    items = value if isinstance(value, tuple) else (value,)
    if not items or not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        raise TypeError(f"For '{cls_name}', the argument '{name}' must be an int or a tuple of ints, "
                        f"but got {describe(value)}.")
    check_int32(cls_name, name, value)
    if any(item < 1 for item in items):
        raise ValueError(f"For '{cls_name}', the argument '{name}' must hold ints >= 1, but got {value!r}.")


def check_initializer(cls_name: str, name: str, value: Any) -> None:
    """An initializer: a str, a number, a Tensor or an ``Initializer`` (TypeError naming the argument), and
    a finite float32 number if it is a number (:func:`check_init_number`)."""
    from mindspore import Tensor
    from mindspore.common.initializer import Initializer

    if not isinstance(value, (str, numbers.Real, Tensor, Initializer)):
        raise TypeError(f"For '{cls_name}', the argument '{name}' must be a str, a number, a Tensor or an "
                        f"Initializer, but got {describe(value)}.")
    check_init_number(cls_name, name, value)


def check_init_number(cls_name: str, name: str, value: Any) -> None:
    """A number used as a constant initializer must be finite (strings, Tensors, Initializers pass)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(float(value)) or abs(float(value)) > _FLOAT32_MAX:
            raise ValueError(f"For '{cls_name}', the argument '{name}' must be a finite float32 number "
                             f"when it is a number, but got {value!r}.")
