r"""``thor(..., damping="adaptive")``: THOR's damping from a Levenberg-Marquardt rule on the reduction ratio.

The damping ``d`` becomes optimizer state (``AdaptiveDamping.value``, the Parameter ``thor_damping``) instead
of a schedule. With ``f = frequency``, ``T = adapt_every``, ``[d_min, d_max] = damping_bounds``,
``omega = (19/20) ** T`` (Martens & Grosse's decay), on step ``t``:

.. code-block:: text

    if d is not set yet (the first step, a THOR step):         # the initial-damping heuristic
        p_l  <- (tr(A_l) / n_A,l) * (tr(G_l) / n_G,l)          # mean eigenvalue of layer l's A_l (x) G_l
        d    <- 10 * exp(mean of log p_l over the layers with a finite p_l > 0)   (0.03 if there is none)
        d    <- max(d, 0.03)         # small factors (small weights) must not start THOR nearly undamped
        d    <- mean over data-parallel ranks of d;  d <- clip(d, d_min, d_max)
    lam  <- sqrt(d)
    re-invert every layer if t % f == 0 (THOR's schedule) or d != d_inv (d changed since the last inversion;
        the stored factors of the last THOR step are re-inverted with the new damping); then d_inv <- d
    the update, as THOR's (momentum, weight decay, clipping, KL clipping)
    if (t + 1) % T == 0:                                        # an adaptation step
        q    <- the quadratic model's change for this step's update (ms_optim._thor.quad_model)
        L0   <- the loss of this step (before the update);  L1 <- the loss on the same batch after it
        (L0, L1, q) <- their means over data-parallel ranks (every rank decides alike)
        rho  <- (L1 - L0) / q                                   (-100 if not finite: counts as a failure)
        d    <- d                               if L0, L1, q finite, |L1 - L0| and |q| <= eps max(|L0|, |L1|)
                clip(d / omega, d_min, d_max)   if rho < 1/4    (the model over-promised: damp more)
                clip(d * omega, d_min, d_max)   if rho > 3/4    (the model is trustworthy: damp less)
                d                               otherwise

With ``learning_rate="adaptive"`` the ratio is the trial's against its calibrated model and the damping never
falls below the first step's (``ms_optim._thor.adaptive_lr``, :meth:`AdaptiveDamping.adapt_calibrated`).

``eps = RESOLUTION`` (2**-16, about 128 float32 units in the last place of the loss): a step whose predicted
and measured loss changes are both that small is below what a float32 loss resolves (a zero learning rate,
a converged net), so its ratio is rounding noise and tells nothing about the damping.

The new damping acts from step ``t + 1`` on: its inverses are recomputed then (from the stored factors, a THOR
step's inversion without a factor collection), so every adaptation that changes ``d`` costs one inversion,
and ``adapt_every = frequency`` costs none (the change lands on the next THOR step). With
``trace_thresholds`` the trace rule still decides per layer; a layer whose factors did not change since its
last inversion is then not re-inverted for a new damping.

Where L1 comes from. An ``nn.Optimizer`` sees gradients, not the batch, so the extra forward pass lives in
the training cell, after the optimizer: :class:`~ms_optim._thor.probe.LossProbe`, which ms_optim's
``TrainOneStepCell`` and ``TrainOneStepWithLossScaleCell`` (``ms_optim.nn``) and therefore ``ModelThor`` build
around an adaptive THOR optimizer, runs the network on the step's inputs when the step was an adaptation step
and calls :meth:`AdaptiveDamping.adapt` with both losses. Building such a cell marks the rule ``bound``; a
THOR optimizer with adaptive damping stepped by any other cell (MindSpore's own ``nn.TrainOneStepCell`` or
``Model``) raises RuntimeError when its step is compiled, before any parameter changes: it is never silently
left without its measurement. The extra pass is the network's forward on the same batch in training mode (so
BatchNorm's moving statistics see the batch a second time, and dropout draws new masks); on a step that
overflowed under loss scaling nothing runs, as for the optimizer.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.parallel import RankMean
from ms_optim._thor.probe import unbound_message
from ms_optim._thor.quad_model import model_term, predicted_change
from ms_optim._thor.trace import factor_trace

__all__ = ["AdaptiveDamping", "LOWER_RATIO", "UPPER_RATIO", "DECAY_PER_STEP", "INITIAL_SCALE",
           "FALLBACK_DAMPING", "FAILED_RATIO", "RESOLUTION", "adaptation_factor", "scalar_parameter",
           "unresolved"]

_NAME = "thor"
#: below it the damping rises, above UPPER_RATIO it falls (Martens & Grosse's 1/4 and 3/4)
LOWER_RATIO = 0.25
UPPER_RATIO = 0.75
#: omega = DECAY_PER_STEP ** adapt_every
DECAY_PER_STEP = 19.0 / 20.0
#: the initial damping is this times the geometric mean over the layers of tr(A)/n_A * tr(G)/n_G
INITIAL_SCALE = 10.0
#: the initial damping's floor (the scale of MindSpore's published THOR recipes' initial damping,
#: 0.02 to 0.03);
#: also the initial damping when no layer has a positive finite trace product (all factors zero)
FALLBACK_DAMPING = 0.03
#: the ratio recorded when (L1 - L0) / q is not finite
FAILED_RATIO = -100.0
#: a loss change at most this times the loss is rounding noise of a float32 loss (about 128 units in the
#: last place): a step whose predicted and measured changes are both that small measures nothing
RESOLUTION = 2.0 ** -16

UNBOUND_MESSAGE = unbound_message("damping='adaptive'", "the loss after each adapted step")


def unresolved(change, predicted, loss_before, loss_after):
    """Whether a step's loss change is below the float32 loss's resolution: both losses and ``predicted``
    finite and ``|change|, |predicted| <= RESOLUTION * max(|loss_before|, |loss_after|)`` (float32 scalars).
    Such a step's measurement (a reduction ratio, a curvature) is rounding noise."""
    finite = ops.logical_and(ops.logical_and(ops.isfinite(loss_before), ops.isfinite(loss_after)),
                             ops.isfinite(predicted))
    resolution = RESOLUTION * ops.maximum(ops.abs(loss_before), ops.abs(loss_after))
    small = ops.logical_and(ops.abs(change) <= resolution, ops.abs(predicted) <= resolution)
    return ops.logical_and(finite, small)


