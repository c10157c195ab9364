"""LARS: layer-wise adaptive rate scaling (You et al., 2017) around any MindSpore optimizer.

Written from ``mindspore.ops`` (MindSpore's own wrapper needs a kernel that CPU lacks). Unlike
MindSpore's wrapper it never changes the optimizer it wraps: see :func:`decay_free_view`.
"""
from __future__ import annotations

from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, jit, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

try:  # MindSpore's per-step learning-rate list (a 1-D Tensor or list given as learning_rate)
    from mindspore.nn.optim.optimizer import _IteratorLearningRate
except ImportError:  # pragma: no cover - only if MindSpore renames its private class
    _IteratorLearningRate = None

from ms_optim import _validation as V
from ms_optim.optim import _fused
from ms_optim.optim._base import OptimizerBase, check_schedule_length
from ms_optim.optim._trust_ratio import l2_norm, trust_ratio

__all__ = ["LARS", "decay_free_view", "default_lars_filter"]


def default_lars_filter(param: Parameter) -> bool:
    """LARS's default filter: scale every parameter except LayerNorm parameters and biases."""
    return "LayerNorm" not in param.name and "bias" not in param.name


def decay_free_view(optimizer: nn.Optimizer) -> nn.Optimizer:
    """A second handle on ``optimizer`` that runs its update rule without weight decay.

    LARS folds the weight decay into the gradient it hands on (``c * (g + wd * w)``), so the wrapped
    optimizer must not add it again. MindSpore switches the decay off on the user's object itself,
    which silently changes that object for any other use. Here the user's object is left as it
    was: the view is a new Cell of the same class whose attributes are the optimizer's, except

    - ``decay_flags`` all False, ``exec_weight_decay``/``dynamic_weight_decay`` False and
      ``weight_decay`` 0 (no decay, whatever the optimizer's update rule does with it);
    - ``need_scale`` False (LARS divides the loss scale out before computing its ratio).

    Every Parameter (weights, moments, learning rate, ``global_step``) and sub-Cell is shared with
    the optimizer, not copied, so the state the view updates is the optimizer's state, and a
    checkpoint of either holds the same values. Container attributes (dicts, lists, sets) are
    shallow-copied so that nothing done to the view reaches the original.
    """
    cls = type(optimizer)
    view = cls.__new__(cls)
    nn.Cell.__init__(view, auto_prefix=False)  # fresh Cell bookkeeping (compile caches, hooks, ids)
    fresh = set(view.__dict__)
    for key, value in optimizer.__dict__.items():
        if key in fresh and key not in ("_params", "_cells", "_params_list", "_primitives", "_buffers"):
            continue
        if isinstance(value, (dict, list, set)):
            value = type(value)(value)
        object.__setattr__(view, key, value)
    n = len(optimizer.parameters)
    view._cells.pop("weight_decay", None)  # a dynamic weight decay Cell; the view's dict only
    zero = Tensor(0.0, ms.float32)
    object.__setattr__(view, "weight_decay", (zero,) * n if optimizer.is_group else zero)
    object.__setattr__(view, "decay_flags", (False,) * n)
    object.__setattr__(view, "dynamic_decay_flags", (False,) * n if optimizer.is_group else False)
    object.__setattr__(view, "dynamic_weight_decay", False)
    object.__setattr__(view, "exec_weight_decay", False)
    object.__setattr__(view, "need_scale", False)
    return view


_lars_gradient = C.MultitypeFuncGraph("ms_optim_lars_gradient")


@_lars_gradient.register("Tensor", "Tensor", "Bool", "Tensor", "Tensor", "Bool", "Bool", "Tensor", "Tensor")
def _lars_gradient_tensor(epsilon, coefficient, use_clip, lr, weight_decay, decay_flag, lars_flag, weight,
                          gradient):
    """``c * (g + wd*w)`` for a parameter LARS keeps, ``g`` unchanged for one it rejects."""
    if lars_flag:
        w = F.cast(weight, ms.float32)
        g = F.cast(gradient, ms.float32)
        w_norm = l2_norm(w)
        g_norm = l2_norm(g)
        if decay_flag:
            update = g + weight_decay * w
            denominator = g_norm + weight_decay * w_norm + epsilon
        else:
            update = g
            denominator = g_norm + epsilon
        ratio = trust_ratio(w_norm, g_norm, denominator, coefficient)
        if use_clip:
            ratio = ops.minimum(ratio / lr, ops.ones_like(ratio))
        return F.cast(ratio * update, F.dtype(gradient))
    return gradient


