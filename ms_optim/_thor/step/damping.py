r"""THOR's damping rules, one chosen when the optimizer is built: the schedule, or Levenberg-Marquardt.

Both answer the optimizer's step alike: ``rule(step, anchor, factor_loss_scale)`` -> the damping ``d`` of step
``step`` (float32 scalar; ``anchor`` orders reads of the factors after the backward pass);
``rule.refresh(thor_step, d)`` -> whether this step inverts; inside the inversion branch,
``rule.settled(d, anchor, factor_loss_scale)`` -> the damping to invert with (and of the step) and
``rule.inversion_scale(factor_loss_scale, curvature_loss_scale, d)`` -> the loss scale the G being inverted
carries.

* :class:`ScheduledDamping` (a damping Tensor, MindSpore's THOR): ``d = damping[t]`` (a 0-D Tensor: the same
  every step); inverses refreshed on THOR steps only.
* :class:`LevenbergMarquardt` (``damping="adaptive"``): ``d`` is state. With ``T = adapt_every``, ``[d_min,
  d_max] = damping_bounds`` and ``omega = (19/20) ** T`` (Martens & Grosse's decay):

.. code-block:: text

    first step (a THOR step):   p_l = (tr(A_l) / n_A,l) (tr(G_l) / n_G,l)   (mean eigenvalue of A_l (x) G_l)
                                d = max(10 exp(mean of log p_l over the finite p_l > 0), 0.03)  (0.03 if none)
                                d = clip(mean over data-parallel ranks of d, d_min, d_max)
    every step:                 invert when t % f == 0 or d differs from the stored inverses' damping
    after an adaptation step (t + 1) % T == 0, from the step rule's measurement (rho, L1 - L0, q, noise):
                                d = d                                   on a noise step (below the loss's
                                                                        float32 resolution: ``unresolved``)
                                d = clip(d / omega, floor, d_max)       if rho < 1/4
                                d = clip(d * omega, floor, d_max)       if rho > 3/4
    after a step taken back (``momentum_rule.py``: it raised the loss on its batch, or overshot):
                                d = clip(d * max(r, the factor above), floor, d_max)
                                r = 2 after a kept step, doubled by each step taken back in a row

  ``floor`` is ``d_min`` with a learning-rate schedule; with ``learning_rate="adaptive"`` it is the first
  step's damping (``start``: the ratio of a step calibrated on its batch cannot tell that the damping is too
  small, so the damping only rises from there and falls back while the trials keep their promise).
  :meth:`adapt` is the one entry point of the update; the step rules (``momentum_rule.py``,
  ``quadratic_rule.py``) measure ``rho``.

The new damping acts from step ``t + 1`` on: its inverses are recomputed then (from the stored factors), so an
adaptation that changes ``d`` costs one inversion. State (float32 Parameters of shape (), in checkpoints):
``value`` (``thor_damping``, -1 until the first step sets it), ``start`` (``thor_initial_damping``),
``inverted`` (``thor_inverted_damping``: the damping of the stored inverses), ``predicted``
(``thor_predicted_change``: q of the last measured step), ``ratio`` (``thor_reduction_ratio``) and
``loss_change`` (``thor_loss_change``), each recorded finite (``FAILED_RATIO`` or 0 for a number that is
not), ``growth`` (``thor_rejection_growth``: ``r``) and ``rejected_steps`` (``thor_rejected_steps``, int32:
the steps taken back).

Why ``r`` escalates rather than being large from the start: one step that raised its batch's loss is often
a noisy batch meeting a refreshed inverse, and a damping raised tenfold by it stays too high for hundreds of
steps (the Levenberg-Marquardt factor brings it back by ``omega`` per adaptation); a learning rate that is
really too large is rejected again and again, and the doubling ``r`` then outgrows it within a few steps
(Nielsen's rule for Levenberg-Marquardt steps).
"""
from __future__ import annotations

import math
from typing import Sequence

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion.trace import factor_trace
from ms_optim._thor.modes import Mode
from ms_optim._thor.parallel import RankMean

