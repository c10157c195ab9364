"""What every ms_optim optimizer needs on top of :class:`mindspore.nn.Optimizer`.

``mindspore.nn.Optimizer`` already handles parameter groups (``params``/``lr``/``weight_decay``/
``grad_centralization``/``order_params``), the learning-rate forms (float, int, 0-D/1-D Tensor,
list, ``LearningRateSchedule``), ``get_lr``, ``decay_weight`` with the default ``beta``/``gamma``
filter, ``scale_grad`` and ``global_step``. :class:`OptimizerBase` keeps all of that and adds only:

1. Argument checks in ms_optim's message style (:mod:`ms_optim._validation`) for the three
   arguments every optimizer shares: ``params`` (TypeError naming ``params``, not ``parameters``),
   ``learning_rate`` and ``weight_decay``.
2. A learning-rate list (or 1-D Tensor) that is shorter than the number of steps trained raises
   ``ValueError`` naming ``learning_rate`` and the step (:func:`check_schedule_length`, the one check
   of this kind, also used by LARS and THOR), in PYNATIVE_MODE and GRAPH_MODE, instead of
   MindSpore's ``Gather`` index error. The check is a ``raise`` under a tensor condition, which
   MindSpore compiles to a runtime check in graph mode; the failing step changes nothing (no
   parameter, state or ``global_step`` update). The list keeps MindSpore's Parameter name
   (``learning_rate``, ``learning_rate_group_<i>``) so checkpoints still load in both libraries.
3. ``gradients_centralization`` from plain ops: MindSpore's ``Centralization`` primitive has no CPU
   kernel, so groups with ``grad_centralization=True`` fail on CPU with MindSpore's base method.
   Same rule: a gradient of rank > 1 whose second dimension is a multiple of 16 loses its mean
   over all axes but the first; other gradients pass unchanged.
4. Two helpers that remove the ``is_group`` / ``is_group_lr`` branches from every ``construct``:
   :meth:`OptimizerBase.lr_per_param` and :meth:`OptimizerBase.weight_decay_per_param` give one
   entry per parameter, in ``self._parameters`` order.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable, List, Optional, Tuple

import mindspore.common.dtype as mstype
from mindspore import Parameter, Tensor, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim import _validation as v

try:  # MindSpore's own list schedule: subclassing it keeps `Optimizer.get_lr_parameter` working.
    from mindspore.nn.optim.optimizer import _IteratorLearningRate as _ListScheduleBase
except ImportError:  # pragma: no cover - only if MindSpore renames its private class
    _ListScheduleBase = LearningRateSchedule

__all__ = ["OptimizerBase", "check_params", "check_learning_rate", "check_weight_decay",
           "check_schedule_length"]


def check_params(params: Any, cls_name: str, name: str = "params") -> List[Any]:
    """``params`` must be a non-empty iterable of Parameters or of group dicts; returns it as a list.

    Raises:
        TypeError: not iterable, or an element is neither a Parameter nor a dict (or a mix of both),
            or a group's ``params`` holds a non-Parameter.
        ValueError: empty, or the same Parameter twice (in the list, or in two groups).
    """
    if params is None or isinstance(params, (str, bytes, Tensor, dict)) or not isinstance(params, Iterable):
        raise TypeError(f"For '{cls_name}', the argument '{name}' must be a list of Parameter or a list of "
                        f"dict, but got {v.describe(params)}.")
    params = list(params)
    if not params:
        raise ValueError(f"For '{cls_name}', the argument '{name}' must not be empty, but got [].")
    all_params = all(isinstance(p, Parameter) for p in params)
    all_dicts = all(isinstance(p, dict) for p in params)
    if not (all_params or all_dicts):
        bad = next(p for p in params if not isinstance(p, (Parameter, dict))) \
            if any(not isinstance(p, (Parameter, dict)) for p in params) else params[0]
        raise TypeError(f"For '{cls_name}', every element of the argument '{name}' must be a Parameter "
                        f"(or every element a dict of parameter groups), but got {v.describe(bad)}.")
    if all_dicts:
        for group in params:
            if "params" not in group:
                continue  # an {'order_params': ...} entry, checked by mindspore.nn.Optimizer
            members = group["params"]
            if isinstance(members, (str, bytes, Tensor, dict)) or not isinstance(members, Iterable):
                raise TypeError(f"For '{cls_name}', the value of 'params' in a group of the argument "
                                f"'{name}' must be a list of Parameter, but got {v.describe(members)}.")
            for member in members:
                if not isinstance(member, Parameter):
                    raise TypeError(f"For '{cls_name}', every element of 'params' in a group of the argument "
                                    f"'{name}' must be a Parameter, but got {v.describe(member)}.")
    _check_each_once(params, cls_name, name)
    return params


def _check_each_once(params: List[Any], cls_name: str, name: str) -> None:
    """No Parameter twice in ``params`` (nor in two groups): MindSpore would report only a clash of
    state names (``'lamb_m.weight' already exists``) or a RuntimeError about repeated setting."""
    members = params if isinstance(params[0], Parameter) else [
        member for group in params for member in list(group.get("params", ()))]
    seen = set()
    for member in members:
        if id(member) in seen:
            where = "" if isinstance(params[0], Parameter) else " (across its groups)"
            raise ValueError(f"For '{cls_name}', the argument '{name}' must hold each Parameter once, but it "
                             f"holds the same Parameter '{member.name}' twice{where}.")
        seen.add(id(member))


def check_learning_rate(learning_rate: Any, cls_name: str, name: str = "learning_rate") -> Any:
    """float/int >= 0, a 0-D or 1-D Tensor, a non-string iterable of numbers, or a LearningRateSchedule.

    Every number given (the value, the Tensor's or the list's elements) must be finite and >= 0.
    Returns ``learning_rate``, as a list when it was another kind of iterable (a generator is read once).

    Raises:
        TypeError: any other type (bool included), or a list element that is not a number.
        ValueError: a negative, NaN or infinite number, an empty list, or a Tensor with more than one
            dimension.
    """
    if isinstance(learning_rate, LearningRateSchedule):
        return learning_rate
    if isinstance(learning_rate, Tensor):
        if learning_rate.ndim > 1:
            raise ValueError(f"For '{cls_name}', the argument '{name}' must be a Tensor with ndim 0 or 1, "
                             f"but got shape {tuple(learning_rate.shape)}.")
        if learning_rate.ndim == 1 and learning_rate.shape[0] == 0:
            raise ValueError(f"For '{cls_name}', the argument '{name}' must not be empty, but got an empty "
                             f"Tensor.")
        return v.check_values(name, learning_rate, cls_name)
    if isinstance(learning_rate, (str, bytes, dict)) or isinstance(learning_rate, bool):
        v.check_number(name, learning_rate, cls_name)  # raises TypeError with the common message
    if isinstance(learning_rate, Iterable):
        values = learning_rate if isinstance(learning_rate, (list, tuple)) else list(learning_rate)
        if len(values) == 0:
            raise ValueError(f"For '{cls_name}', the argument '{name}' must not be empty, but got "
                             f"{values!r}.")
        for value in values:
            if not v._is_real(value):  # pylint: disable=protected-access
                raise TypeError(f"For '{cls_name}', every element of the argument '{name}' must be an int or "
                                f"a float, but got {v.describe(value)}.")
        v.check_values(name, values, cls_name)
        return values
    v.check_number(name, learning_rate, cls_name)
    v.check_non_negative(name, learning_rate, cls_name)
    v.check_finite(name, learning_rate, cls_name)
    return learning_rate


def check_schedule_length(owner: str, name: str, size: int, size_tensor: Tensor, step: Tensor,
                          where: str = "") -> Tensor:
    """Refuse to run step ``step + 1`` from a per-step list of ``size`` values (the one check of its kind).

    Usable eagerly and inside ``construct``/``jit`` (graph mode compiles the ``raise`` under a tensor
    condition into a runtime check). ``owner``: the class named in the message (``type(self).__name__``);
    ``name``: the argument holding the list (``learning_rate``, ``damping``); ``size``/``size_tensor``:
    its length as an int and as an int32 Tensor; ``step``: the 0-based index of the step about to run
    (shape () or (1,)); ``where``: words after the argument name, e.g. ``" of the wrapped optimizer"``.

    Returns ``step`` (for ``ops.depend`` ordering). Raises ValueError: ``For '<owner>', the argument
    '<name>'<where> gives <size> values, one per step, but step <step + 1> was requested: ...``.
    """
    index = ops.reshape(step, ())
    if index >= size_tensor:
        raise ValueError(f"For '{owner}', the argument '{name}'{where} gives {size} values, one per step, "
                         f"but step {index + 1} was requested: give at least as many values as steps "
                         f"trained, or use a schedule.")
    return step


def check_weight_decay(weight_decay: Any, cls_name: str, name: str = "weight_decay") -> Any:
    """float/int >= 0 or a Cell (dynamic weight decay, called with the global step).

    Raises:
        TypeError: any other type (bool included).
        ValueError: a negative, NaN or infinite number.
    """
    if isinstance(weight_decay, nn.Cell):
        return weight_decay
    if not v._is_real(weight_decay):  # pylint: disable=protected-access
        raise TypeError(f"For '{cls_name}', the argument '{name}' must be an int, a float or a Cell, "
                        f"but got {v.describe(weight_decay)}.")
    v.check_non_negative(name, weight_decay, cls_name)
    v.check_finite(name, weight_decay, cls_name)
    # a NumPy scalar becomes the Python number mindspore.nn.Optimizer requires (it refuses np.float32)
    return weight_decay if type(weight_decay) in (int, float) else float(weight_decay)


_centralize = C.MultitypeFuncGraph("ms_optim_base_centralize")
_mean_keep_dims = ops.ReduceMean(keep_dims=True)


@_centralize.register("Bool", "Tensor")
def _centralize_tensor(flag: bool, gradient: Tensor) -> Tensor:
    """g - mean(g over axes 1..) for rank > 1 and shape[1] % 16 == 0 when ``flag``; else g."""
    rank = len(F.shape(gradient))
    if flag and rank > 1 and F.shape(gradient)[1] % 16 == 0:
        return gradient - _mean_keep_dims(gradient, tuple(range(1, rank)))
    return gradient


_param_decay = C.MultitypeFuncGraph("ms_optim_base_param_decay")


@_param_decay.register("Tensor", "Tensor", "Bool", "Number")
def _param_decay_number(zero: Tensor, scale: Tensor, flag: bool, weight_decay: float) -> Tensor:
    """A group's fixed weight decay times ``scale`` (0-D float32), or ``zero`` when ``flag`` is False."""
    if flag:
        return F.scalar_to_tensor(weight_decay, mstype.float32) * scale
    return zero