_lars_momentum = C.MultitypeFuncGraph("ms_optim_lars_momentum")


@_lars_momentum.register("Function", "Function", "Tensor", "Tensor", "Tensor", "Tensor", "Bool", "Tensor",
                         "Tensor", "Tensor")
def _lars_momentum_fused(kernel, apply_momentum, hyper, momentum, lr, weight_decay, lars_flag, weight, accum,
                         gradient):
    """LARS + Momentum for one parameter: the fused kernel for a kept parameter, MindSpore's own
    ApplyMomentum (what nn.Momentum runs) for a rejected one."""
    if lars_flag:
        return F.depend(True, kernel(weight, accum, F.cast(gradient, ms.float32), lr, weight_decay, momentum,
                                     hyper))
    return F.depend(True, apply_momentum(weight, accum, lr, gradient, momentum))


def _checked_lr_steps(optimizer: nn.Optimizer, cls_name: str) -> int:
    """Check the wrapped optimizer's learning-rate values; return how many steps its per-step list(s)
    cover (0 if it has none).

    MindSpore's optimizers accept an empty list and lists holding NaN or negative values (the first
    fails later with a ``Gather`` index error, the others train to NaN); LARS refuses them here.

    Raises:
        ValueError: a list is empty, or a fixed value or list element is NaN, infinite or negative.
    """
    cells = list(optimizer.learning_rate) if optimizer.is_group_lr else [optimizer.learning_rate]
    sizes = []
    for cell in cells:
        if isinstance(cell, Parameter):
            values = cell.asnumpy()
        elif _IteratorLearningRate is not None and isinstance(cell, _IteratorLearningRate):
            values = cell.learning_rate.asnumpy()
            sizes.append(int(values.shape[0]))
        else:
            continue  # a LearningRateSchedule: its values exist only at run time
        values = np.asarray(values, np.float64).reshape(-1)
        if values.size == 0:
            raise ValueError(f"For '{cls_name}', the argument 'learning_rate' of the wrapped optimizer must "
                             f"not be empty, but got [].")
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            index = int(np.argmax(bad))
            raise ValueError(f"For '{cls_name}', the argument 'learning_rate' of the wrapped optimizer must "
                             f"hold finite values >= 0, but element {index} is {float(values[index])!r}.")
    return min(sizes) if sizes else 0


def _fusable_momentum(optimizer: nn.Optimizer) -> bool:
    """Whether LARS may run ``optimizer``'s update itself in the fused kernel: exactly
    ``mindspore.nn.Momentum`` (not a subclass, whose update may differ), float32 parameters, no
    gradient centralization, and the fused kernels available on this device."""
    if type(optimizer) is not nn.Momentum:  # pylint: disable=unidiomatic-typecheck
        return False
    if optimizer.is_group and any(optimizer.grad_centralization_flags):
        return False
    if not all(p.dtype == ms.float32 for p in optimizer.parameters):
        return False
    return _fused.fused_enabled()