__all__ = ["ScheduledDamping", "LevenbergMarquardt", "build_damping_rule", "scalar_parameter", "unresolved",
           "adaptation_factor", "LOWER_RATIO", "UPPER_RATIO", "DECAY_PER_STEP", "INITIAL_SCALE",
           "FALLBACK_DAMPING", "FAILED_RATIO", "REJECTED_GROWTH", "RESOLUTION", "raised_loss"]

#: below it the damping rises, above UPPER_RATIO it falls (Martens & Grosse's 1/4 and 3/4)
LOWER_RATIO = 0.25
UPPER_RATIO = 0.75
#: omega = DECAY_PER_STEP ** adapt_every
DECAY_PER_STEP = 19.0 / 20.0
#: the initial damping is this times the geometric mean over the layers of tr(A)/n_A * tr(G)/n_G
INITIAL_SCALE = 10.0
#: the initial damping's floor (the scale of MindSpore's published THOR recipes' initial damping), and the
#: initial damping when no layer has a positive finite trace product (all factors zero)
FALLBACK_DAMPING = 0.03
#: the ratio recorded when it is not a finite number
FAILED_RATIO = -100.0
#: a step that was not kept (it raised the loss on its own batch, or gave none) after a kept step multiplies
#: the damping by at least this; each further step not kept in a row doubles the factor
REJECTED_GROWTH = 2.0
#: a loss change at most this times the loss is rounding noise of a float32 loss (about 128 units in the last
#: place): a step whose predicted and measured changes are both that small measures nothing
RESOLUTION = 2.0 ** -16


def _finite(value, fallback):
    """``value`` where finite, else ``fallback`` (a record a checkpoint keeps holds no NaN or inf)."""
    return ops.select(ops.isfinite(value), value, fallback)


def scalar_parameter(value: float, name: str) -> Parameter:
    """A float32 Parameter of shape () holding ``value``, not trained."""
    value = np.float32(value if math.isfinite(value) else 0.0)
    return Parameter(Tensor(value), name=name, requires_grad=False)


def unresolved(change, predicted, loss_before, loss_after):
    """Whether a step's loss change is below the float32 loss's resolution: both losses and ``predicted``
    finite and ``|change|, |predicted| <= RESOLUTION * max(|loss_before|, |loss_after|)``."""
    finite = ops.logical_and(ops.logical_and(ops.isfinite(loss_before), ops.isfinite(loss_after)),
                             ops.isfinite(predicted))
    resolution = RESOLUTION * ops.maximum(ops.abs(loss_before), ops.abs(loss_after))
    small = ops.logical_and(ops.abs(change) <= resolution, ops.abs(predicted) <= resolution)
    return ops.logical_and(finite, small)


def raised_loss(loss_before, loss_after):
    """Whether a step raised the loss on its own batch: ``loss_after`` not finite, or above ``loss_before`` by
    more than the float32 loss's resolution (``RESOLUTION`` of the larger)."""
    resolution = RESOLUTION * ops.maximum(ops.abs(loss_before), ops.abs(loss_after))
    return ops.logical_or(ops.logical_not(ops.isfinite(loss_after)), loss_after - loss_before > resolution)


def adaptation_factor(adapt_every: int) -> float:
    """``omega = (19/20) ** adapt_every``: the factor one adaptation multiplies or divides the damping by."""
    return DECAY_PER_STEP ** int(adapt_every)


class ScheduledDamping(nn.Cell):
    """``d = damping[t]``: the damping Tensor as ``thor()`` was given it (MindSpore's THOR).

    ``damping`` (float32 1-D Tensor; a 0-D one as one element), ``steps`` (its length, None for a 0-D one:
    the optimizer's end-of-schedule check reads it), ``is_scalar``.
    """

    def __init__(self, damping: Tensor):
        super().__init__(auto_prefix=False)
        self.damping = Tensor(damping.asnumpy().astype(np.float32).reshape(-1))
        self.steps = int(damping.shape[0]) if damping.ndim == 1 else None
        self.is_scalar = damping.ndim == 0

    def construct(self, step, anchor, factor_loss_scale):
        if self.is_scalar:
            return ops.reshape(self.damping, ())
        return ops.reshape(ops.gather(self.damping, step, 0), ())

    def refresh(self, thor_step, damping):
        """Invert on THOR steps only."""
        return thor_step

    def settled(self, damping, anchor, factor_loss_scale):
        """The damping to invert with: the schedule's."""
        return damping

    def inversion_scale(self, factor_loss_scale, curvature_loss_scale, damping):
        """The loss scale of this step's backward pass (a THOR step's, which stored the factors)."""
        return factor_loss_scale