@_param_decay.register("Tensor", "Tensor", "Bool", "Tensor")
def _param_decay_tensor(zero: Tensor, scale: Tensor, flag: bool, weight_decay: Tensor) -> Tensor:
    """A weight-decay Cell's output (any shape holding one value) times ``scale``, or ``zero``."""
    if flag:
        return F.reshape(F.cast(weight_decay, mstype.float32), ()) * scale
    return zero


class _CheckedListLearningRate(_ListScheduleBase):
    """A per-step learning-rate list that raises a clear error past its end (both execution modes).

    Holds the values in a Parameter named as MindSpore names it, so checkpoints are interchangeable.
    """

    def __init__(self, learning_rate: Tensor, name: str, cls_name: str) -> None:
        if _ListScheduleBase is LearningRateSchedule:  # pragma: no cover - MindSpore without the class
            LearningRateSchedule.__init__(self)
            self.learning_rate = Parameter(learning_rate, name)
        else:
            super().__init__(learning_rate, name)  # stores Parameter `self.learning_rate` under `name`
        self.size = int(learning_rate.shape[0])
        self.size_tensor = Tensor(self.size, mstype.int32)
        self.owner = cls_name

    def construct(self, global_step: Tensor) -> Tensor:
        index = check_schedule_length(self.owner, "learning_rate", self.size, self.size_tensor, global_step)
        return ops.gather(self.learning_rate, ops.reshape(index, ()), 0)


