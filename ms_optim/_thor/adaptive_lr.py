r"""``thor(..., learning_rate="adaptive")``: the step size from a quadratic model whose curvature is measured
on the batch, every step; with ``momentum="adaptive"`` the momentum coefficient too.

No learning-rate schedule. Each step combines the new preconditioned direction ``x`` and the previous update
``y`` as ``alpha x + beta y``, from a quadratic model of the loss over their span:

* ``momentum`` a number ``mu`` in [0, 1) (what a user of THOR passes anyway): ``beta = mu`` and ``alpha = (1 -
  mu)`` times the model's minimiser along ``x``. The step is an exponential average of the model's own
  steps: along a direction the batches agree on it grows to the model's step, and where the batches
  disagree (the part of each batch's step that fits that batch only) the average cancels it. On small
  batches the model's minimiser on one batch is far longer than a good step (it fits the batch); the
  average is what keeps the step short where the gradient noise is large.
* ``momentum="adaptive"``: ``(alpha, beta)`` minimise the model over the span (Martens & Grosse's K-FAC,
  section 7; kfac-jax's ``use_adaptive_learning_rate`` with ``use_adaptive_momentum``): greedy for the
  batch, so on small noisy batches ``beta`` stays near 0 and the step near that batch's minimiser.

kfac-jax takes the model's curvature from exact curvature-vector products; the Kronecker factors alone
under-estimate it (their model's minimiser along THOR's own direction is the natural-gradient step, far too
long where the damping is small). So THOR's model is the Kronecker curvature ``K`` times a scalar calibration
``kappa``, and ``kappa`` is measured each step from the loss at a trial point on the same batch: one extra
forward pass, run by the training cell (:class:`~ms_optim._thor.probe.LossProbe`).

On step ``t`` with damping ``d`` (the schedule's ``damping[t]`` or the adaptive rule's value), ``wd =
weight_decay``, ``L0`` the step's loss:

.. code-block:: text

    g_j   <- grad_j / loss_scale                  (every trainable parameter j)
    u_j   <- THOR's preconditioned g_j            (G^-1 g A^-1, embedding and LayerNorm rules, as every step)
    u_j   <- u_j + wd w_j   where decay_filter(w_j);   u_j <- u_j / max(||u_j||, 1)   if enable_clip_grad
    x_j   <- -u_j                                 (the new direction)
    y_j   <- the previous update w_j(t) - w_j(t-1)  (stored in ``moments.<name>``; 0 before the first step)
    h_j   <- g_j + wd w_j   where decay_filter(w_j), else g_j    (the gradient of loss + wd/2 ||w||^2)

    K(a, b) = sum_j c_j(a_j, b_j)                 (the Kronecker curvature)
        c_j(a, b) = <G_l a, b A_l>                 Dense/Conv weight of layer l (as out x (in*kh*kw))
                    <diag(a_l) a, b G_l>           Embedding table
                    <g_j^2 / batch_size, a b>      LayerNorm gamma/beta (the diagonal THOR inverts)
                    0                              every other parameter (no curvature is stored)
    N(a, b) = sum_j <a_j, b_j>;   W(a, b) = sum_j [decay_filter(w_j)] <a_j, b_j>

    A_l, G_l: the layer's stored factors (diagonal blocks as stored, G divided by the square of the loss scale
    of the backward pass that collected them), as ``ms_optim._thor.quad_model``.

    M(k) = k ([[K(x,x), K(x,y)], [K(x,y), K(y,y)]] + d N) + wd W,   b = [<h,x>, <h,y>],   e = [<g,x>, <g,y>]
        (N, W as 2x2 matrices alike; K, N, W, b, e averaged over the data-parallel ranks: every rank solves
        the same system)
    step(M, b) = average(M, b) for momentum mu, solve(M, b) for momentum="adaptive":
    average(M, b): (alpha, beta) = ((1 - mu) (-b0 / M00), mu)   when M00 > 0, -b0 / M00 and its m finite
                                   (0, 0)     otherwise (no finite model: the parameters stay)
        then the trust region below
    solve(M, b): the minimiser of m(alpha, beta) = 1/2 [alpha beta] M [alpha beta]^T + b . [alpha beta]:
        2-D:  det = M00 M11 - M01^2;  (alpha, beta) = (M01 b1 - M11 b0, M01 b0 - M00 b1) / det
              when M00 > 0, M11 > 0, det > DEGENERATE * M00 M11, everything finite, and its m is not above
              the 1-D step's m
        1-D:  (-b0 / M00, 0)   otherwise, when M00 > 0 and it is finite (the first step: y = 0)
        none: (0, 0)           otherwise (no finite model: the parameters stay)
        then, kl_clip = c given: the trust region (alpha, beta) <- (alpha, beta) min(1, sqrt(c / k)) with
        k = [alpha beta] M [alpha beta]^T (the step's curvature norm, twice its KL estimate)

    trial:   (a0, b0) <- step(M(kappa), b);   p_j = a0 x_j + b0 y_j;   w_j <- w_j + p_j
    probe:   L_p <- the loss on the same batch at the trial point      (the training cell's extra pass)
             (L0, L_p) averaged over the ranks
    measure: c   = 2 (L_p - L0 - (a0 e0 + b0 e1))        (the loss's curvature along p, measured)
             k_d = [a0 b0] (K + d N) [a0 b0]^T           (the damped Kronecker curvature along p)
             m   = c / k_d                               (the measured calibration, where k_d > 0)
             kappa' = clip(m, max(MAX_FALL kappa, KAPPA_MIN), KAPPA_MAX)   where k_d > 0, else kappa
    noise:   when L_p, c are finite and |L_p - L0|, |q_p| <= RESOLUTION max(|L0|, |L_p|), with
             q_p = <e,(a0,b0)> + k_d / 2 the damped model's change for the trial (``adaptive.unresolved``:
             both changes below what a float32 loss resolves, so c is rounding noise):
             kappa' <- max(MAX_FALL kappa, KAPPA_MIN) (the next trial longer), the trial is not rejected
    reject:  otherwise, when L_p > L0 or L_p, c are not finite (the trial raised the loss, or gave no number):
             kappa' <- min(FAILED_GROWTH kappa, KAPPA_MAX), at least the kappa' above when c is finite
    final:   (alpha, beta) <- step(M(kappa'), b), or (0, 0) when rejected;   s_j = alpha x_j + beta y_j
             w_j <- w_j + (s_j - p_j)  (= the weights before the trial + s_j);   y_j <- s_j;   kappa <- kappa'

``kappa`` starts at 1 (the damped Kronecker model as it is) and carries over between steps, so the trial is
made with the last step's calibration. It falls at most by MAX_FALL a step (the final step is then at most
about twice the trial, which was measured) and rises without limit up to ``KAPPA_MAX``: a step after a
rejected trial tries one FAILED_GROWTH times shorter. Without the noise rule a net near a minimum of its
training loss would stop for good: a trial whose change is rounding noise reads as a huge curvature (``c``
over a tiny ``k_d``) or as a rise of the loss, kappa climbs to KAPPA_MAX, the steps become too short to move
a float32 weight, and every later trial measures noise again (the damping rises to its bound meanwhile).
With ``momentum="adaptive"`` the final step along p is the minimiser of the measured quadratic (``kappa' k_d
= c``): the line search of one trial; with a momentum ``mu`` the measured curvature shortens or lengthens the
``1 - mu`` share of the model's step alike.
``alpha`` plays the learning rate and ``beta`` the momentum; both are recorded (``step_size``,
``momentum_coefficient``), as are ``kappa`` (``calibration``) and the trial's ``(a0, b0)``.

With ``damping="adaptive"`` the damping rule needs no pass of its own: on an adaptation step its reduction
ratio is the trial's, against the model that chose the trial (the damped Kronecker model times the trial's
``kappa``, as kfac-jax's ratio is that of the model its step came from):

.. code-block:: text

    q_c = <e,(a0,b0)> + kappa k_d / 2              (kappa: the trial's calibration, before the measurement)
    rho = (L_p - L0) / q_c                         (FAILED_RATIO when L_p, c or rho is not finite, k_d <= 0
                                                    or q_c >= 0; no update of the damping on a noise step)
    d   <- clip(d / omega, d_start, d_max)   if rho < 1/4;   clip(d * omega, d_start, d_max)   if rho > 3/4

``d_start`` is the first step's damping (the initial-damping heuristic's, ``start``), or the lower bound if
that is higher (state resumed from a checkpoint without ``start``: the damping it resumed with). Why the
floor: with the step calibrated on each batch the ratio cannot tell that the damping is too small. A
smaller damping lengthens THOR's direction along the factors' small eigenvalues, ``kappa`` shortens the
step to match, and the ratio stays near 1, so without a floor the damping falls step after
step until the direction is the noise of one batch's factors. What the ratio does tell is a trial that
did worse than its calibrated model promised (a quarter of the promise or less; a rejected trial): the
damping rises and the direction turns towards the gradient's, and it falls back to ``d_start`` while the
trials keep their promise. The rule records ``ratio``, ``loss_change = L_p - L0`` and ``predicted = q_c``.

What the other arguments become: ``momentum`` is ``mu`` above (below 1; or ``"adaptive"``);
``kl_clip`` is the trust region above instead of THOR's scaling of the preconditioned gradient
(which the solve would undo); ``use_nesterov=True`` is refused. The optimizer must be stepped by a training
cell that runs the probe (ms_optim's ``TrainOneStepCell``, ``TrainOneStepWithLossScaleCell``, ``ModelThor``);
with MindSpore's own cells the step raises RuntimeError when it compiles, before any parameter changes.
The probe is the network's forward in training mode at the trial point (BatchNorm's moving statistics see
the batch a second time; dropout draws new masks, which adds their noise to ``c``).

Data parallel: the gradients are the ranks' mean and the inverses are the same on every rank, but each rank's
stored factors and loss are its own batch's, so the system (13 numbers) and the losses (2) are averaged over
the ranks and every rank takes the same step. The mean of the ranks' models is not the model of the
concatenated batch (the Kronecker product is not linear in the factors), so a data-parallel run is not the
single-process run on the concatenated batch number for number, as it is with a learning-rate schedule.
"""
from __future__ import annotations

