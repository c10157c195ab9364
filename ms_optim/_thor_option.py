"""``ms_optim.use(thor="adaptive")`` and ``python -m ms_optim.run --thor adaptive``: recipe-free THOR for a
script that calls ``thor(net, lr_schedule, damping_schedule, momentum, ...)``, without editing it.

:func:`adaptive_thor` wraps ``thor()``: each call is made with ``learning_rate="adaptive"`` and
``damping="adaptive"`` in place of the script's schedules (not read), and every other argument as the
script passed it. One stderr line per call says what was replaced. A call adaptive THOR cannot serve
(``use_nesterov=True``, ``momentum`` 1.0 or more) raises ``ValueError`` naming the option. This module
imports nothing heavy: ``python -m ms_optim.run`` checks the option's value with it before MindSpore loads.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import sys
from typing import Any, Callable, Optional

__all__ = ["ADAPTIVE", "THOR_MODES", "check_thor_mode", "adaptive_thor", "describe_schedule"]

#: the value of the option: every thor() call gets learning_rate="adaptive" and damping="adaptive"
ADAPTIVE = "adaptive"
#: the accepted values of ``use(thor=...)`` and ``--thor`` (None: thor() calls are left as written)
THOR_MODES = (ADAPTIVE,)


def check_thor_mode(value: Any, cls_name: str = "use") -> Optional[str]:
    """``thor`` of ``use()``: None or one of :data:`THOR_MODES`; TypeError / ValueError naming the value."""
    if value is None:
        return None
    choices = " or ".join(repr(mode) for mode in THOR_MODES)
    if not isinstance(value, str):
        raise TypeError(f"For '{cls_name}', the argument 'thor' must be None or a str ({choices}), but got "
                        f"{type(value).__name__} {value!r}.")
    if value not in THOR_MODES:
        raise ValueError(f"For '{cls_name}', the argument 'thor' must be None or {choices}, "
                         f"but got {value!r}.")
    return value


def describe_schedule(value: Any) -> str:
    """A learning-rate or damping argument as the stderr line names it (a Tensor by its shape)."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (str, numbers.Number)):
        return f"{type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse(option: str, bound: inspect.BoundArguments) -> None:
    """The arguments adaptive THOR refuses, named with the option that made the call adaptive."""
    nesterov = bound.arguments.get("use_nesterov", False)
    momentum = bound.arguments.get("momentum")
    if nesterov is True:
        raise ValueError(f"For 'thor', {option} replaces learning_rate and damping by '{ADAPTIVE}', "
                         f"which needs use_nesterov=False (the step is the quadratic model's combination "
                         f"of the new direction and the previous update), but the thor() call has "
                         f"use_nesterov=True: run without {option}, or with use_nesterov=False.")
    if isinstance(momentum, float) and momentum >= 1.0:
        raise ValueError(f"For 'thor', {option} replaces learning_rate by '{ADAPTIVE}', which needs "
                         f"'momentum' less than 1.0 (each step is momentum times the previous one plus "
                         f"1 - momentum times the model's step), but the thor() call has "
                         f"momentum={momentum!r}: run without {option}, or with a momentum below 1.0.")


def adaptive_thor(thor: Callable, option: str, report: Optional[Callable[[str], None]] = None) -> Callable:
    """``thor`` with every call made recipe-free (``learning_rate`` and ``damping`` ``"adaptive"``).

    ``option`` names the option in messages (``"python -m ms_optim.run --thor adaptive"``); ``report``
    receives the one line each call prints (default: stderr). The returned function keeps ``thor``'s name,
    signature and docstring, and counts the calls made through it in its ``calls`` attribute (refused
    calls included). A call whose arguments do not bind to the signature raises ``TypeError`` as ``thor``
    would; a ``ValueError`` of ``thor`` about adaptive THOR names the option too.
    """
    signature = inspect.signature(thor)
    say = report if report is not None else _to_stderr

    @functools.wraps(thor)
    def recipe_free_thor(*args, **kwargs):
        recipe_free_thor.calls += 1
        bound = signature.bind(*args, **kwargs)
        _refuse(option, bound)
        replaced = {name: bound.arguments[name] for name in ("learning_rate", "damping")}
        bound.arguments.update(learning_rate=ADAPTIVE, damping=ADAPTIVE)
        try:
            optimizer = thor(*bound.args, **bound.kwargs)
        except ValueError as exc:
            if ADAPTIVE not in str(exc):
                raise
            raise ValueError(f"{exc} ({option} replaced learning_rate and damping by '{ADAPTIVE}'.)") from exc
        lr, damping = (describe_schedule(replaced[name]) for name in ("learning_rate", "damping"))
        say(f"{option}: thor() builds recipe-free THOR: learning_rate {lr} and damping {damping} replaced "
            f"by '{ADAPTIVE}' (not read); momentum={bound.arguments.get('momentum')!r} and the other "
            f"arguments as given.")
        return optimizer

    recipe_free_thor.calls = 0
    recipe_free_thor.__signature__ = signature
    return recipe_free_thor


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