class OptimizerBase(nn.Optimizer):
    """Base class of ms_optim's optimizers (a :class:`mindspore.nn.Optimizer`, so a ``Cell``).

    Subclasses call ``super().__init__(learning_rate, params, weight_decay)`` exactly as they would
    call ``mindspore.nn.Optimizer``; argument errors then name ``params``, ``learning_rate`` and
    ``weight_decay`` as the public signatures spell them. ``check_hyper(cls_name)``, if given, checks
    the subclass's own arguments between ``learning_rate`` and ``weight_decay`` (signature order), so
    every argument is checked once, before anything is built.
    """

    def __init__(self, learning_rate: Any, parameters: Any, weight_decay: Any = 0.0, loss_scale: float = 1.0,
                 params_name: str = "params", check_hyper: Optional[Callable[[str], None]] = None) -> None:
        cls_name = type(self).__name__
        parameters = check_params(parameters, cls_name, params_name)
        learning_rate = check_learning_rate(learning_rate, cls_name)
        if check_hyper is not None:  # the subclass's own arguments, in signature order before weight_decay
            check_hyper(cls_name)
        weight_decay = check_weight_decay(weight_decay, cls_name)
        for index, group in enumerate(parameters):
            if isinstance(group, dict):
                if "lr" in group:
                    parameters[index] = group = {**group,
                                                 "lr": check_learning_rate(group["lr"], cls_name, name="lr")}
                if "weight_decay" in group:
                    parameters[index] = group = {**group,
                                                 "weight_decay": check_weight_decay(group["weight_decay"],
                                                                                    cls_name)}
        super().__init__(learning_rate, parameters, weight_decay, loss_scale)
        self._zero_decay = Tensor(0.0, mstype.float32)
        self._unit_scale = Tensor(1.0, mstype.float32)

    # Called by mindspore.nn.Optimizer for the optimizer's and every group's learning rate.
    def _build_single_lr(self, learning_rate: Any, name: str) -> Any:
        if isinstance(learning_rate, Tensor) and learning_rate.ndim == 1:
            return _CheckedListLearningRate(learning_rate, name, self.cls_name)
        return super()._build_single_lr(learning_rate, name)

    def gradients_centralization(self, gradients: Tuple[Tensor, ...]) -> Tuple[Tensor, ...]:
        """Centralize the gradients of groups with ``grad_centralization`` (portable, see module doc)."""
        if self.is_group:
            return self.map_(_centralize, self.grad_centralization_flags, gradients)
        return gradients

    def lr_per_param(self, lrs: Any) -> Tuple[Tensor, ...]:
        """``lrs`` from :meth:`get_lr` as one learning rate per parameter (grouped or not)."""
        if self.is_group_lr:
            return lrs
        return (lrs,) * self.param_length

    def weight_decay_per_param(self) -> Tuple[Tensor, ...]:
        """The weight decay of every parameter for the current step, 0 where it must not decay.

        Follows MindSpore's rules: without groups, parameters whose name contains ``beta`` or
        ``gamma`` get 0; with groups, each group's own value (a number or a Cell called with the
        global step). Every entry is a 0-D float32 Tensor, for unscaled gradients (``loss_scale``
        already divided out).
        """
        decay = self.get_weight_decay()
        if not self.is_group:
            decay = (decay,) * self.param_length
        scale = self.reciprocal_scale if self.need_scale else self._unit_scale
        # one mapped call, not a Python loop: graph mode unrolls a loop with branches into nested
        # calls, which passed MindSpore's call-depth limit (1000) for nets of a few hundred tensors
        return self.map_(F.partial(_param_decay, self._zero_decay, scale), self.decay_flags, decay)
