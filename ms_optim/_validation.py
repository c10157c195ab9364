"""One set of argument checks for every ms_optim class, with one message style.

Every message names the class, the argument as written in the signature, the rule, and the value
received, e.g. ``For 'Lamb', the argument 'beta1' must be in the range (0.0, 1.0), but got 1.5.``

The exception types follow MindSpore's documentation: a wrong *type* raises ``TypeError``, a value
of the right type outside its allowed range raises ``ValueError``. ``bool`` is never accepted where
a number is expected (``True`` is an ``int`` in Python, but not a learning rate).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Optional, Tuple, Type, Union

__all__ = [
    "describe",
    "check_type",
    "check_float",
    "check_number",
    "check_int",
    "check_bool",
    "check_range",
    "check_positive",
    "check_non_negative",
    "check_finite",
    "check_values",
    "check_callable",
    "check_tensor",
]


def describe(value: Any) -> str:
    """Short, readable description of a received value for error messages."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def _prefix(cls_name: Optional[str]) -> str:
    return f"For '{cls_name}', the" if cls_name else "The"


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_type(name: str, value: Any, types: Union[Type, Tuple[Type, ...]], cls_name: Optional[str] = None,
               what: Optional[str] = None) -> Any:
    """Raise TypeError unless ``value`` is an instance of ``types`` (bool rejected unless asked for)."""
    types_tuple = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, types_tuple) and not (isinstance(value, bool) and bool not in types_tuple)
    if not ok:
        if what is None:
            what = " or ".join(t.__name__ for t in types_tuple)
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be {what}, but got {describe(value)}.")
    return value


def check_float(name: str, value: Any, cls_name: Optional[str] = None) -> float:
    """Python float (not int, not bool): MindSpore's documented type for beta1, eps, lambd, ..."""
    check_type(name, value, float, cls_name, what="a float")
    return value


def check_number(name: str, value: Any, cls_name: Optional[str] = None) -> Union[int, float]:
    """int or float, bool rejected."""
    if not _is_real(value):
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be an int or a float, "
                        f"but got {describe(value)}.")
    return value


def check_int(name: str, value: Any, cls_name: Optional[str] = None) -> int:
    """Python int, bool rejected."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be an int, but got {describe(value)}.")
    return int(value)


def check_bool(name: str, value: Any, cls_name: Optional[str] = None) -> bool:
    """Python bool only (1 and 0 are refused, as MindSpore does)."""
    if not isinstance(value, bool):
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be a bool, but got {describe(value)}.")
    return value


def check_range(name: str, value: Union[int, float], low: Optional[float] = None,
                high: Optional[float] = None, low_inclusive: bool = True, high_inclusive: bool = True,
                cls_name: Optional[str] = None):
    """Raise ValueError unless low <(=) value <(=) high; a bound of None is open-ended.

    Written as ``not (value >= low)`` so that NaN, which compares false with everything, is refused
    whenever a bound is given.
    """
    too_low = low is not None and not (value >= low if low_inclusive else value > low)
    too_high = high is not None and not (value <= high if high_inclusive else value < high)
    if too_low or too_high:
        if low is not None and high is not None:
            rule = (f"in the range {'[' if low_inclusive else '('}{low}, {high}"
                    f"{']' if high_inclusive else ')'}")
        elif low is not None:
            rule = f"{'>=' if low_inclusive else '>'} {low}"
        else:
            rule = f"{'<=' if high_inclusive else '<'} {high}"
        raise ValueError(f"{_prefix(cls_name)} argument '{name}' must be {rule}, but got {value!r}.")
    return value


def check_finite(name: str, value: Union[int, float], cls_name: Optional[str] = None):
    """value is neither NaN nor +-inf (ValueError otherwise)."""
    if not math.isfinite(value):
        raise ValueError(f"{_prefix(cls_name)} argument '{name}' must be a finite number, but got {value!r}.")
    return value


def check_values(name: str, values: Any, cls_name: Optional[str] = None, low: float = 0.0) -> Any:
    """Every element of ``values`` (a list, tuple, NumPy array or Tensor of numbers) is finite and >= ``low``.

    Raises ValueError naming the argument and the first bad element; returns ``values`` unchanged.
    """
    import numpy as np  # local, like check_tensor's import

    array = values.asnumpy() if hasattr(values, "asnumpy") else np.asarray(values)
    array = np.asarray(array, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(array) | (array < low)
    if bad.any():
        index = int(np.argmax(bad))
        raise ValueError(f"{_prefix(cls_name)} argument '{name}' must hold finite values >= {low}, but "
                         f"element {index} is {float(array[index])!r}.")
    return values


def check_positive(name: str, value: Union[int, float], cls_name: Optional[str] = None):
    """value > 0 (ValueError otherwise)."""
    return check_range(name, value, low=0, low_inclusive=False, cls_name=cls_name)


def check_non_negative(name: str, value: Union[int, float], cls_name: Optional[str] = None):
    """value >= 0 (ValueError otherwise)."""
    return check_range(name, value, low=0, low_inclusive=True, cls_name=cls_name)


def check_callable(name: str, value: Any, cls_name: Optional[str] = None) -> Callable:
    """A function or other callable (TypeError otherwise)."""
    if not callable(value):
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be callable, but got {describe(value)}.")
    return value


def check_tensor(name: str, value: Any, cls_name: Optional[str] = None, ndims: Iterable[int] = (0, 1)):
    """A mindspore Tensor (not a Parameter-less number) with ndim in ``ndims``."""
    from mindspore import Tensor  # local: keep this module importable without MindSpore's start-up cost

    if not isinstance(value, Tensor):
        raise TypeError(f"{_prefix(cls_name)} argument '{name}' must be a Tensor, but got {describe(value)}.")
    ndims = tuple(ndims)
    if value.ndim not in ndims:
        raise ValueError(f"{_prefix(cls_name)} argument '{name}' must be a Tensor with ndim in {ndims}, "
                         f"but got shape {tuple(value.shape)}.")
    return value