def adaptation_factor(adapt_every: int) -> float:
    """``omega = (19/20) ** adapt_every``: the factor one adaptation multiplies or divides the damping by."""
    return DECAY_PER_STEP ** int(adapt_every)


class AdaptiveDamping(nn.Cell):
    """The damping rule of ``damping="adaptive"`` (module docstring), built with the optimizer.

    The optimizer's step calls it as every damping rule (``damping.ScheduledDamping`` is the other):
    ``rule(step, anchor, factor_loss_scale)`` -> the damping of this step; ``rule.refresh(thor_step, d)`` ->
    whether to invert; ``rule.inversion_scale(thor_step, factor_loss_scale, d)`` inside the inversion branch;
    ``rule.after_update(success, step, gradients, lr, moments)`` after the update. The training cell's probe
    calls :meth:`due_after` and :meth:`adapt` (``learning_rate="adaptive"``'s step: :meth:`adapt_calibrated`).

    State (float32 Parameters of shape (), in checkpoints): ``value`` (``thor_damping``, -1 until the first
    step sets it), ``start`` (``thor_initial_damping``: the first step's damping, the floor of
    :meth:`adapt_calibrated`), ``inverted`` (``thor_inverted_damping``: the damping of the stored inverses),
    ``curvature_scale`` (``thor_curvature_loss_scale``: the loss scale the stored G carries), ``predicted``
    (``thor_predicted_change``: q of the last adaptation step), ``ratio`` (``thor_reduction_ratio``: its rho)
    and ``loss_change`` (``thor_loss_change``: its L1 - L0, averaged over ranks).
    """

    needs_probe = True

    def __init__(self, config: ThorConfig, layers: Sequence, treatments: Tuple, batch_size: float):
        super().__init__(auto_prefix=False)
        self.bound = False  # set by probe.loss_probe_for: a training cell that runs the extra pass was built
        self.adapt_every = int(config.adapt_every)
        self.every_tensor = Tensor([self.adapt_every], mstype.int32)
        self.zero_step = Tensor([0], mstype.int32)
        self.one_step = Tensor([1], mstype.int32)
        low, high = config.damping_bounds
        self.low = Tensor(low, mstype.float32)
        self.high = Tensor(high, mstype.float32)
        omega = adaptation_factor(self.adapt_every)
        self.omega = Tensor(omega, mstype.float32)
        self.inverse_omega = Tensor(1.0 / omega, mstype.float32)
        self.one = Tensor(1.0, mstype.float32)
        self.failed = Tensor(FAILED_RATIO, mstype.float32)
        self.value = scalar_parameter(-1.0, "thor_damping")
        self.start = scalar_parameter(-1.0, "thor_initial_damping")
        self.inverted = scalar_parameter(-1.0, "thor_inverted_damping")
        self.curvature_scale = scalar_parameter(config.loss_scale, "thor_curvature_loss_scale")
        self.predicted = scalar_parameter(0.0, "thor_predicted_change")
        self.ratio = scalar_parameter(0.0, "thor_reduction_ratio")
        self.loss_change = scalar_parameter(0.0, "thor_loss_change")
        self.num_layers = len(layers)
        self.layer_a = tuple(layer.matrix_a_cov for layer in layers)
        self.layer_g = tuple(layer.matrix_g_cov for layer in layers)
        self.a_diagonal = tuple(bool(layer.spec.a_diagonal) for layer in layers)
        self.a_dims = tuple(float(layer.a_dim) for layer in layers)
        self.g_dims = tuple(float(layer.g_dim) for layer in layers)
        self.treatments = treatments
        self.hyper_map = ops.HyperMap()
        self.batch_size = float(batch_size)
        self.mean_over_ranks = RankMean(config.ranks)

    def bind(self) -> None:
        """Mark the rule as stepped by a training cell that runs the extra forward pass (``probe.py``)."""
        self.bound = True

    def set_param_factors(self, a_factors: Tuple, g_factors: Tuple) -> None:
        """Each trainable parameter's layer's stored factors (a placeholder for a parameter of no THOR layer),
        in the optimizer's parameter order: what the quadratic model reads."""
        self.param_a = a_factors
        self.param_g = g_factors

    def _initial(self, anchor, factor_loss_scale):
        """The initial-damping heuristic (module docstring), from the factors this step's backward stored."""
        unscale = ops.reciprocal(ops.square(factor_loss_scale))
        log_sum = ops.zeros((), mstype.float32)
        count = ops.zeros((), mstype.float32)
        for i in range(self.num_layers):
            a_trace = factor_trace(ops.depend(self.layer_a[i], anchor), self.a_diagonal[i]) / self.a_dims[i]
            g_trace = factor_trace(ops.depend(self.layer_g[i], anchor), False) * unscale / self.g_dims[i]
            product = a_trace * g_trace
            usable = ops.logical_and(ops.isfinite(product), product > 0)
            logged = ops.log(ops.select(usable, product, self.one))
            log_sum = log_sum + ops.select(usable, logged, 0.0 * self.one)
            count = count + ops.cast(usable, mstype.float32)
        guess = INITIAL_SCALE * ops.exp(log_sum / ops.maximum(count, self.one))
        guess = ops.select(count > 0, guess, FALLBACK_DAMPING * self.one)
        guess = ops.maximum(guess, FALLBACK_DAMPING * self.one)  # small factors must not mean a tiny damping
        guess = ops.reshape(self.mean_over_ranks(ops.reshape(guess, (1,))), ())
        return ops.minimum(ops.maximum(guess, self.low), self.high)

    def construct(self, step, anchor, factor_loss_scale):
        """The damping of this step: the rule's value, set by the heuristic on the first step."""
        if not self.bound:
            raise RuntimeError(UNBOUND_MESSAGE)
        damping = self.value * 1.0
        if damping < 0:
            damping = self._initial(anchor, factor_loss_scale)
            damping = F.depend(damping, ops.assign(self.value, damping))
            damping = F.depend(damping, ops.assign(self.start, damping))
        return damping

    def refresh(self, thor_step, damping):
        """Invert on THOR steps and whenever the damping differs from the stored inverses' damping."""
        return ops.logical_or(thor_step, ops.not_equal(damping, self.inverted))

    def inversion_scale(self, thor_step, factor_loss_scale, damping):
        """The loss scale the stored G carries (this step's on a THOR step, else the last THOR step's);
        records it and the damping being inverted with."""
        scale = ops.select(thor_step, ops.reshape(factor_loss_scale, ()), self.curvature_scale * 1.0)
        scale = F.depend(scale, ops.assign(self.curvature_scale, scale))
        return F.depend(scale, ops.assign(self.inverted, damping))

    def after_update(self, success, step, gradients, lr, moments):
        """On an adaptation step, q of the update just made (``quad_model``), stored in ``predicted``."""
        if ops.all(ops.equal(ops.floor_mod(step + self.one_step, self.every_tensor), self.zero_step)):
            lr32 = ops.reshape(ops.cast(lr, mstype.float32), ())
            scale = ops.depend(self.curvature_scale * 1.0, success)
            unscale = ops.reciprocal(ops.square(scale))
            terms = self.hyper_map(F.partial(model_term, lr32, unscale, self.batch_size), self.treatments,
                                   gradients, moments, self.param_a, self.param_g)
            success = F.depend(success, ops.assign(self.predicted, predicted_change(terms)))
        return success

    def due_after(self, global_step):
        """Whether the step just taken (``global_step`` is its successor's index) was an adaptation step."""
        return ops.all(ops.equal(ops.floor_mod(global_step, self.every_tensor), self.zero_step))

    def adapt(self, loss_before, loss_after):
        """The reduction ratio of the adaptation step just taken and the Levenberg-Marquardt update of the
        damping (module docstring); returns the new damping."""
        values = ops.stack([ops.reshape(ops.cast(loss_before, mstype.float32), ()),
                            ops.reshape(ops.cast(loss_after, mstype.float32), ()), self.predicted * 1.0])
        values = self.mean_over_ranks(values)
        change = values[1] - values[0]
        ratio = change / values[2]
        ratio = ops.select(ops.isfinite(ratio), ratio, self.failed)
        noise = unresolved(change, values[2], values[0], values[1])
        return self._moved(ratio, change, values[2], noise, self.low)

    def adapt_calibrated(self, ratio, change, predicted, noise):
        """The update of ``learning_rate="adaptive"``'s step, from its trial's ratio against the calibrated
        model (``ms_optim._thor.adaptive_lr``; already averaged over the ranks): as :meth:`adapt`'s, but the
        damping never falls below ``start``, the first step's damping (nor below the lower bound). State
        restored from a checkpoint without ``start`` (it is still -1) takes the damping it resumed with as its
        start, so the floor stays a damping this run trained with, not the lower bound."""
        start = ops.select(self.start < 0, self.value * 1.0, self.start * 1.0)
        start = F.depend(start, ops.assign(self.start, start))
        return self._moved(ratio, change, predicted, noise, ops.maximum(start, self.low))

    def _moved(self, ratio, change, predicted, noise, low):
        """The Levenberg-Marquardt update from a reduction ratio: the damping times ``1/omega`` (ratio below
        1/4), ``omega`` (above 3/4) or 1, and 1 where ``noise`` (the step's change is below the loss's
        resolution, :func:`unresolved`), clipped to ``[low, high]``; records ``ratio``, ``change`` and
        ``predicted``; returns the new damping."""
        factor = ops.select(ratio < LOWER_RATIO, self.inverse_omega,
                            ops.select(ratio > UPPER_RATIO, self.omega, self.one))
        factor = ops.select(noise, self.one, factor)
        damping = ops.minimum(ops.maximum(self.value * factor, low), self.high)
        done = ops.assign(self.ratio, ratio)
        done = F.depend(done, ops.assign(self.loss_change, change))
        done = F.depend(done, ops.assign(self.predicted, predicted))
        return F.depend(damping, F.depend(ops.assign(self.value, damping), done))


def scalar_parameter(value: float, name: str) -> Parameter:
    """A float32 Parameter of shape () holding ``value``, not trained."""
    value = np.float32(value if math.isfinite(value) else 0.0)
    return Parameter(Tensor(value), name=name, requires_grad=False)
