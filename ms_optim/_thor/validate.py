"""``thor()``'s arguments, checked once into the frozen record :class:`~ms_optim._thor.config.ThorConfig`.

``validate_thor`` checks every argument of ``thor()`` (nothing is modified; a refused call leaves the net as
it was) and returns the config the converter and the optimizer are built from. Every later decision (the
inversion strategy, the fusion groups, the step and damping rules) reads the config, never the raw arguments,
and the data-parallel group size is read here, once.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor, nn

from ms_optim._thor.config import DEFAULT_ADAPT_EVERY, DEFAULT_DAMPING_BOUNDS, ThorConfig
from ms_optim._thor.inversion.device_rules import check_distribute_inverses
from ms_optim._thor.inversion.trace import check_trace_thresholds
from ms_optim._thor.modes import Inverse, Mode
from ms_optim._thor.net import convert
from ms_optim._thor.net.conventions import check_factor_convention, resolve_factor_convention
from ms_optim._thor.parallel import data_parallel_group_size
from ms_optim._validation import (
    check_bool,
    check_callable,
    check_finite,
    check_float,
    check_int,
    check_non_negative,
    check_number,
    check_positive,
    check_range,
    check_tensor,
    check_type,
    describe,
)

__all__ = ["validate_thor", "ADAPTIVE"]

_NAME = "thor"
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the string that makes ``learning_rate``, ``damping`` or ``momentum`` adaptive
ADAPTIVE = Mode.ADAPTIVE


def _check_int32(name: str, value: int) -> int:
    """An int the optimizer stores as int32 (frequency, sizes, indices): refuse what would wrap around."""
    if value > _INT32_MAX:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must be <= {_INT32_MAX} (it is stored as "
                         f"int32), but got {value!r}.")
    return value


def _check_float32(name: str, value) -> None:
    """A finite number that stays finite as float32 (the optimizer stores it so)."""
    check_finite(name, value, _NAME)
    if abs(value) > _FLOAT32_MAX:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must be a finite float32 number (magnitude "
                         f"<= {_FLOAT32_MAX:.6g}), but got {value!r}.")


def _check_scalar(name: str, value, kind: Callable, bound: Callable) -> None:
    """``kind`` (check_float / check_number / check_int), then ``bound`` (check_positive /
    check_non_negative), then that the value fits the int32 or float32 it is stored as."""
    kind(name, value, _NAME)
    bound(name, value, _NAME)
    (_check_int32 if kind is check_int else _check_float32)(name, value)


def _whole_number(name: str, value: Any) -> Any:
    """A float with a whole finite value as that int (MindSpore's thor keeps ``batch_size`` in a float32
    Tensor, so ``32.0`` trains there); anything else unchanged, for the int check that follows."""
    if isinstance(value, float):
        _check_float32(name, value)
        if not value.is_integer():
            raise ValueError(f"For '{_NAME}', the argument '{name}' must be a whole number, but got "
                             f"{value!r}.")
        return int(value)
    return value


def _check_kl_clip(kl_clip) -> None:
    """None, or an int/float > 0 that is finite in float32."""
    if kl_clip is None:
        return
    check_number("kl_clip", kl_clip, _NAME)
    check_positive("kl_clip", kl_clip, _NAME)
    _check_float32("kl_clip", kl_clip)


def _check_schedule(name: str, value: Any) -> Tensor:
    """A 0-D or non-empty 1-D Tensor of finite, non-negative numbers."""
    check_tensor(name, value, _NAME, ndims=(0, 1))
    if value.ndim == 1 and value.shape[0] == 0:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must not be empty, but got shape (0,).")
    array = value.asnumpy().astype(np.float64)
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        bad = array[~(np.isfinite(array) & (array >= 0))][0]
        raise ValueError(f"For '{_NAME}', the argument '{name}' must hold finite values >= 0, "
                         f"but got {float(bad)!r}.")
    return value


def _check_schedule_or_adaptive(name: str, value: Any) -> Tuple[Tensor, str]:
    """``(schedule, mode)``: a schedule Tensor (:func:`_check_schedule`) and ``Mode.SCHEDULED``, or for the
    string ``"adaptive"`` a 0-D zero (read by nobody) and ``Mode.ADAPTIVE``."""
    if isinstance(value, str):
        if value != ADAPTIVE:
            raise ValueError(f"For '{_NAME}', the argument '{name}' must be a Tensor or '{ADAPTIVE}', "
                             f"but got {value!r}.")
        return Tensor(0.0, mstype.float32), Mode.ADAPTIVE
    return _check_schedule(name, value), Mode.SCHEDULED


def _check_adaptive_lr(adaptive: bool, use_nesterov: bool) -> None:
    """``learning_rate="adaptive"`` needs ``use_nesterov=False`` (the step is the solved combination of two
    directions; there is no accumulation for a Nesterov look-ahead)."""
    if adaptive and use_nesterov:
        raise ValueError(f"For '{_NAME}', learning_rate='{ADAPTIVE}' needs use_nesterov=False (the step "
                         f"is the quadratic model's combination of the new direction and the previous "
                         f"update), but got use_nesterov=True.")


def _check_momentum(momentum, adaptive_lr: bool) -> str:
    """``momentum``: a float >= 0, below 1 with ``learning_rate="adaptive"`` (which weights the new step by
    ``1 - momentum``), or ``"adaptive"`` there only. Returns its mode."""
    if isinstance(momentum, str) and momentum == ADAPTIVE:
        if not adaptive_lr:
            raise ValueError(f"For '{_NAME}', momentum='{ADAPTIVE}' needs learning_rate='{ADAPTIVE}' (the "
                             f"quadratic model that chooses it also chooses the step size), but got a "
                             f"learning-rate schedule.")
        return Mode.ADAPTIVE
    _check_scalar("momentum", momentum, check_float, check_non_negative)
    if adaptive_lr and momentum >= 1.0:
        raise ValueError(f"For '{_NAME}', with learning_rate='{ADAPTIVE}' the argument 'momentum' must be "
                         f"less than 1.0 (each step is momentum times the previous one plus 1 - momentum "
                         f"times the model's step), but got {momentum!r}.")
    return Mode.SCHEDULED


def _check_adaptive(adaptive: bool, adapt_every, damping_bounds, use_nesterov: bool):
    """``adapt_every`` (None or an int >= 1) and ``damping_bounds`` (None or ``(low, high)``, finite float32
    numbers with ``0 < low <= high``), given only with ``damping="adaptive"``; their defaults filled in (also
    with a damping Tensor, where nothing reads them)."""
    for name, value in (("adapt_every", adapt_every), ("damping_bounds", damping_bounds)):
        if value is not None and not adaptive:
            raise ValueError(f"For '{_NAME}', the argument '{name}' is read only with "
                             f"damping='{ADAPTIVE}', but got {name}={value!r} with a damping Tensor.")
    if not adaptive:
        return DEFAULT_ADAPT_EVERY, DEFAULT_DAMPING_BOUNDS
    if use_nesterov:
        raise ValueError(f"For '{_NAME}', damping='{ADAPTIVE}' needs use_nesterov=False (its quadratic model "
                         f"reads the update from the momentum accumulation), but got use_nesterov=True.")
    if adapt_every is None:
        adapt_every = DEFAULT_ADAPT_EVERY
    _check_scalar("adapt_every", adapt_every, check_int, check_positive)
    if damping_bounds is None:
        return int(adapt_every), DEFAULT_DAMPING_BOUNDS
    if not isinstance(damping_bounds, (list, tuple)) or len(damping_bounds) != 2 or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in damping_bounds):
        raise TypeError(f"For '{_NAME}', the argument 'damping_bounds' must be None or a pair (low, high) of "
                        f"numbers, but got {describe(damping_bounds)}.")
    low, high = (float(v) for v in damping_bounds)
    if not all(np.isfinite((low, high))) or max(abs(low), abs(high)) > _FLOAT32_MAX or not 0 < low <= high:
        raise ValueError(f"For '{_NAME}', the argument 'damping_bounds' must be (low, high) with "
                         f"0 < low <= high, finite in float32, but got {tuple(damping_bounds)!r}.")
    return int(adapt_every), (low, high)


def _check_net(net, convention: str) -> int:
    """The net is a Cell holding trainable parameters and at least one layer THOR preconditions under
    ``convention``, and not itself a bare plain layer; returns its number of THOR layers."""
    if convert.thor_class_for(net, convention) is not None:
        raise ValueError(f"For '{_NAME}', the argument 'net' must be a network Cell that contains the layers "
                         f"to precondition, but got a bare {type(net).__name__}, which cannot be replaced in "
                         f"place: wrap it in a Cell (e.g. nn.SequentialCell([layer])).")
    if not net.trainable_params():
        raise ValueError(f"For '{_NAME}', the argument 'net' must have trainable parameters, but got none.")
    num_layers = convert.count_thor_cells(net, convention)
    if num_layers == 0:
        raise ValueError(f"For '{_NAME}', the argument 'net' must contain at least one layer THOR can "
                         f"precondition (a trainable nn.Dense, nn.Conv2d with group 1, nn.Embedding or "
                         f"their THOR versions), but got {type(net).__name__} with none.")
    return num_layers


def _fusion_splits(split_indices, num_layers: int, ranks: int) -> Optional[Tuple[int, ...]]:
    """``split_indices`` as the all-reduce fusion uses it, or None (one group).

    MindSpore's thor reads ``split_indices`` only in data-parallel training, so on one device any list of
    ints is accepted and ignored (a script may hard-code ResNet-50's ``[26, 53]`` for a smaller net). In
    data parallel, as MindSpore's fusion pass: an empty list is one group, the indices must be strictly
    increasing, and an index past the last layer splits nothing (skipped with a warning); a negative
    index, which MindSpore cannot pass to its fusion pass, is a clear error here.
    """
    if split_indices is None:
        return None
    indices = tuple(split_indices)
    if ranks <= 1:
        return indices
    if any(index < 0 for index in indices):
        raise ValueError(f"For '{_NAME}', the argument 'split_indices' must hold non-negative layer indices "
                         f"in data-parallel training, but got {list(indices)!r}.")
    if any(b <= a for a, b in zip(indices, indices[1:])):
        raise ValueError(f"For '{_NAME}', the argument 'split_indices' must be strictly increasing in "
                         f"data-parallel training, but got {list(indices)!r}.")
    kept = tuple(index for index in indices if index < num_layers)
    if len(kept) < len(indices):
        warnings.warn(f"For '{_NAME}', 'split_indices' {list(indices)!r}: the net has {num_layers} THOR "
                      f"layers (indices 0..{num_layers - 1}); the indices past the last layer split nothing "
                      f"and are ignored, as MindSpore's all-reduce fusion does.", UserWarning, stacklevel=4)
    return kept


def validate_thor(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
                  decay_filter, split_indices, enable_clip_grad, frequency, *, inverse, block_size, kl_clip,
                  factor_convention, distribute_inverses, trace_thresholds, adapt_every=None,
                  damping_bounds=None) -> ThorConfig:
    """Check every argument of ``thor()`` (its docstring lists the errors); nothing is modified."""
    check_type("net", net, nn.Cell, _NAME, what="a Cell")
    learning_rate, lr_mode = _check_schedule_or_adaptive("learning_rate", learning_rate)
    damping, damping_mode = _check_schedule_or_adaptive("damping", damping)
    momentum_mode = _check_momentum(momentum, lr_mode == Mode.ADAPTIVE)
    _check_scalar("weight_decay", weight_decay, check_number, check_non_negative)
    _check_scalar("loss_scale", loss_scale, check_number, check_positive)
    batch_size = _whole_number("batch_size", batch_size)
    _check_scalar("batch_size", batch_size, check_int, check_positive)
    check_bool("use_nesterov", use_nesterov, _NAME)
    _check_adaptive_lr(lr_mode == Mode.ADAPTIVE, use_nesterov)
    adapt_every, damping_bounds = _check_adaptive(damping_mode == Mode.ADAPTIVE, adapt_every, damping_bounds,
                                                  use_nesterov)
    check_callable("decay_filter", decay_filter, _NAME)
    # MindSpore's thor tests its truth value: 0 and 1 train there too
    if not isinstance(enable_clip_grad, int):
        check_bool("enable_clip_grad", enable_clip_grad, _NAME)
    check_int("frequency", frequency, _NAME)
    check_range("frequency", frequency, low=2, cls_name=_NAME)
    _check_int32("frequency", frequency)
    if not isinstance(inverse, str):
        raise TypeError(f"For '{_NAME}', the argument 'inverse' must be a str, but got {describe(inverse)}.")
    if inverse not in Inverse.ALL:
        raise ValueError(f"For '{_NAME}', the argument 'inverse' must be 'blocked' or 'full', "
                         f"but got {describe(inverse)}.")
    _check_scalar("block_size", block_size, check_int, check_positive)
    _check_kl_clip(kl_clip)
    check_factor_convention(factor_convention, _NAME)
    check_bool("distribute_inverses", distribute_inverses, _NAME)
    convention = resolve_factor_convention(factor_convention)
    num_layers = _check_net(net, convention)
    if split_indices is not None:
        check_type("split_indices", split_indices, (list, tuple), _NAME, what="a list of ints or None")
        for index in split_indices:
            check_int("split_indices", index, _NAME)
    thresholds = check_trace_thresholds(trace_thresholds, _NAME)
    ranks = data_parallel_group_size()
    splits = _fusion_splits(split_indices, num_layers, ranks)
    check_distribute_inverses(distribute_inverses, convention, factor_convention, _NAME)
    return ThorConfig(learning_rate=learning_rate, damping=damping,
                      momentum=0.0 if momentum_mode == Mode.ADAPTIVE else float(momentum), lr_mode=lr_mode,
                      damping_mode=damping_mode, momentum_mode=momentum_mode,
                      weight_decay=float(weight_decay), loss_scale=float(loss_scale),
                      batch_size=int(batch_size), use_nesterov=bool(use_nesterov), decay_filter=decay_filter,
                      split_indices=splits,
                      enable_clip_grad=bool(enable_clip_grad), frequency=int(frequency), inverse=inverse,
                      block_size=int(block_size), kl_clip=None if kl_clip is None else float(kl_clip),
                      factor_convention=convention, distribute_inverses=bool(distribute_inverses),
                      trace_thresholds=thresholds, ranks=ranks, adapt_every=adapt_every,
                      damping_bounds=damping_bounds)