from typing import Sequence

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim._thor import preconditioner as pc
from ms_optim._thor.adaptive import FAILED_RATIO, scalar_parameter, unresolved
from ms_optim._thor.config import ThorConfig
from ms_optim._thor.optimizer import ThorOptimizer
from ms_optim._thor.parallel import RankMean
from ms_optim._thor.probe import unbound_message
from ms_optim._thor.quad_model import (
    DEGENERATE,
    averaged_coefficients,
    flat_float32,
    flat_system_terms,
    model_system,
    pick,
    quadratic,
    solve_coefficients,
    system_terms,
)
from ms_optim._thor.update import apply_decay, clip_to_unit_norm

__all__ = ["AdaptiveLrThorOptimizer", "QuadraticStep", "DEGENERATE", "KAPPA_MIN", "KAPPA_MAX", "MAX_FALL",
           "FAILED_GROWTH", "solve_coefficients", "UNBOUND_MESSAGE"]

#: the calibration's range
KAPPA_MIN = 1e-4
KAPPA_MAX = 1e8
#: a rejected trial (the loss at the trial point rose or is not finite) multiplies the calibration by at least
#: this (up to KAPPA_MAX)
FAILED_GROWTH = 10.0
#: the calibration falls at most by this factor per step (the final step is at most about twice the trial)
MAX_FALL = 0.5

