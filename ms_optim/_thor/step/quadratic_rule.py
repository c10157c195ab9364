r"""The step rule of ``learning_rate="adaptive"``: the step of THOR's quadratic model, calibrated per batch.

Each step combines the new preconditioned direction ``x`` and the previous update ``y`` as ``alpha x + beta
y`` from the quadratic model over their span (``quad_model.py``), whose curvature is the Kronecker curvature
of the stored factors times a calibration ``kappa`` measured on every step's own batch: the loss at a trial
point, one extra forward pass run by the training cell. With ``mu = momentum`` (a number), the step averages
the model's own steps, ``(alpha, beta) = ((1 - mu) alpha_1, mu)`` with ``alpha_1`` the model's minimiser along
``x``; with ``momentum="adaptive"`` both coefficients minimise the model (``quad_model.coefficients``). On
step ``t`` with damping ``d``:

.. code-block:: text

    u      <- THOR's preconditioned gradient (each spec's apply(-1)), then weight decay and unit-norm clipping
    x      <- -u;   y <- the previous update (``moments``; 0 before the first step)
    M(k)   =  k (A + d D) + wd R            (the model over (x, y))
    trial:    (a0, b0) <- step(M(kappa)), in the kl_clip trust region;   w <- w + a0 x + b0 y
    probe:    L_p <- the loss on the same batch at the trial point      (the training cell's extra pass)
    measure:  c = 2 (L_p - L0 - (a0 e0 + b0 e1));   k_d = [a0 b0] (A + d D) [a0 b0]^T;   m = c / k_d
              kappa' = clip(m, max(MAX_FALL kappa, KAPPA_MIN), KAPPA_MAX)  where k_d > 0, else kappa
    noise:    L_p and c finite, |L_p - L0| and |a0 e0 + b0 e1 + k_d / 2| below the loss's float32
              resolution: kappa' = max(MAX_FALL kappa, KAPPA_MIN), the trial kept (the next one longer)
    reject:   otherwise when L_p > L0 or L_p, c are not finite: no step, and
              kappa' = min(FAILED_GROWTH kappa, KAPPA_MAX) (at least the kappa' above where c is finite)
    final:    (alpha, beta) <- step(M(kappa')) (0 when rejected);   w <- w + (alpha - a0) x + (beta - b0) y;
              y <- alpha x + beta y;   kappa <- kappa'
    damping="adaptive", after an adaptation step: q_c = a0 e0 + b0 e1 + kappa k_d / 2 (the trial's
              calibrated model), rho = (L_p - L0) / q_c (FAILED_RATIO when L_p, c or rho is not finite,
              k_d <= 0 or q_c >= 0), handed to the damping rule's ``adapt`` (never below the first step's
              damping)

``kappa`` starts at 1 and carries over between steps: the Kronecker factors alone under-estimate the loss's
curvature along THOR's direction, and the ratio moves from batch to batch, so it is measured on every step (a
calibration kept over several unmeasured steps lets those steps overshoot). Data parallel: the model's parts
and the two losses are averaged over the ranks, so every rank takes the same step. The model and the moves are
one fused CPU op each over all the parameters where every one is float32 (``MsOptimQuadProducts``,
``MsOptimQuadTrial``, ``MsOptimQuadMove``: ``factor_kernels.quad_kernels``).
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.modes import Mode
from ms_optim._thor.net.factor_kernels import quad_kernels
from ms_optim._thor.parallel import RankMean
from ms_optim._thor.step import quad_model as qm
from ms_optim._thor.step.damping import FAILED_RATIO, scalar_parameter, unresolved
from ms_optim._thor.step.table import ParameterTable
from ms_optim._thor.step.update import (
    apply_decay,
    clip_to_unit_norm,
    curvature_product,
    decay_terms,
    move,
    precondition,
    take_trial,
)

__all__ = ["QuadraticRule", "KAPPA_MIN", "KAPPA_MAX", "MAX_FALL", "FAILED_GROWTH"]

#: the calibration's range
KAPPA_MIN = 1e-4
KAPPA_MAX = 1e8
#: a rejected trial multiplies the calibration by at least this (up to KAPPA_MAX)
FAILED_GROWTH = 10.0
#: the calibration falls at most by this factor per step (the final step is at most about twice the trial)
MAX_FALL = 0.5
#: the model is built over (u, y) with u = -x: S P S (S = diag(-1, 1)) turns a part P into the one over (x, y)
_SIGNS = np.array([[1.0, -1.0], [-1.0, 1.0]], np.float32)


class QuadraticRule(nn.Cell):
    """The trial, the measurement and the final step of ``learning_rate="adaptive"`` (module docstring).

    Args:
        config (ThorConfig): the settings (weight decay, clipping, ``kl_clip``, momentum and damping modes).
        table (ParameterTable): the trainable parameters' specs, slots and flags.
        weights (ParameterTuple): the trainable parameters; ``previous``: the previous updates (``moments``).
        damping_rule (Cell): the damping rule (its ``adapt`` with ``damping="adaptive"``).

    State (float32 Parameters, in checkpoints): ``step_size`` (``thor_step_size``: alpha of the last step),
    ``momentum_coefficient`` (``thor_momentum_coefficient``: its beta), ``calibration``
    (``thor_curvature_calibration``: kappa), ``trial_step_size`` and ``trial_momentum_coefficient`` (a0, b0),
    ``system`` (``thor_system``: the step's model, ``quad_model.pack``), ``step_damping``
    (``thor_step_damping``: its d) and ``trial_directions`` (``thor_direction.<name>``: x of the last step).
    """

    def __init__(self, config: ThorConfig, table: ParameterTable, weights, previous, damping_rule: nn.Cell,
                 fused: bool = False):
        super().__init__(auto_prefix=False)
        self.forms, self.slots, self.decay_flags = table.forms, table.slots, table.decay_flags
        self.curved = table.curved
        # one fused CPU op per phase over every parameter, where all of them are float32
        quad = quad_kernels(len(table.sizes)) if fused else None
        self.fused = quad is not None
        if self.fused:
            self.quad_trial, self.quad_move = quad.trial, quad.move
        self.model_plan = qm.model_plan(table.sizes, table.decay_flags, table.curved, 2,
                                        None if quad is None else quad.products, config.weight_decay > 0)
        self.weight_decay = Tensor(config.weight_decay, mstype.float32)
        self.apply_weight_decay = config.weight_decay > 0
        self.decay = self.weight_decay if self.apply_weight_decay else None
        self.enable_clip_grad = config.enable_clip_grad
        self.kl_clip = None if config.kl_clip is None else Tensor(config.kl_clip, mstype.float32)
        self.momentum = None if config.momentum_mode == Mode.ADAPTIVE else float(config.momentum)
        self.hyper_map = ops.HyperMap()
        self.weights = weights
        self.previous = previous
        self.trial_directions = weights.clone(prefix="thor_direction", init="zeros")
        self.step_size = scalar_parameter(0.0, "thor_step_size")
        self.momentum_coefficient = scalar_parameter(0.0, "thor_momentum_coefficient")
        self.trial_step_size = scalar_parameter(0.0, "thor_trial_step_size")
        self.trial_momentum_coefficient = scalar_parameter(0.0, "thor_trial_momentum_coefficient")
        self.calibration = scalar_parameter(1.0, "thor_curvature_calibration")
        self.step_damping = scalar_parameter(0.0, "thor_step_damping")
        self.system = Parameter(Tensor(np.zeros(qm.SYSTEM_SIZE, np.float32)), name="thor_system",
                                requires_grad=False)
        self.signs = Tensor(_SIGNS)
        self.first_negated = Tensor(np.array([-1.0, 1.0], np.float32))
        self.ranks = int(config.ranks)
        self.adapts_damping = config.damping_mode == Mode.ADAPTIVE
        self.damping_rule = damping_rule
        self.failed = Tensor(FAILED_RATIO, mstype.float32)
        # the damping reacts to a rejected trial through its ratio: the trial is not taken back twice
        self.kept, self.adapting = Tensor(False), Tensor(True)
        self.mean_over_ranks = RankMean(config.ranks)

    def coefficients(self, model, kappa, damping):
        """``step(M(kappa))``: the solved or the averaged coefficients, in the ``kl_clip`` trust region."""
        _, _, _, b, _ = model
        return qm.coefficients(qm.matrix(model, kappa, damping, self.weight_decay), b, self.momentum,
                               self.kl_clip)

    def read_weights(self, weights, anchor):
        """The decay terms (``update.decay_terms``), read before the optimizer's branches (``update.py``)."""
        return decay_terms(self.hyper_map, self.decay, self.decay_flags, weights, anchor)

    def _model(self, terms, gradients, directions, context):
        """The model over ``(x, y)``, from the preconditioned ``directions`` ``u = -x`` (built over ``(u, y)``
        and turned by the signs of ``x``), averaged over the ranks."""
        vectors = (directions, self.previous)
        products = tuple(self.hyper_map(F.partial(curvature_product, context), self.curved, self.forms,
                                        self.slots, gradients, v) for v in vectors)
        a, d, r, b, e = qm.build_model(self.model_plan, vectors, gradients, terms, products)
        signs, first = self.signs, self.first_negated
        model = (a * signs, d * signs, r * signs, b * first, e * first)
        if self.ranks > 1:
            model = qm.mean_over(model, self.mean_over_ranks)
        return model

    def construct(self, weights, gradients, damping, context, step, terms):
        """The trial: directions, model, ``(a0, b0)`` with the last calibration, ``w += a0 x + b0 y``."""
        directions = self.hyper_map(F.partial(precondition, context), self.forms, self.slots, gradients)
        if self.apply_weight_decay:
            directions = self.hyper_map(apply_decay, self.decay_flags, terms, directions)
        if self.enable_clip_grad:
            directions = self.hyper_map(clip_to_unit_norm, directions)
        model = self._model(terms, gradients, directions, context)
        d = ops.reshape(ops.cast(damping, mstype.float32), ())
        a0, b0 = self.coefficients(model, self.calibration * 1.0, d)
        done = ops.assign(self.system, qm.pack(model))
        done = F.depend(done, ops.assign(self.step_damping, d))
        done = F.depend(done, ops.assign(self.trial_step_size, a0))
        done = F.depend(done, ops.assign(self.trial_momentum_coefficient, b0))
        coefs = F.depend(ops.stack((a0, b0)), done)
        if self.fused:
            return self.quad_trial(*(weights + self.trial_directions + self.previous + directions + (coefs,)))
        return self.hyper_map(F.partial(take_trial, coefs), directions, weights, self.previous,
                              self.trial_directions)

    def probe_due(self, global_step):
        """Every step needs the loss at its trial point."""
        return True

    def finish(self, loss_before, loss_after, global_step):
        """The measurement and the final step (module docstring), given the step's loss and the loss at the
        trial point; after an adaptation step of ``damping="adaptive"`` (``global_step``: the next step's
        index) also the damping's update. Returns ``alpha``."""
        losses = self.mean_over_ranks(ops.stack([ops.reshape(ops.cast(loss_before, mstype.float32), ()),
                                                 ops.reshape(ops.cast(loss_after, mstype.float32), ())]))
        model = qm.unpack(self.system * 1.0)
        curvature, identity, _, _, gradient = model
        a0, b0 = self.trial_step_size * 1.0, self.trial_momentum_coefficient * 1.0
        kappa, d = self.calibration * 1.0, self.step_damping * 1.0
        zero = ops.zeros_like(a0)
        linear = a0 * gradient[0] + ops.select(ops.not_equal(b0, zero), b0 * gradient[1], zero)
        change = losses[1] - losses[0]
        measured = 2.0 * (change - linear)
        damped = qm.quadratic(curvature + d * identity, a0, b0)
        measured_kappa = measured / ops.select(damped > 0, damped, ops.ones_like(damped))
        floor = ops.maximum(MAX_FALL * kappa, KAPPA_MIN * ops.ones_like(kappa))
        clipped_kappa = ops.minimum(ops.maximum(measured_kappa, floor), KAPPA_MAX * ops.ones_like(kappa))
        finite = ops.logical_and(ops.isfinite(losses[1]), ops.isfinite(measured))
        # a trial too short for the float32 loss to resolve measures nothing: kept, and the next one longer
        noise = ops.logical_and(finite, unresolved(change, linear + 0.5 * damped, losses[0], losses[1]))
        # a trial that raised the loss (or gave none) is not kept: no step, and a larger calibration
        failed = ops.logical_or(ops.logical_not(finite), change > 0)
        rejected = ops.logical_and(failed, ops.logical_not(noise))
        grown = ops.minimum(FAILED_GROWTH * kappa, KAPPA_MAX * ops.ones_like(kappa))
        new_kappa = ops.select(damped > 0, clipped_kappa, kappa)
        new_kappa = ops.select(rejected, ops.select(finite, ops.maximum(grown, new_kappa), grown), new_kappa)
        new_kappa = ops.select(noise, floor, new_kappa)
        alpha, beta = self.coefficients(model, new_kappa, d)
        alpha, beta = ops.select(rejected, zero, alpha), ops.select(rejected, zero, beta)
        done = ops.assign(self.calibration, new_kappa)
        done = F.depend(done, ops.assign(self.step_size, alpha))
        done = F.depend(done, ops.assign(self.momentum_coefficient, beta))
        coefs = F.depend(ops.stack((alpha - a0, beta - b0, alpha, beta)), done)
        if self.fused:
            moved = self.quad_move(*(self.weights + self.previous + self.trial_directions + (coefs,)))
        else:
            moved = self.hyper_map(F.partial(move, coefs), self.trial_directions, self.weights, self.previous)
        alpha = F.depend(alpha, moved)
        if self.adapts_damping:
            if self.damping_rule.due_after(global_step * 1):
                calibrated = linear + 0.5 * kappa * damped
                ratio = change / calibrated
                usable = ops.logical_and(ops.logical_and(finite, damped > 0), calibrated < 0)
                ratio = ops.select(ops.logical_and(usable, ops.isfinite(ratio)), ratio, self.failed)
                alpha = F.depend(alpha, self.damping_rule.adapt(ratio, change, calibrated, noise, self.kept,
                                                                self.adapting))
        return alpha
