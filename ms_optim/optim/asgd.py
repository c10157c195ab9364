"""ASGD: averaged stochastic gradient descent (Polyak & Juditsky, 1992), written from ``mindspore.ops``.

The update follows what MindSpore 2.x's ASGD *code* computes (its docstring differs): see
:class:`ASGD`. On CPU the weight update runs as one fused in-place MindSpore kernel per parameter
(``ApplyProximalGradientDescent``) instead of four elementwise passes; elsewhere, and with
``MS_OPTIM_FUSED=0``, it runs the composite float32 ops MindSpore's own ASGD runs.
"""
from __future__ import annotations

import math
from typing import List, Union

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, jit, nn, ops
from mindspore.ops import functional as F

from ms_optim import _validation as V
from ms_optim.optim import _fused
from ms_optim.optim._base import OptimizerBase

__all__ = ["ASGD"]


def _fused_update_available() -> bool:
    """The in-place fused weight update is used on CPU (where its kernel is measured and tested),
    unless ``MS_OPTIM_FUSED=0``, and while MindSpore still ships the primitive (deprecated in 2.10).
    Elsewhere ASGD runs the composite float32 ops, as MindSpore's own ASGD does."""
    return _fused.fused_switch_on() and hasattr(ops, "ApplyProximalGradientDescent")


