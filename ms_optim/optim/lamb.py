"""Lamb: layer-wise adaptive moments (You et al., 2019), written from ``mindspore.ops``.

Runs on CPU, GPU and Ascend (MindSpore's own class needs a fused kernel that exists only on GPU/Ascend).
"""
from __future__ import annotations

from typing import List, Union

import mindspore as ms
from mindspore import Parameter, Tensor, jit, nn, ops
from mindspore.nn.learning_rate_schedule import LearningRateSchedule
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim import _validation as V
from ms_optim.optim import _fused
from ms_optim.optim._base import OptimizerBase
from ms_optim.optim._trust_ratio import l2_norm, trust_ratio

__all__ = ["Lamb"]

_lamb_step = C.MultitypeFuncGraph("ms_optim_lamb_step")


@_lamb_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Bool",
                     "Tensor", "Tensor", "Tensor", "Tensor")
def _lamb_step_tensor(beta1, beta2, eps, bias1, bias2, lr, weight_decay, decay_flag, weight, m, v, gradient):
    """One Lamb step for one parameter (composite ops); returns True after the three assignments."""
    dtype = F.dtype(weight)
    w = F.cast(weight, ms.float32)
    g = F.cast(gradient, ms.float32)
    m_new = beta1 * F.cast(m, ms.float32) + (1.0 - beta1) * g
    v_new = beta2 * F.cast(v, ms.float32) + (1.0 - beta2) * (g * g)
    r = (m_new / bias1) / (ops.sqrt(v_new / bias2) + eps)
    if decay_flag:
        r = r + weight_decay * w
    ratio = trust_ratio(l2_norm(w), l2_norm(r))
    w_new = w - (lr * ratio) * r
    m_new = F.depend(m_new, F.assign(m, F.cast(m_new, F.dtype(m))))
    v_new = F.depend(v_new, F.assign(v, F.cast(v_new, F.dtype(v))))
    return F.depend(True, F.assign(weight, F.cast(w_new, dtype)))


@_lamb_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _lamb_step_fused(kernel, hyper, lr, weight_decay, weight, m, v, gradient):
    """One Lamb step for one parameter in the fused CPU kernel (updates weight, m, v in place)."""
    return F.depend(True, kernel(weight, m, v, F.cast(gradient, ms.float32), lr, weight_decay, hyper))