UNBOUND_MESSAGE = unbound_message("learning_rate='adaptive'", "the loss at a trial point of each step")

#: ``hyper_map(F.partial(take_trial, a0, b0), directions, weights, previous, stored)``: ``x = -u`` stored,
#: ``w += a0 x + b0 y``
take_trial = C.MultitypeFuncGraph("thor_take_trial")
#: ``hyper_map(F.partial(take_final, a0, b0, alpha, beta), stored, weights, previous)``:
#: ``w += (alpha - a0) x + (beta - b0) y``; ``y <- alpha x + beta y``
take_final = C.MultitypeFuncGraph("thor_take_final")


@take_trial.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _take_trial_tensor(a0, b0, direction, weight, previous, stored):
    """``x = -u`` into ``stored``; ``w += a0 x + b0 y``."""
    x = -ops.cast(direction, mstype.float32)
    kept = ops.assign(stored, ops.cast(x, F.dtype(stored)))
    step = a0 * x + b0 * ops.cast(previous, mstype.float32)
    return F.depend(True, F.depend(ops.assign_add(weight, ops.cast(step, F.dtype(weight))), kept))


@take_final.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _take_final_tensor(a0, b0, alpha, beta, stored, weight, previous):
    """``w += (alpha - a0) x + (beta - b0) y``; ``y <- alpha x + beta y``."""
    x = ops.cast(stored, mstype.float32)
    y = ops.cast(previous, mstype.float32)
    correction = (alpha - a0) * x + (beta - b0) * y
    moved = ops.assign_add(weight, ops.cast(correction, F.dtype(weight)))
    step = ops.depend(alpha * x + beta * y, moved)
    return F.depend(True, ops.assign(previous, ops.cast(step, F.dtype(previous))))