class ASGD(OptimizerBase):
    r"""Averaged Stochastic Gradient Descent, as MindSpore's ASGD computes it, on every backend.

    With :math:`t` the step number *after* it is incremented (1 at the first call), :math:`\eta_0
    = lr_1`, learning rate :math:`lr_t` of step :math:`t` (``get_lr()`` before the increment),
    :math:`\lambda` = ``lambd``, :math:`\lambda_w` the weight decay of the parameter (0 where the
    decay filter excludes it) and gradient :math:`g`:

    .. math::
        w &\leftarrow w\,(1 - \lambda\,\eta_{t-1}) - \eta_{t-1}\,(g + \lambda_w w) \\
        ax &\leftarrow \begin{cases} w & \mu_{t-1} = 1 \\
                                    ax + (w - ax)\,\mu_{t-1} & \text{otherwise} \end{cases} \\
        \eta_t &= \frac{lr_t}{(1 + \lambda\, lr_t\, t)^{\alpha}} \\
        \mu_t &= \frac{1}{\max(1,\ t - t_0)}

    (:math:`\eta` and :math:`\mu` of step :math:`t` are stored for step :math:`t+1`; at step 1,
    :math:`\eta_0 = lr_1`, :math:`\mu_0 = 1`.) MindSpore's docstring writes
    :math:`\eta_t = 1/(1+\lambda\, lr\, t)^\alpha` and :math:`ax_t = (w_t - ax_{t-1})\mu_{t-1}`;
    its code, and this class, compute the formulas above. The averaging is Polyak and Juditsky's,
    `Acceleration of Stochastic Approximation by Averaging <https://doi.org/10.1137/0330046>`_
    (SIAM J. Control Optim., 1992).

    On CPU, for float32 parameters, the first line runs as one fused in-place kernel,
    ``ApplyProximalGradientDescent`` with :math:`l_1 = 0`, :math:`l_2 = \lambda + \lambda_w` and step
    :math:`a = \eta / (1 - l_2\eta)`, because :math:`(w - a g) / (1 + a l_2) = (1 - l_2 \eta) w - \eta g`
    exactly (equal to float32 rounding; :math:`1 - l_2\eta = 0` is replaced by :math:`2^{-24}`);
    ``use_fused`` tells whether it is used, and the environment variable ``MS_OPTIM_FUSED=0`` turns
    it off. Elsewhere (other devices, other dtypes) the update is computed in float32 with
    composite ops and cast back, as MindSpore does. Where a group enables
    ``grad_centralization``, its weight decay is added to the gradient before centralizing, as in
    MindSpore.

    State (MindSpore's names, so checkpoints move between the libraries): ``ax_.<param name>``
    (averaged parameter, zeros at start), ``eta_<param name>`` and ``mu_<param name>`` (0-D
    float32, 0 and 1 at start), and ``global_step``.

    Args:
        params (Union[list[Parameter], list[dict]]): the parameters to train, or parameter groups:
            dicts with ``"params"`` (required), ``"lr"``, ``"weight_decay"``, ``"grad_centralization"``,
            or a single ``{"order_params": ...}`` dict fixing the order. Without groups, weight decay
            skips parameters whose name contains ``beta`` or ``gamma``.
        learning_rate (Union[float, int, Tensor, Iterable, LearningRateSchedule]): a fixed value
            (>= 0; float, int or 0-D Tensor), or a dynamic one (1-D Tensor or list: entry ``i`` at step
            ``i + 1``; or a ``LearningRateSchedule`` called with the step). Default: ``0.1``.
        lambd (float): the decay term :math:`\lambda`, >= 0. Default: ``1e-4``.
        alpha (float): the power :math:`\alpha` in the :math:`\eta` update, >= 0. Default: ``0.75``.
        t0 (float): the step :math:`t_0` after which averaging starts. Default: ``1e6``.
        weight_decay (Union[float, int, Cell]): :math:`\lambda_w`, >= 0, or a Cell returning it for the
            step. Default: ``0.0``.

    Inputs:
        gradients (tuple[Tensor]): the gradients of ``params``, in their order and shapes.

    Outputs:
        bool: ``True``.

    Raises:
        TypeError: an element of ``params`` is neither a Parameter nor a dict.
        TypeError: ``learning_rate`` is not an int, float, Tensor, Iterable or LearningRateSchedule.
        ValueError: ``learning_rate`` (or an element of a list or Tensor) is negative, NaN or infinite, or a
            learning-rate list is shorter than the steps trained.
        TypeError: ``lambd``, ``alpha`` or ``t0`` is not a float.
        ValueError: ``lambd`` or ``alpha`` is negative, NaN or infinite; ``t0`` is NaN or ``-inf``.
        TypeError: ``weight_decay`` is not an int, float or Cell.
        ValueError: ``weight_decay`` is negative, NaN or infinite.

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> net = nn.Dense(4, 2)
        >>> opt = nn.ASGD(net.trainable_params(), learning_rate=0.1)
        >>> grads = tuple(ms.ops.ones_like(p) for p in net.trainable_params())
        >>> _ = opt(grads)
        >>> [p.name for p in opt.ax]
        ['ax_.weight', 'ax_.bias']
    """

    _support_parallel_optimizer = False

    def __init__(self, params: Union[List[Parameter], List[dict]],
                 learning_rate: Union[float, int, Tensor, list, nn.LearningRateSchedule] = 0.1,
                 lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: Union[float, int, nn.Cell] = 0.0) -> None:
        def check_hyper(cls: str) -> None:
            V.check_float("lambd", lambd, cls)
            V.check_float("alpha", alpha, cls)
            V.check_float("t0", t0, cls)
            for name, value in (("lambd", lambd), ("alpha", alpha)):
                V.check_non_negative(name, value, cls)
                V.check_finite(name, value, cls)
            # t0 = +inf means "never average" (meaningful); NaN or -inf has no meaning
            V.check_range("t0", t0, low=-math.inf, low_inclusive=False, cls_name=cls)

        super().__init__(learning_rate, params, weight_decay, check_hyper=check_hyper)
        self.lambd = lambd
        self.alpha = alpha
        self.t0 = Tensor(t0, ms.float32)
        self.lambd_tensor = Tensor(lambd, ms.float32)
        self.mu = ParameterTuple([Parameter(Tensor(1.0, ms.float32), name="mu_" + p.name)
                                  for p in self._parameters])
        self.eta = ParameterTuple([Parameter(Tensor(0.0, ms.float32), name="eta_" + p.name)
                                   for p in self._parameters])
        self.ax = self._parameters.clone(prefix="ax_", init="zeros")
        gc_flags = self.grad_centralization_flags if self.is_group else (False,) * self.param_length
        # Static per-parameter choices, resolved before compiling.
        fusable = _fused_update_available()
        self._fused = tuple(fusable and p.dtype == ms.float32 for p in self._parameters)
        self.use_fused = any(self._fused)
        self._decay_in_grad = tuple(bool(self.exec_weight_decay and d and gc)
                                    for d, gc in zip(self.decay_flags, gc_flags))
        self._decay_in_l2 = tuple(bool(self.exec_weight_decay and d and not gc)
                                  for d, gc in zip(self.decay_flags, gc_flags))
        self._any_decay_in_grad = any(self._decay_in_grad)
        self._zero = Tensor(0.0, ms.float32)
        self._one = Tensor(1.0, ms.float32)
        self.prox = ops.ApplyProximalGradientDescent() if self.use_fused else None
        self._l2_decay_mask = Tensor([1.0 if d else 0.0 for d in self._decay_in_l2], ms.float32)
        self._l2_lambd_only = Tensor([lambd] * self.param_length, ms.float32)

    @jit(backend="ms_backend")
    def construct(self, gradients):
        lrs = self.lr_per_param(self.get_lr())
        wds = self.weight_decay_per_param()
        gradients = self.scale_grad(gradients)
        if self._any_decay_in_grad:
            decayed = ()
            for i in range(self.param_length):
                grad = gradients[i]
                if self._decay_in_grad[i]:
                    grad = grad + F.cast(wds[i], F.dtype(grad)) * self._parameters[i]
                decayed = decayed + (grad,)
            gradients = decayed
        gradients = self.gradients_centralization(gradients)
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        step = F.reshape(self.global_step, ())
        t = F.cast(step, ms.float32)

        # Scalars of all parameters at once, as (n,) vectors: a few kernels instead of a few per parameter.
        lr_now = ops.stack(lrs) if self.is_group_lr else lrs[0]
        eta = ops.where(step == 1, lr_now, ops.stack(self.eta))  # eta_0 = lr_1
        if self.exec_weight_decay:
            l2 = self.lambd_tensor + ops.stack(wds) * self._l2_decay_mask
        else:
            l2 = self._l2_lambd_only
        keep = self._one - l2 * eta
        etas = ops.unstack(eta)
        l2s = ops.unstack(l2)
        eta_next = self._one * lr_now / ops.pow(self._one + self.lambd * lr_now * t, self.alpha)
        eta_next = ops.unstack(eta_next) if self.is_group_lr else (eta_next,) * self.param_length
        mu_next = self._one / ops.maximum(self._one, t - self.t0)

        # The fused kernel computes (w - a g) / (1 + a l2) with a = eta / keep, which equals
        # w keep - eta g; for keep <= 0 (l2 eta >= 1, a diverging run) 1 + a l2 cancels in float32, so
        # that step takes the composite form for every parameter (one test for the whole step).
        if ops.all(keep > self._zero):
            step_sizes = ops.unstack(eta / keep)
            for i in range(self.param_length):
                if self._fused[i]:
                    self.prox(self._parameters[i], step_sizes[i], self._zero, l2s[i], gradients[i])
                else:
                    self._composite_update(self._parameters[i], etas[i], l2s[i], gradients[i])
        else:
            for i in range(self.param_length):
                self._composite_update(self._parameters[i], etas[i], l2s[i], gradients[i])
        # Before averaging starts (every step up to t0 + 1) all mu are 1 and stay 1: ax = w by plain
        # copies and no mu to write; one test for all parameters decides.
        if ops.logical_and(ops.all(ops.stack(self.mu) == self._one), mu_next == self._one):
            for i in range(self.param_length):
                F.assign(self.ax[i], self._parameters[i])
        else:
            for i in range(self.param_length):
                self._average(self.ax[i], self._parameters[i], self.mu[i])
                F.assign(self.mu[i], mu_next)
        for i in range(self.param_length):
            F.assign(self.eta[i], eta_next[i])
        return True

    def _composite_update(self, param, eta, l2, grad):
        """w = w (1 - l2 eta) - eta g, in float32."""
        w32 = F.cast(param, ms.float32)
        F.assign(param, F.cast(w32 * (self._one - l2 * eta) - eta * F.cast(grad, ms.float32), F.dtype(param)))

    def _average(self, ax, param, mu):
        """ax = w if mu == 1 else ax + (w - ax) * mu (in float32)."""
        if mu != self._one:
            F.assign(ax, F.cast(ops.lerp(F.cast(ax, ms.float32), F.cast(param, ms.float32), mu), F.dtype(ax)))
        else:
            F.assign(ax, param)