class LARS(OptimizerBase):
    r"""LARS: scales each layer's gradient by a layer-wise trust ratio, then runs ``optimizer``.

    For each parameter :math:`w` that ``lars_filter`` keeps, with gradient :math:`g` and the
    wrapped optimizer's weight decay :math:`\lambda` for it (0 where that optimizer's decay filter
    or parameter groups give it none):

    .. math::
        c &= \begin{cases}
              \dfrac{\text{coefficient} \cdot \|w\|}{\|g\| + \lambda \|w\| + \text{epsilon}}
                 & \|w\| > 0 \text{ and } \|g\| > 0 \\
              1 & \text{otherwise} \end{cases} \\
        c &\leftarrow \min(c / \eta, 1) \quad
             \text{if use_clip } (\eta \text{: the optimizer's learning rate}) \\
        g' &= c \, (g + \lambda w)

    and ``optimizer`` then updates :math:`w` from :math:`g'` with its own rule (momentum, Lamb, ...)
    but without adding weight decay again. Parameters the filter rejects reach ``optimizer`` with
    their gradient unchanged and get no weight decay (as in MindSpore). Gradients are divided by
    the optimizer's ``loss_scale`` first. The ratio is computed by the same function as
    :class:`ms_optim.nn.Lamb`'s trust ratio. The algorithm is You, Gitman and Ginsburg, `Large Batch
    Training of Convolutional Networks <https://arxiv.org/abs/1708.03888>`_ (2017).

    The wrapped optimizer is not modified: LARS runs it through a second Cell that shares all of its
    Parameters and state (weights, ``moments.*``, learning rate, ``global_step``) and has the decay
    switched off; ``optimizer`` used on its own afterwards still applies its weight decay as before.
    The optimizer's parameters, learning rate and ``global_step`` are exposed as LARS's own, so
    ``Model``, ``TrainOneStepCell``, learning-rate callbacks and checkpoints see the same names as with
    the optimizer alone.

    Around exactly ``mindspore.nn.Momentum`` on CPU (float32 parameters, no gradient
    centralization) LARS runs ratio, decay and momentum step in one fused kernel per kept parameter
    (the same arithmetic; MindSpore's ``ApplyMomentum`` for rejected parameters; ``use_fused`` tells
    whether it is used, ``MS_OPTIM_FUSED=0`` turns it off) and updates that optimizer's own
    ``moments`` and ``global_step``.

    Args:
        optimizer (Optimizer): the optimizer to wrap (any ``mindspore.nn.Optimizer``: ``nn.Momentum``,
            ``nn.SGD``, ``ms_optim.nn.Lamb``, ...).
        epsilon (float): added to the ratio's denominator. Default: ``1e-05``.
        coefficient (float): the trust coefficient. Default: ``0.001``.
        use_clip (bool): clip the ratio to ``min(c / learning_rate, 1)``. Default: ``False``.
        lars_filter (Callable[[Parameter], bool]): which parameters get LARS scaling. Default:
            ``default_lars_filter``, which keeps every parameter whose name contains neither
            ``LayerNorm`` nor ``bias``.

    Inputs:
        gradients (tuple[Tensor]): the gradients of ``optimizer.parameters``, in their order and shapes.

    Outputs:
        What ``optimizer`` returns.

    Raises:
        TypeError: ``optimizer`` is not a ``mindspore.nn.Optimizer``.
        TypeError: ``epsilon`` or ``coefficient`` is not a float.
        ValueError: ``epsilon`` or ``coefficient`` is negative, NaN or infinite.
        ValueError: the wrapped optimizer's learning rate is an empty list, or holds a NaN, infinite or
            negative value.
        TypeError: ``use_clip`` is not a bool.
        TypeError: ``lars_filter`` is not callable.

    Examples:
        >>> import mindspore as ms
        >>> import ms_optim
        >>> net = ms.nn.Dense(4, 2)
        >>> inner = ms.nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
        >>> opt = ms_optim.nn.LARS(inner, epsilon=1e-5, coefficient=0.001)
        >>> grads = tuple(ms.ops.ones_like(p) for p in net.trainable_params())
        >>> _ = opt(grads)
        >>> inner.decay_flags  # the wrapped optimizer is unchanged
        (True, True)
    """

    def __init__(self, optimizer: nn.Optimizer, epsilon: float = 1e-05, coefficient: float = 0.001,
                 use_clip: bool = False,
                 lars_filter: Callable[[Parameter], bool] = default_lars_filter) -> None:
        cls = type(self).__name__
        V.check_type("optimizer", optimizer, nn.Optimizer, cls, what="a mindspore.nn.Optimizer")
        V.check_float("epsilon", epsilon, cls)
        V.check_float("coefficient", coefficient, cls)
        for name, value in (("epsilon", epsilon), ("coefficient", coefficient)):
            V.check_non_negative(name, value, cls)
            V.check_finite(name, value, cls)
        V.check_bool("use_clip", use_clip, cls)
        V.check_callable("lars_filter", lars_filter, cls)
        # A learning-rate list shorter than training: a clear error before anything is updated
        # (MindSpore's own list lookup in the wrapped optimizer would fail with a Gather index error).
        self.lr_list_steps = _checked_lr_steps(optimizer, cls)
        super().__init__(0.0, [Parameter(Tensor(0.0, ms.float32), name="lars_placeholder")])
        # drop the base class's placeholders: LARS owns no Parameter of its own
        self._params.pop("lars_placeholder", None)
        self._params.pop("learning_rate", None)
        object.__setattr__(self, "_wrapped", optimizer)  # the user's object, kept out of the Cell tree
        self.opt = decay_free_view(optimizer)
        self.parameters = optimizer.parameters
        self._parameters = self.parameters
        self._user_parameters += [param.name for param in self.parameters]
        self.param_length = len(self.parameters)
        self.optim_filter = optimizer.optim_filter
        self.global_step = optimizer.global_step
        self.learning_rate = optimizer.learning_rate
        self.dynamic_lr = optimizer.dynamic_lr
        self.is_group = optimizer.is_group
        self.is_group_lr = optimizer.is_group_lr
        self.decay_flags = optimizer.decay_flags
        self.dynamic_decay_flags = optimizer.dynamic_decay_flags
        self.dynamic_weight_decay = optimizer.dynamic_weight_decay
        self.exec_weight_decay = optimizer.exec_weight_decay
        self.weight_decay = optimizer.weight_decay
        self.loss_scale = optimizer.loss_scale
        self.reciprocal_scale = optimizer.reciprocal_scale
        self.need_scale = optimizer.need_scale
        self.epsilon = Tensor(epsilon, ms.float32)
        self.coefficient = Tensor(coefficient, ms.float32)
        self.use_clip = use_clip
        self.lars_flag = tuple(bool(lars_filter(param)) for param in self.parameters)
        self.owner_name = cls
        self.lr_list_steps_tensor = Tensor(self.lr_list_steps, ms.int32)
        # Around nn.Momentum on CPU: ratio, decay and momentum step in one fused kernel per parameter
        # (ms_optim.optim._fused), the same arithmetic as the composite path below.
        kernel = _fused.lars_momentum_op(optimizer.use_nesterov) if _fusable_momentum(optimizer) else None
        self.use_fused = kernel is not None
        if self.use_fused:
            self.fused_kernel = kernel
            # rejected parameters: the same primitive (and kernel) nn.Momentum runs, a new instance
            # so that not even the wrapped optimizer's primitive gets renamed
            self.apply_momentum = ops.ApplyMomentum(use_nesterov=optimizer.use_nesterov)
            self.fused_hyper = Tensor([coefficient, epsilon, 1.0 if use_clip else 0.0], ms.float32)

    @property
    def optimizer(self) -> nn.Optimizer:
        """The wrapped optimizer, exactly as the user built it."""
        return self._wrapped

    @jit(backend="ms_backend")
    def construct(self, gradients):
        if self.lr_list_steps > 0:
            check_schedule_length(self.owner_name, "learning_rate", self.lr_list_steps,
                                  self.lr_list_steps_tensor, self.global_step,
                                  where=" of the wrapped optimizer")
        # both read before the wrapped optimizer advances global_step
        lrs = self.lr_per_param(self.get_lr())
        wds = self.weight_decay_per_param()  # the wrapped optimizer's, loss scale divided out
        gradients = self.scale_grad(gradients)
        if self.use_fused:
            # the wrapped Momentum's own bookkeeping: it advances global_step after reading its lr
            self.assignadd(self.global_step, self.global_step_increase_tensor)
            return self.hyper_map(F.partial(_lars_momentum, self.fused_kernel, self.apply_momentum,
                                            self.fused_hyper, self.opt.momentum),
                                  lrs, wds, self.lars_flag, self.parameters, self.opt.moments, gradients)
        gradients = self.hyper_map(F.partial(_lars_gradient, self.epsilon, self.coefficient, self.use_clip),
                                   lrs, wds, self.decay_flags, self.lars_flag, self.parameters, gradients)
        return self.opt(gradients)