class Lamb(OptimizerBase):
    r"""Lamb optimizer (Layer-wise Adaptive Moments for Batch training), on every MindSpore backend.

    For each parameter :math:`w` with gradient :math:`g`, at step :math:`t = 1, 2, \dots`:

    .. math::
        m &\leftarrow \beta_1 m + (1 - \beta_1) g \\
        v &\leftarrow \beta_2 v + (1 - \beta_2) g^2 \\
        r &= \frac{m / (1 - \beta_1^t)}{\sqrt{v / (1 - \beta_2^t)} + \epsilon} + \lambda w \\
        w &\leftarrow w - \eta \, \rho \, r, \qquad
        \rho = \begin{cases} \|w\| / \|r\| & \|w\| > 0 \text{ and } \|r\| > 0 \\
                             1 & \text{otherwise} \end{cases}

    with :math:`\eta` the learning rate of the step and :math:`\lambda` the weight decay of the
    parameter (0 for parameters the decay filter excludes); the ratio is not clamped. The norms
    are taken over the whole parameter tensor (layer-wise), and the trust ratio is the same function
    as :class:`ms_optim.nn.LARS`'s. The algorithm is You et al., `Large Batch Optimization for Deep
    Learning: Training BERT in 76 minutes <https://arxiv.org/abs/1904.00962>`_ (ICLR 2020).

    On CPU with float32 parameters the step runs in one fused kernel per parameter (two passes over
    memory; compiled with ``g++`` on first use and cached); ``use_fused`` tells whether it is used,
    and the environment variable ``MS_OPTIM_FUSED=0`` turns it off. Elsewhere, or if the kernel cannot
    be compiled, the step runs as composite ``mindspore.ops``. Both compute the formula above in
    float32.

    A single finite gradient element above about ``1e19`` overflows :math:`g^2` in float32, so
    :math:`v` becomes ``inf`` for good and that parameter's later updates are 0 or NaN (MindSpore's
    Lamb behaves the same). A loss-scale cell that skips non-finite steps guards against it, e.g.
    :class:`ms_optim.nn.TrainOneStepWithLossScaleCell` with a ``DynamicLossScaleManager``: with
    scale :math:`s` a gradient above :math:`3.4 \cdot 10^{38} / s` overflows before it is unscaled, so
    that step is skipped (no state changes), the scale lowered, and the run stays finite.

    State: ``lamb_m.<param name>`` (:math:`m`) and ``lamb_v.<param name>`` (:math:`v`), zeros at
    start, and ``global_step`` (steps taken), the same names as MindSpore's Lamb so checkpoints move
    between the two libraries.

    Args:
        params (Union[list[Parameter], list[dict]]): the parameters to train, or parameter groups:
            dicts with ``"params"`` (required), ``"lr"``, ``"weight_decay"``, ``"grad_centralization"``,
            or a single ``{"order_params": ...}`` dict fixing the order. Without groups, weight decay
            skips parameters whose name contains ``beta`` or ``gamma``.
        learning_rate (Union[float, int, Tensor, Iterable, LearningRateSchedule]): a fixed value
            (>= 0; float, int or 0-D Tensor), or a dynamic one (1-D Tensor or list: entry ``i`` at step
            ``i``; or a ``LearningRateSchedule`` called with the step).
        beta1 (float): decay rate of the first moment, in (0, 1). Default: ``0.9``.
        beta2 (float): decay rate of the second moment, in (0, 1). Default: ``0.999``.
        eps (float): added to the denominator, > 0. Default: ``1e-6``.
        weight_decay (Union[float, int, Cell]): :math:`\lambda`, >= 0, or a Cell returning it for the
            step. Default: ``0.0``.

    Inputs:
        gradients (tuple[Tensor]): the gradients of ``params``, in their order and shapes.

    Outputs:
        tuple[bool]: all ``True``.

    Raises:
        TypeError: ``beta1``, ``beta2`` or ``eps`` is not a float.
        ValueError: ``beta1`` or ``beta2`` is not in (0, 1) (NaN included), or ``eps`` is not > 0 or not
            finite.
        TypeError: ``weight_decay`` is not an int, float or Cell.
        ValueError: ``weight_decay`` is negative, NaN or infinite; ``learning_rate`` (or an element of a
            list or Tensor) is negative, NaN or infinite.
        TypeError: ``learning_rate`` is not one of the types above, or an element of ``params`` is
            neither a Parameter nor a dict.

    Examples:
        >>> import mindspore as ms
        >>> import ms_optim
        >>> net = ms.nn.Dense(4, 2)
        >>> opt = ms_optim.nn.Lamb(net.trainable_params(), learning_rate=0.01, weight_decay=1e-4)
        >>> grads = tuple(ms.ops.ones_like(p) for p in net.trainable_params())
        >>> _ = opt(grads)
        >>> [p.name for p in opt.moments1]
        ['lamb_m.weight', 'lamb_m.bias']
    """

    _support_parallel_optimizer = False

    def __init__(self, params: Union[List[Parameter], List[dict]],
                 learning_rate: Union[float, int, Tensor, list, LearningRateSchedule],
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                 weight_decay: Union[float, int, nn.Cell] = 0.0) -> None:
        def check_hyper(cls: str) -> None:
            V.check_float("beta1", beta1, cls)
            V.check_float("beta2", beta2, cls)
            V.check_float("eps", eps, cls)
            V.check_range("beta1", beta1, 0.0, 1.0, False, False, cls)
            V.check_range("beta2", beta2, 0.0, 1.0, False, False, cls)
            V.check_positive("eps", eps, cls)
            V.check_finite("eps", eps, cls)

        super().__init__(learning_rate, params, weight_decay, check_hyper=check_hyper)
        self.beta1 = Tensor(beta1, ms.float32)
        self.beta2 = Tensor(beta2, ms.float32)
        self.eps = Tensor(eps, ms.float32)
        self._one = Tensor(1.0, ms.float32)
        self.params = self._parameters
        self.moments1 = self.params.clone(prefix="lamb_m", init="zeros")
        self.moments2 = self.params.clone(prefix="lamb_v", init="zeros")
        # The fused CPU kernel (ms_optim.optim._fused) where it applies, else the composite ops.
        kernel = None
        if _fused.fused_enabled() and all(p.dtype == ms.float32 for p in self.params):
            kernel = _fused.lamb_op()
        self.use_fused = kernel is not None
        self.fused_kernel = kernel

    @jit(backend="ms_backend")
    def construct(self, gradients):
        lrs = self.lr_per_param(self.get_lr())
        wds = self.weight_decay_per_param()
        gradients = self.gradients_centralization(gradients)
        gradients = self.scale_grad(gradients)
        # t = this step's number, from the value read before the increment: a read placed after
        # the AssignAdd can be merged with an earlier read of global_step (e.g. a wrapping LARS's
        # learning-rate lookup) and then sees the old value
        t = F.reshape(F.cast(self.global_step, ms.float32), ()) + self._one
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        bias1 = 1.0 - ops.pow(self.beta1, t)
        bias2 = 1.0 - ops.pow(self.beta2, t)
        if self.use_fused:
            hyper = ops.stack((self.beta1, self.beta2, self.eps, bias1, bias2))
            return self.hyper_map(F.partial(_lamb_step, self.fused_kernel, hyper),
                                  lrs, wds, self.params, self.moments1, self.moments2, gradients)
        return self.hyper_map(F.partial(_lamb_step, self.beta1, self.beta2, self.eps, bias1, bias2),
                              lrs, wds, self.decay_flags, self.params, self.moments1, self.moments2,
                              gradients)
