"""``thor()``: MindSpore's THOR factory. Validate every argument, then convert the net, then build the optimizer.

Nothing else converts a net for THOR, and the optimizer (``optimizer.py``) never validates or
converts: it receives the converted net, its THOR layers and the validated values from here. A
refused call raises before anything is modified. Which layers THOR preconditions is decided by one
rule, ``convert.thor_class_for`` (via ``convert.thor_candidates``), for the count, the
``split_indices`` check and the conversion alike.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
from mindspore import Parameter, Tensor, nn

from ms_optim._thor.conventions import check_factor_convention, resolve_factor_convention
from ms_optim._thor.convert import convert_net, count_thor_cells, thor_class_for
from ms_optim._thor.device_rules import check_distribute_inverses
from ms_optim._thor.optimizer import ThorOptimizer
from ms_optim._thor.parallel import data_parallel_group_size
from ms_optim._thor.taps import ScheduleGuard, TapSettings
from ms_optim._thor.trace import check_trace_thresholds
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

__all__ = ["thor"]

_NAME = "thor"
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_int32(name: str, value: int) -> int:
    """An int the optimizer stores as int32 (frequency, sizes, indices): refuse what would wrap around."""
    if value > _INT32_MAX:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must be <= {_INT32_MAX} (it is stored as int32), "
                         f"but got {value!r}.")
    return value


def _check_float32(name: str, value) -> None:
    """A finite number that stays finite as float32 (the optimizer stores it so)."""
    check_finite(name, value, _NAME)
    if abs(value) > _FLOAT32_MAX:
        raise ValueError(f"For '{_NAME}', the argument '{name}' must be a finite float32 number (magnitude <= "
                         f"{_FLOAT32_MAX:.6g}), but got {value!r}.")


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
            raise ValueError(f"For '{_NAME}', the argument '{name}' must be a whole number, but got {value!r}.")
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


def _validate(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov,
              decay_filter, split_indices, enable_clip_grad, frequency, inverse, block_size, kl_clip=None,
              factor_convention="kfc", distribute_inverses=False) -> None:
    """Check every argument; nothing is modified."""
    check_type("net", net, nn.Cell, _NAME, what="a Cell")
    _check_schedule("learning_rate", learning_rate)
    _check_schedule("damping", damping)
    _check_scalar("momentum", momentum, check_float, check_non_negative)
    _check_scalar("weight_decay", weight_decay, check_number, check_non_negative)
    _check_scalar("loss_scale", loss_scale, check_number, check_positive)
    _check_scalar("batch_size", _whole_number("batch_size", batch_size), check_int, check_positive)
    check_bool("use_nesterov", use_nesterov, _NAME)
    check_callable("decay_filter", decay_filter, _NAME)
    if not isinstance(enable_clip_grad, int):  # MindSpore's thor tests its truth value: 0 and 1 train there too
        check_bool("enable_clip_grad", enable_clip_grad, _NAME)
    check_int("frequency", frequency, _NAME)
    check_range("frequency", frequency, low=2, cls_name=_NAME)
    _check_int32("frequency", frequency)
    if inverse not in ("blocked", "full"):
        raise ValueError(f"For '{_NAME}', the argument 'inverse' must be 'blocked' or 'full', "
                         f"but got {describe(inverse)}.")
    _check_scalar("block_size", block_size, check_int, check_positive)
    _check_kl_clip(kl_clip)
    check_factor_convention(factor_convention, _NAME)
    check_bool("distribute_inverses", distribute_inverses, _NAME)
    if thor_class_for(net) is not None:
        raise ValueError(f"For '{_NAME}', the argument 'net' must be a network Cell that contains the layers to "
                         f"precondition, but got a bare {type(net).__name__}, which cannot be replaced in place: "
                         f"wrap it in a Cell (e.g. nn.SequentialCell([layer])).")
    if not net.trainable_params():
        raise ValueError(f"For '{_NAME}', the argument 'net' must have trainable parameters, but got none.")
    num_layers = count_thor_cells(net)
    if num_layers == 0:
        raise ValueError(f"For '{_NAME}', the argument 'net' must contain at least one layer THOR can "
                         f"precondition (a trainable nn.Dense, nn.Conv2d with group 1, nn.Embedding or "
                         f"their THOR versions), but got {type(net).__name__} with none.")
    if split_indices is not None:
        check_type("split_indices", split_indices, (list, tuple), _NAME, what="a list of ints or None")
        for index in split_indices:
            check_int("split_indices", index, _NAME)


def _fusion_splits(split_indices, num_layers: int):
    """``split_indices`` as the all-reduce fusion uses it, or None (one group).

    MindSpore's thor reads ``split_indices`` only in data-parallel training, so on one device any list of
    ints is accepted and ignored (a script may hard-code ResNet-50's ``[26, 53]`` for a smaller net). In
    data parallel, as MindSpore's fusion pass: an empty list is one group, the indices must be strictly
    increasing, and an index past the last layer splits nothing (skipped with a warning); a negative
    index, which MindSpore cannot pass to its fusion pass, is a clear error here.

    Raises:
        ValueError: in data parallel, if the indices are negative or not strictly increasing.
    """
    if split_indices is None or data_parallel_group_size() <= 1:
        return None if split_indices is None else list(split_indices)
    indices = list(split_indices)
    if any(index < 0 for index in indices):
        raise ValueError(f"For '{_NAME}', the argument 'split_indices' must hold non-negative layer indices in "
                         f"data-parallel training, but got {indices!r}.")
    if any(b <= a for a, b in zip(indices, indices[1:])):
        raise ValueError(f"For '{_NAME}', the argument 'split_indices' must be strictly increasing in "
                         f"data-parallel training, but got {indices!r}.")
    kept = [index for index in indices if index < num_layers]
    if len(kept) < len(indices):
        warnings.warn(f"For '{_NAME}', 'split_indices' {indices!r}: the net has {num_layers} THOR layers "
                      f"(indices 0..{num_layers - 1}); the indices past the last layer split nothing and are "
                      f"ignored, as MindSpore's all-reduce fusion does.", UserWarning, stacklevel=3)
    return kept


def thor(net, learning_rate, damping, momentum, weight_decay=0.0, loss_scale=1.0, batch_size=32,
         use_nesterov=False, decay_filter=lambda x: x.name not in [], split_indices=None, enable_clip_grad=False,
         frequency=100, *, inverse="blocked", block_size=128, kl_clip=None, factor_convention="auto",
         distribute_inverses=False, trace_thresholds=None):
    r"""THOR, the second-order optimizer, with the signature of MindSpore's THOR factory, on every backend.

    Validates every argument first (a refused call leaves ``net`` untouched), then converts ``net``
    in place (``nn.Dense``/``nn.Conv2d``/``nn.Embedding`` -> their THOR versions, which collect the
    factors A and G), then returns the optimizer Cell (:class:`ThorOptimizer`). The update rule is in
    ``ms_optim._thor.optimizer``'s docstring: on steps ``0, f, 2f, ...`` the damped inverses
    ``(A + sqrt(damping[t]) I)^-1`` and ``(G + sqrt(damping[t]) I)^-1`` are recomputed; every step the
    weight gradients become ``G^-1 dW A^-1``, then weight decay, optional per-tensor clipping to
    norm 1 and momentum (``accum = m * accum + g; w -= lr[t] * accum``) follow.

    Args:
        net (Cell): the training network (converted in place).
        learning_rate (Tensor): per-step learning rates (1-D, indexed by the step) or one 0-D value.
        damping (Tensor): per-step damping (1-D) or one 0-D value; ``sqrt(damping)`` is added to the
            factors' diagonals.
        momentum (float): momentum, at least 0.0.
        weight_decay (int, float): L2 penalty ``wd * w`` added on parameters ``decay_filter`` keeps.
            Default: 0.0.
        loss_scale (int, float): the static loss scale the gradients carry (divided out). G is divided
            by the square of ``factor_loss_scale``, which starts at this value; a dynamic loss-scale
            cell feeds the live scale with ``feed_loss_scale`` (see :class:`ThorOptimizer`).
            Greater than 0. Default: 1.0.
        batch_size (int): the batch size B, used by the LayerNorm rule ``g / (g^2 / B + sqrt(damping))``
            (a float with a whole value is taken as that int, as MindSpore's thor takes it). Default: 32.
        use_nesterov (bool): Nesterov momentum. Default: False.
        decay_filter (function): parameter -> bool, which parameters get weight decay.
            Default: all of them.
        split_indices (list[int]): data-parallel all-reduce groups of the factors, split after these
            layer indices (strictly increasing; an index past the last THOR layer splits nothing and is
            ignored with a warning). Read only in data-parallel training, as MindSpore's. Default: None
            (one group).
        enable_clip_grad (bool): clip every preconditioned gradient to L2 norm 1 (an int counts as its truth
            value, as in MindSpore's thor). Default: False.
        frequency (int): recompute factors and inverses every ``frequency`` steps; at least 2.
            Default: 100.
        inverse (str, keyword-only): ``"blocked"`` (diagonal blocks of ``block_size``, the default on
            every device, as MindSpore's GPU and Ascend kernels) or ``"full"`` (whole-matrix inverses).
        block_size (int, keyword-only): width of the diagonal blocks. Default: 128.
        kl_clip (float, keyword-only): None (default: no clipping, MindSpore's THOR exactly) or ``c > 0``:
            every step, with ``g`` the gradients (divided by the loss scale) and ``v`` the preconditioned
            gradients of ALL trainable parameters (``v = g`` for parameters THOR does not precondition),
            taken after preconditioning and before weight decay, clipping and momentum, every ``v`` is
            multiplied by ``nu = min(1, sqrt(c / (lr[t]^2 * |sum v . g|)))`` (``nu = 1`` when that
            denominator is 0 or not finite): kfac-pytorch's KL clipping (``ms_optim._thor.kl_clip``).
        factor_convention (str, keyword-only): how A, G and the damping are normalised
            (``ms_optim._thor.conventions`` has the exact formulas and what differs from MindSpore);
            ``A_e``/``G_e`` are the factors the rule above inverts with ``sqrt(damping)``. With N rows
            (Dense/Embedding), ``in`` input features, ``counts`` the id counts, B the batch, T = Ho*Wo,
            ``n = B*T``, ``bs = batch_size``, conv patches p and output gradients d (``pm``/``dm`` their
            batch means):

            * ``"kfc"``: Dense ``A_e = a^T a / N``, ``G_e = N d^T d``; Conv2d ``A_e = sum p p^T / n``,
              ``G_e = B sum d d^T``; Embedding ``A_e = counts / N``, ``G_e = N d^T d`` (KFC).
            * ``"gpu"`` (MindSpore on GPU): Dense ``A_e = a^T a / in``, ``G_e = bs^2 / N d^T d``; Conv2d
              ``A_e = sum_t pm pm^T / sqrt(T)``, ``G_e = bs^2 / sqrt(T) sum_t dm dm^T`` (MindSpore's
              damping ``sqrt(d / T)`` and inverses times ``sqrt(1 / T)``, folded in); Embedding
              ``A_e = counts / bs``, ``G_e = bs^2 / N d^T d``.
            * ``"ascend"`` (MindSpore on Ascend): Dense ``A_e = a^T a / N``, ``G_e = bs^2 / N d^T d``;
              Conv2d, with ``c = n / bs``, ``A_e = sqrt(c) sum p p^T / n``, ``G_e = sqrt(c) bs^2 / n
              sum d d^T`` (MindSpore's damping ``sqrt(d bs / n)`` and product factor ``bs / n``,
              folded in); Embedding as gpu.
            * ``"auto"`` (default): ``"gpu"`` if MindSpore's ``device_target`` is GPU, ``"ascend"`` if
              Ascend, ``"kfc"`` on CPU (why: ``ms_optim._thor.conventions``).

            LayerNorm and everything else do not depend on it. The resolved value is the optimizer's
            ``factor_convention``.
        distribute_inverses (bool, keyword-only): under data parallelism with R > 1 ranks, each layer's
            inversion is done by one rank only (owners balanced by the cost ``sum w^3`` over the A and G
            blocks of width ``w``, greedy longest-processing-time, the same on every rank) and the inverses
            are shared by a summing AllReduce of zero-padded contributions, fused in the ``split_indices``
            groups: the same numbers, 1/R of the inversion work per rank (KAISA; ``ms_optim._thor.sharing``).
            Changes nothing on one device. Refused (ValueError) with a ``factor_convention`` that resolves to
            ``"gpu"`` or ``"ascend"``: those average each rank's own inverses, as MindSpore does
            (``ms_optim._thor.averaging``), so there is no identical inversion to share. Default: False.
        trace_thresholds (keyword-only): None (default: every layer re-inverted on every THOR step, MindSpore's
            THOR exactly), a number ``omega`` or a pair ``(omega_1, omega_2)``, ``omega_1 >= omega_2 >= 0``:
            THOR's trace rule; on a THOR step layer i is re-inverted only if the relative change
            ``Delta_i = |T_i - T_i^last| / T_i^last`` of ``T_i = tr(A) tr(G)`` since its last inversion is
            ``>= omega_1``, or ``>= omega_2`` once its interval (doubling after each such refresh) has
            elapsed (``ms_optim._thor.trace``: the rule, its state Parameters and the inversion counters).

    Returns:
        ThorOptimizer, a ``mindspore.nn.Optimizer``.

    Raises:
        TypeError: If `learning_rate` or `damping` is not a Tensor.
        TypeError: If `momentum` is not a float, `frequency` not an int, `batch_size` not an int or float,
            `loss_scale`, `weight_decay` or `kl_clip` (unless None) not a number, `use_nesterov` not a bool,
            `enable_clip_grad` not a bool or int,
            `decay_filter` not callable, `split_indices` not a list of ints, `net` not a Cell,
            `factor_convention` not a str, `distribute_inverses` not a bool, `trace_thresholds` not None,
            a number or a pair of numbers.
        ValueError: If `factor_convention` is not 'auto', 'gpu', 'ascend' or 'kfc'; if `distribute_inverses` is
            True and `factor_convention` resolves to 'gpu' or 'ascend'.
        ValueError: If `loss_scale`, `batch_size` or `kl_clip` is not positive.
        ValueError: If `weight_decay` or `momentum` is less than 0; if `trace_thresholds` holds a NaN, infinite or
            negative number, is a sequence not of length 2, or has ``omega_1 < omega_2``.
        ValueError: If `momentum`, `weight_decay`, `loss_scale` or `kl_clip` is NaN, infinite or beyond float32.
        ValueError: If `frequency` is less than 2; if `frequency`, `batch_size` or `block_size` does not fit int32;
            if `batch_size` is a float with a fractional part.
        ValueError: If `learning_rate`/`damping` is empty, not 0-D/1-D, or holds a negative or
            non-finite value; in data-parallel training, if `split_indices` is not strictly increasing
            non-negative ints; if
            `net` has no layer THOR can precondition or no trainable parameter; if `net` is itself a
            bare plain layer (``nn.Dense``, ...), which cannot be replaced in place: wrap it in a Cell.
        ValueError (at run time): If the step runs past the end of `learning_rate` or `damping`.
    """
    _validate(net, learning_rate, damping, momentum, weight_decay, loss_scale, batch_size, use_nesterov, decay_filter,
              split_indices, enable_clip_grad, frequency, inverse, block_size, kl_clip, factor_convention,
              distribute_inverses)
    thresholds = check_trace_thresholds(trace_thresholds, _NAME)  # before the net is converted
    convention = resolve_factor_convention(factor_convention)
    splits = _fusion_splits(split_indices, count_thor_cells(net, convention))
    check_distribute_inverses(distribute_inverses, convention, factor_convention, _NAME)  # _thor.device_rules
    limits = [(name, value.shape[0]) for name, value in (("learning_rate", learning_rate), ("damping", damping))
              if value.ndim == 1]
    # PYNATIVE: a step past their end is refused before the backward pass writes the factors (and a guard
    # an earlier thor() on this net set is dropped); it reads the optimizer's global_step, bound below
    guard = ScheduleGuard(_NAME, Parameter(Tensor(np.zeros((1,), np.int32)), name="global_step"),
                          limits) if limits else None
    block = int(block_size) if inverse == "blocked" else None
    layers = convert_net(net, TapSettings(convention, int(batch_size), block, guard))  # thor_candidates' layers
    optimizer = ThorOptimizer(net, layers, learning_rate, damping, float(momentum), float(weight_decay),
                              float(loss_scale), int(batch_size), bool(use_nesterov), decay_filter,
                              splits, bool(enable_clip_grad), int(frequency), inverse, int(block_size),
                              kl_clip=None if kl_clip is None else float(kl_clip), factor_convention=convention,
                              distribute_inverses=distribute_inverses, trace_thresholds=thresholds)
    if guard is not None:
        guard.step = optimizer.global_step
    return optimizer