class QuadraticStep(nn.Cell):
    """The trial, the measurement and the final step of ``learning_rate="adaptive"`` (module docstring).

    ``step(weights, gradients, directions, previous, damping, thor_step, factor_loss_scale)`` (the
    optimizer, with the preconditioned gradients as ``directions``): the trial. :meth:`finish` (the training
    cell's probe, with the step's loss and the loss at the trial point): the final step, and the adaptive
    damping's update.

    State (float32 Parameters of shape (), in checkpoints): ``step_size`` (``thor_step_size``: alpha of the
    last step), ``momentum_coefficient`` (``thor_momentum_coefficient``: its beta), ``calibration``
    (``thor_curvature_calibration``: kappa), ``trial_step_size`` and ``trial_momentum_coefficient``
    (``thor_trial_step_size``, ``thor_trial_momentum_coefficient``: a0 and b0), ``system`` (``thor_system``,
    the 13 averaged terms of the last step), ``step_damping`` (``thor_step_damping``: its d),
    ``curvature_scale`` (``thor_step_curvature_loss_scale``: the loss scale the stored G carries); and
    ``trial_directions`` (``thor_direction.<name>``: x of the last step, one per parameter).
    """

    def __init__(self, config: ThorConfig, treatments: tuple, decay_flags: tuple, a_factors: Sequence,
                 g_factors: Sequence, batch_size: float, parameters, previous, damping_rule: nn.Cell,
                 global_step: Parameter):
        super().__init__(auto_prefix=False)
        self.bound = False  # set by probe.loss_probe_for: a training cell that runs the probe was built
        # the 2x2 system's terms: per parameter for those with Kronecker factors, one flat computation for
        # the rest (``quad_model.flat_system_terms``)
        factored = (pc.MATRIX, pc.EMBEDDING)
        self.factored = tuple(i for i, t in enumerate(treatments) if t[0] in factored)
        self.flat = tuple(i for i, t in enumerate(treatments) if t[0] not in factored)
        self.treatments = pick(treatments, self.factored)
        self.decay_flags = pick(decay_flags, self.factored)
        self.a_factors = pick(tuple(a_factors), self.factored)
        self.g_factors = pick(tuple(g_factors), self.factored)
        self.flat_layernorm, self.flat_decay = None, None
        if self.flat:
            sizes = [(i, int(np.prod(parameters[i].shape))) for i in self.flat]
            layernorm = [np.full(n, float(treatments[i][0] == pc.LAYERNORM), np.float32) for i, n in sizes]
            self.flat_layernorm = Tensor(np.concatenate(layernorm))
            decay = [np.full(n, float(bool(decay_flags[i])), np.float32) for i, n in sizes]
            self.flat_decay = Tensor(np.concatenate(decay))
        self.batch_size = float(batch_size)
        self.weight_decay = Tensor(config.weight_decay, mstype.float32)
        self.kl_clip = None if config.kl_clip is None else Tensor(config.kl_clip, mstype.float32)
        self.adaptive_momentum = bool(config.adaptive_momentum)
        self.momentum = float(config.momentum)
        self.hyper_map = ops.HyperMap()
        self.weights = parameters
        self.previous = previous
        self.trial_directions = parameters.clone(prefix="thor_direction", init="zeros")
        self.step_size = scalar_parameter(0.0, "thor_step_size")
        self.momentum_coefficient = scalar_parameter(0.0, "thor_momentum_coefficient")
        self.trial_step_size = scalar_parameter(0.0, "thor_trial_step_size")
        self.trial_momentum_coefficient = scalar_parameter(0.0, "thor_trial_momentum_coefficient")
        self.calibration = scalar_parameter(1.0, "thor_curvature_calibration")
        self.step_damping = scalar_parameter(0.0, "thor_step_damping")
        self.system = Parameter(Tensor(np.zeros(13, np.float32)), name="thor_system", requires_grad=False)
        self.curvature_scale = scalar_parameter(config.loss_scale, "thor_step_curvature_loss_scale")
        self.adaptive_damping = bool(config.adaptive_damping)
        self.damping_rule = damping_rule
        self.global_step = global_step
        self.failed = Tensor(FAILED_RATIO, mstype.float32)
        self.mean_over_ranks = RankMean(config.ranks)

    def bind(self) -> None:
        """Mark the step as run by a training cell that runs the probe (``probe.py``)."""
        self.bound = True

    def coefficients(self, system):
        """``(alpha, beta)`` of ``system = (M00, M01, M11, b0, b1)``: the 2x2 solve with
        ``momentum="adaptive"``, else the averaged step with the given momentum (module docstring)."""
        if self.adaptive_momentum:
            return solve_coefficients(system, self.kl_clip)
        return averaged_coefficients(system, self.momentum, self.kl_clip)

    def construct(self, weights, gradients, directions, previous, damping, thor_step, factor_loss_scale):
        """The trial: the system, ``(a0, b0)`` with the last calibration, ``w += a0 x + b0 y``."""
        if not self.bound:
            raise RuntimeError(UNBOUND_MESSAGE)
        scale = ops.select(thor_step, ops.reshape(factor_loss_scale, ()), self.curvature_scale * 1.0)
        scale = F.depend(scale, ops.assign(self.curvature_scale, scale))
        unscale = ops.reciprocal(ops.square(scale))
        d = ops.reshape(ops.cast(damping, mstype.float32), ())
        system = ops.zeros((13,), mstype.float32)
        if self.factored:
            terms = self.hyper_map(F.partial(system_terms, self.weight_decay, unscale),
                                   self.treatments, self.decay_flags, pick(gradients, self.factored),
                                   pick(directions, self.factored), pick(previous, self.factored),
                                   pick(weights, self.factored), self.a_factors, self.g_factors)
            system = system + ops.reduce_sum(ops.stack(terms), 0)
        if self.flat:
            system = system + flat_system_terms(
                self.weight_decay, self.batch_size, self.flat_layernorm, self.flat_decay,
                flat_float32(gradients, self.flat), flat_float32(directions, self.flat),
                flat_float32(previous, self.flat), flat_float32(weights, self.flat))
        system = self.mean_over_ranks(system)
        a0, b0 = self.coefficients(model_system(system, self.calibration * 1.0, d, self.weight_decay))
        done = ops.assign(self.system, system)
        done = F.depend(done, ops.assign(self.step_damping, d))
        done = F.depend(done, ops.assign(self.trial_step_size, a0))
        done = F.depend(done, ops.assign(self.trial_momentum_coefficient, b0))
        a0 = F.depend(a0, done)
        return self.hyper_map(F.partial(take_trial, a0, F.depend(b0, done)), directions, weights, previous,
                              self.trial_directions)

    def finish(self, loss_before, loss_after):
        """The measurement and the final step (module docstring), given the step's loss and the loss at the
        trial point; on an adaptation step of ``damping="adaptive"`` also the damping's update. Returns
        ``alpha``."""
        losses = ops.stack([ops.reshape(ops.cast(loss_before, mstype.float32), ()),
                            ops.reshape(ops.cast(loss_after, mstype.float32), ())])
        losses = self.mean_over_ranks(losses)
        system = self.system * 1.0
        a0, b0 = self.trial_step_size * 1.0, self.trial_momentum_coefficient * 1.0
        kappa, d = self.calibration * 1.0, self.step_damping * 1.0
        linear = a0 * system[11] + ops.select(ops.not_equal(b0, 0.0 * b0), b0 * system[12], 0.0 * b0)
        change = losses[1] - losses[0]
        measured = 2.0 * (change - linear)
        damped = quadratic(a0, b0, system[0] + d * system[3], system[1] + d * system[4],
                            system[2] + d * system[5])
        measured_kappa = measured / ops.select(damped > 0, damped, ops.ones_like(damped))
        floor = ops.maximum(MAX_FALL * kappa, KAPPA_MIN * ops.ones_like(kappa))
        clipped_kappa = ops.minimum(ops.maximum(measured_kappa, floor), KAPPA_MAX * ops.ones_like(kappa))
        finite = ops.logical_and(ops.isfinite(losses[1]), ops.isfinite(measured))
        predicted = linear + 0.5 * damped
        # a trial too short for the float32 loss to resolve measures nothing: kept, and the next one longer
        noise = ops.logical_and(finite, unresolved(change, predicted, losses[0], losses[1]))
        # a trial that raised the loss (or gave none) is not kept: no step, and a calibration at least
        # FAILED_GROWTH times the last
        failed = ops.logical_or(ops.logical_not(finite), change > 0)
        rejected = ops.logical_and(failed, ops.logical_not(noise))
        grown = ops.minimum(FAILED_GROWTH * kappa, KAPPA_MAX * ops.ones_like(kappa))
        new_kappa = ops.select(damped > 0, clipped_kappa, kappa)
        new_kappa = ops.select(rejected, ops.select(finite, ops.maximum(grown, new_kappa), grown), new_kappa)
        new_kappa = ops.select(noise, floor, new_kappa)
        alpha, beta = self.coefficients(model_system(system, new_kappa, d, self.weight_decay))
        zero = ops.zeros_like(alpha)
        alpha, beta = ops.select(rejected, zero, alpha), ops.select(rejected, zero, beta)
        done = ops.assign(self.calibration, new_kappa)
        done = F.depend(done, ops.assign(self.step_size, alpha))
        done = F.depend(done, ops.assign(self.momentum_coefficient, beta))
        moved = self.hyper_map(F.partial(take_final, a0, b0, F.depend(alpha, done), beta),
                               self.trial_directions, self.weights, self.previous)
        alpha = F.depend(alpha, moved)
        if self.adaptive_damping:
            if self.damping_rule.due_after(self.global_step * 1):
                # the model that chose the trial: the damped Kronecker model times the trial's kappa
                calibrated = linear + 0.5 * kappa * damped
                ratio = change / calibrated
                usable = ops.logical_and(ops.logical_and(finite, damped > 0), calibrated < 0)
                ratio = ops.select(ops.logical_and(usable, ops.isfinite(ratio)), ratio, self.failed)
                alpha = F.depend(alpha, self.damping_rule.adapt_calibrated(ratio, change, calibrated, noise))
        return alpha