class LevenbergMarquardt(nn.Cell):
    """``damping="adaptive"`` (module docstring): the damping as state, its initial heuristic, the inversions
    a changed damping causes, and :meth:`adapt`.

    Args:
        config (ThorConfig): ``adapt_every``, ``damping_bounds``, ``ranks``; with ``lr_mode`` adaptive the
            damping never falls below the first step's.
        layers (Sequence[ThorLayer]): the THOR layers (their stored factors make the initial damping).
    """

    def __init__(self, config: ThorConfig, layers: Sequence):
        super().__init__(auto_prefix=False)
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
        self.floor_at_start = config.lr_mode == Mode.ADAPTIVE
        self.value = scalar_parameter(-1.0, "thor_damping")
        self.start = scalar_parameter(-1.0, "thor_initial_damping")
        self.inverted = scalar_parameter(-1.0, "thor_inverted_damping")
        self.predicted = scalar_parameter(0.0, "thor_predicted_change")
        self.ratio = scalar_parameter(0.0, "thor_reduction_ratio")
        self.loss_change = scalar_parameter(0.0, "thor_loss_change")
        self.rejected_steps = Parameter(Tensor(0, mstype.int32), name="thor_rejected_steps",
                                        requires_grad=False)
        self.growth = scalar_parameter(REJECTED_GROWTH, "thor_rejection_growth")
        self.failed = Tensor(FAILED_RATIO, mstype.float32)
        self.num_layers = len(layers)
        self.layer_a = tuple(layer.matrix_a_cov for layer in layers)
        self.layer_g = tuple(layer.matrix_g_cov for layer in layers)
        self.a_diagonal = tuple(bool(layer.spec.a_diagonal) for layer in layers)
        self.a_dims = Tensor(np.array([layer.a_dim for layer in layers], np.float32))
        self.g_dims = Tensor(np.array([layer.g_dim for layer in layers], np.float32))
        self.mean_over_ranks = RankMean(config.ranks)

    def _initial(self, anchor, factor_loss_scale):
        """The initial-damping heuristic (module docstring), from the factors this step's backward stored."""
        unscale = ops.reciprocal(ops.square(factor_loss_scale))
        a_traces, g_traces = (), ()
        for i in range(self.num_layers):
            a_traces = a_traces + (factor_trace(ops.depend(self.layer_a[i], anchor), self.a_diagonal[i]),)
            g_traces = g_traces + (factor_trace(ops.depend(self.layer_g[i], anchor), False),)
        # every layer at once: a handful of kernels, not a dozen per layer
        product = (ops.stack(a_traces) / self.a_dims) * (ops.stack(g_traces) * unscale / self.g_dims)
        usable = ops.logical_and(ops.isfinite(product), product > 0)
        logged = ops.select(usable, ops.log(ops.select(usable, product, ops.ones_like(product))),
                            ops.zeros_like(product))
        count = ops.reduce_sum(ops.cast(usable, mstype.float32))
        guess = INITIAL_SCALE * ops.exp(ops.reduce_sum(logged) / ops.maximum(count, self.one))
        guess = ops.select(count > 0, guess, FALLBACK_DAMPING * self.one)
        guess = ops.maximum(guess, FALLBACK_DAMPING * self.one)  # small factors must not mean a tiny damping
        guess = ops.reshape(self.mean_over_ranks(ops.reshape(guess, (1,))), ())
        return ops.minimum(ops.maximum(guess, self.low), self.high)

    def construct(self, step, anchor, factor_loss_scale):
        """The damping of this step: the rule's value (-1 before the first step: :meth:`settled` sets it)."""
        return self.value * 1.0

    def settled(self, damping, anchor, factor_loss_scale):
        """The damping to invert with: ``damping``, or on the first step (a THOR step: it inverts) the initial
        heuristic's, recorded as ``value`` and ``start``. Called inside the inversion branch, so the
        heuristic's work is done on refresh steps only."""
        first = damping < 0
        damping = ops.select(first, self._initial(anchor, factor_loss_scale), damping)
        done = ops.assign(self.value, damping)
        done = F.depend(done, ops.assign(self.start, ops.select(first, damping, self.start * 1.0)))
        return F.depend(damping, done)

    def refresh(self, thor_step, damping):
        """Invert on THOR steps and whenever the damping differs from the stored inverses' damping."""
        return ops.logical_or(thor_step, ops.not_equal(damping, self.inverted))

    def inversion_scale(self, factor_loss_scale, curvature_loss_scale, damping):
        """The loss scale the stored G carries; records the damping being inverted with."""
        return F.depend(curvature_loss_scale, ops.assign(self.inverted, damping))

    def due_after(self, global_step):
        """Whether the step just taken (``global_step`` is its successor's index) was an adaptation step."""
        return ops.all(ops.equal(ops.floor_mod(global_step, self.every_tensor), self.zero_step))

    def _floor(self):
        """The lowest damping :meth:`adapt` may set: ``d_min``, or with an adaptive learning rate the first
        step's damping (state resumed without ``start`` takes the damping it resumed with)."""
        if not self.floor_at_start:
            return self.low
        start = ops.select(self.start < 0, self.value * 1.0, self.start * 1.0)
        start = F.depend(start, ops.assign(self.start, start))
        return ops.maximum(start, self.low)

    def adapt(self, ratio, change, predicted, noise, rejected, adaptation=True):
        """The damping's update after a measured step: on an adaptation step (``adaptation``) the
        Levenberg-Marquardt factor of its reduction ratio ``ratio`` (its loss change ``change`` over the
        change ``predicted``; 1 where ``noise``): ``1/omega`` below 1/4, ``omega`` above 3/4, else 1; after a
        step that was not kept (``rejected``) at least the growth ``r`` (``REJECTED_GROWTH`` after a kept
        step, doubled by each rejected step in a row); clipped to ``[floor, d_max]``.
        Records ``predicted`` and, on an adaptation step, ``ratio`` and ``change`` (each finite: one that is
        not as 0 or ``FAILED_RATIO``) and counts the rejected steps; returns the new damping."""
        factor = ops.select(ratio < LOWER_RATIO, self.inverse_omega,
                            ops.select(ratio > UPPER_RATIO, self.omega, self.one))
        factor = ops.select(ops.logical_or(noise, ops.logical_not(adaptation)), self.one, factor)
        growth = self.growth * 1.0
        factor = ops.select(rejected, ops.maximum(factor, growth), factor)
        factor = F.depend(factor, ops.assign(self.growth, ops.select(rejected, 2.0 * growth,
                                                                     REJECTED_GROWTH * self.one)))
        damping = ops.minimum(ops.maximum(self.value * factor, self._floor()), self.high)
        zero = 0.0 * self.one
        done = ops.assign(self.ratio, ops.select(adaptation, _finite(ratio, self.failed), self.ratio * 1.0))
        done = F.depend(done, ops.assign(self.loss_change, ops.select(adaptation, _finite(change, zero),
                                                                      self.loss_change * 1.0)))
        done = F.depend(done, ops.assign(self.predicted, _finite(predicted, zero)))
        done = F.depend(done, ops.assign_add(self.rejected_steps, ops.cast(rejected, mstype.int32)))
        return F.depend(damping, F.depend(ops.assign(self.value, damping), done))


def build_damping_rule(config: ThorConfig, layers: Sequence) -> nn.Cell:
    """The rule of ``config.damping_mode``."""
    if config.damping_mode == Mode.ADAPTIVE:
        return LevenbergMarquardt(config, layers)
    return ScheduledDamping(config.damping)