class AdaptiveLrThorOptimizer(ThorOptimizer):
    """THOR with ``learning_rate="adaptive"`` (built by ``thor()`` for it): :class:`ThorOptimizer` whose
    update is :class:`QuadraticStep`'s trial (``quadratic_step``), finished by the training cell's probe;
    ``moments`` hold the previous update, ``momentum`` holds ``mu`` (the quadratic step's ``beta``, fixed when
    the optimizer is built; 0.0 with ``momentum="adaptive"``) and ``get_lr()`` is 0
    (``quadratic_step.step_size`` is the step size taken)."""

    def __init__(self, net: nn.Cell, layers: Sequence, config: ThorConfig):
        super().__init__(net, layers, config)
        none = Tensor(np.zeros((1,), np.float32))  # for the parameters of no THOR layer (never read)
        owners = self._param_owners
        self.quadratic_step = QuadraticStep(
            config, self.param_treatment, self.decay_flags,
            tuple(self.thor_cells[i].matrix_a_cov if i >= 0 else none for i in owners),
            tuple(self.thor_cells[i].matrix_g_cov if i >= 0 else none for i in owners), self.batch_size_float,
            self._parameters, self.moments, self.damping_rule, self.global_step)

    def _update(self, params, gradients, lam, damping, step, thor_step):
        """The directions (THOR's preconditioning, decay, clip; no KL scaling) and the trial step; the
        training cell's probe finishes the step (``quadratic_step.finish``)."""
        directions = self._precondition(gradients, lam)
        if self.apply_weight_decay:
            directions = self.hyper_map(F.partial(apply_decay, self.weight_decay_tensor), self.decay_flags,
                                        params, directions)
        if self.enable_clip_grad:
            directions = self.hyper_map(clip_to_unit_norm, directions)
        return self.quadratic_step(params, gradients, directions, self.moments, damping, thor_step,
                                   self.factor_loss_scale)
