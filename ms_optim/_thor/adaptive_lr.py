r"""``thor(..., learning_rate="adaptive")``: step size and momentum from THOR's quadratic model, every step.

No learning-rate schedule and no fixed momentum: each step combines the new preconditioned direction and
the previous update with the two coefficients that minimise the quadratic model of the loss over their span
(Martens & Grosse's K-FAC, section 7; kfac-jax's ``use_adaptive_learning_rate`` with
``use_adaptive_momentum``). On step ``t`` with damping ``d`` (the schedule's ``damping[t]`` or the adaptive
rule's value), ``wd = weight_decay``:

.. code-block:: text

    g_j   <- grad_j / loss_scale                  (every trainable parameter j)
    u_j   <- THOR's preconditioned g_j            (G^-1 g A^-1, embedding and LayerNorm rules, as every step)
    u_j   <- u_j + wd w_j   where decay_filter(w_j);   u_j <- u_j / max(||u_j||, 1)   if enable_clip_grad
    x_j   <- -u_j                                 (the new direction)
    y_j   <- the previous update w_j(t) - w_j(t-1)  (stored in ``moments.<name>``; 0 before the first step)
    h_j   <- g_j + wd w_j   where decay_filter(w_j), else g_j    (the gradient of loss + wd/2 ||w||^2)
    K(a, b) = sum_j c_j(a_j, b_j) + sum_j (d + wd [decay_filter(w_j)]) <a_j, b_j>

        c_j(a, b) = <G_l a, b A_l>                 Dense/Conv weight of layer l (as out x (in*kh*kw))
                    <diag(a_l) a, b G_l>           Embedding table
                    <g_j^2 / batch_size, a b>      LayerNorm gamma/beta (the diagonal THOR inverts)
                    0                              every other parameter (no curvature is stored)

    A_l, G_l: the layer's stored factors (diagonal blocks as stored, G divided by the square of the loss scale
    of the backward pass that collected them): ``ms_optim._thor.quad_model``'s curvature (under the "gpu" and
    "ascend" conventions their factors; MindSpore's post-processing of the inverses is not modelled); the
    damping enters as d times the identity (THOR adds sqrt(d) to each factor: d I is the leading term of the
    product (A + sqrt(d) I) (x) (G + sqrt(d) I), whose cross terms make THOR's own step shorter than the
    model's minimiser along it, so alpha > 1 is common).

    M = [[K(x, x), K(x, y)], [K(x, y), K(y, y)]],   b = [<h, x>, <h, y>]      (M, b averaged over the ranks)
    minimise  m(alpha, beta) = 1/2 [alpha beta] M [alpha beta]^T + b . [alpha beta]:

    2-D:  det = M00 M11 - M01^2;  (alpha, beta) = (M01 b1 - M11 b0, M01 b0 - M00 b1) / det
          taken when M00 > 0, M11 > 0, det > DEGENERATE * M00 M11, everything finite, and its m is not above
          the 1-D step's m
    1-D:  (alpha, beta) = (-b0 / M00, 0)          otherwise, when M00 > 0, b0 and its m finite (the first
                                                  step: y = 0; the entries of y play no part)
    none: (alpha, beta) = (0, 0)                  otherwise (no finite model: the parameters stay)

    trust region (kl_clip = c given):  k = [alpha beta] M [alpha beta]^T   (the step's damped curvature norm,
          twice its KL estimate);  (alpha, beta) <- (alpha, beta) * min(1, sqrt(c / k))   when k is finite > 0

    s_j  <- alpha x_j + beta y_j;   w_j <- w_j + s_j;   moments.<name> <- s_j

``alpha`` plays the learning rate and ``beta`` the momentum; both are recorded (``step_size``,
``momentum_coefficient``). What the other arguments become: ``momentum`` is validated as always and not used
(the momentum coefficient is ``beta``); ``kl_clip`` is the trust region above instead of THOR's scaling of the
preconditioned gradient (which the solve would undo: the model's minimiser does not depend on the direction's
length); ``use_nesterov=True`` is refused. A damping Tensor (schedule) or ``damping="adaptive"`` both work:
with the adaptive damping its reduction ratio measures the step actually taken (``quad_model`` with
``delta = moments``, the update itself).

Data parallel: the gradients are the ranks' mean and the inverses are the same on every rank, but each rank's
stored factors are its own batch's, so M and b are averaged over the ranks (one all-reduce of 5 numbers) and
every rank takes the same step. The mean of the ranks' models is not the model of the concatenated batch (the
Kronecker product is not linear in the factors), so a data-parallel run is not the single-process run on the
concatenated batch number for number, as it is with a learning-rate schedule.
"""
from __future__ import annotations

from typing import Sequence

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim._thor import preconditioner as pc
from ms_optim._thor.config import ThorConfig
from ms_optim._thor.optimizer import ThorOptimizer
from ms_optim._thor.parallel import sum_allreduce
from ms_optim._thor.update import apply_decay, clip_to_unit_norm

__all__ = ["AdaptiveLrThorOptimizer", "QuadraticStep", "DEGENERATE", "system_terms", "solve_coefficients"]

#: the 2x2 system counts as singular when det <= DEGENERATE * M00 * M11 (the directions nearly parallel)
DEGENERATE = 1e-5

#: ``hyper_map(F.partial(system_terms, d, wd, u, batch_size), treatments, decay_flags, gradients, directions,
#: previous, weights, a_factors, g_factors)``: each parameter's share of ``(M00, M01, M11, b0, b1)``
system_terms = C.MultitypeFuncGraph("thor_system_terms")
#: ``hyper_map(F.partial(take_step, alpha, beta), directions, weights, previous)``: ``s = -alpha u + beta y``
take_step = C.MultitypeFuncGraph("thor_take_step")


def _dots(ca, cb, a, b):
    """``(<ca, a>, <ca, b>, <cb, b>)``: the curvature's bilinear form from its two half-products."""
    return ops.reduce_sum(ca * a), ops.reduce_sum(ca * b), ops.reduce_sum(cb * b)


@system_terms.register("Tensor", "Tensor", "Tensor", "Number", "Tuple", "Bool", "Tensor", "Tensor", "Tensor",
                       "Tensor", "Tensor", "Tensor")
def _system_terms_tensor(damping, weight_decay, g_unscale, batch_size, treatment, decay, gradient, direction,
                         previous, weight, a_factor, g_factor):
    """One parameter's ``(c(x,x) + r<x,x>, c(x,y) + r<x,y>, c(y,y) + r<y,y>, <h,x>, <h,y>)``, float32, with
    ``r = d (+ wd)`` and ``h = g (+ wd w)`` (module docstring)."""
    kind, g_geom, a_geom = treatment
    g32 = ops.cast(gradient, mstype.float32)
    x = -ops.cast(direction, mstype.float32)
    y = ops.cast(previous, mstype.float32)
    ridge = damping
    h = g32
    if decay:
        ridge = damping + weight_decay
        h = g32 + weight_decay * ops.cast(weight, mstype.float32)
    zero = ops.zeros((), mstype.float32)
    cxx, cxy, cyy = zero, zero, zero
    if kind == pc.MATRIX:
        x2 = ops.reshape(x, (x.shape[0], -1))
        y2 = ops.reshape(y, (y.shape[0], -1))
        g_f = ops.cast(g_factor, mstype.float32)
        a_f = ops.cast(a_factor, mstype.float32)
        gx = pc.apply_left(g_f, x2, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        gy = pc.apply_left(g_f, y2, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        xa = pc.apply_right(x2, a_f, a_geom[0], a_geom[1], a_geom[2])
        ya = pc.apply_right(y2, a_f, a_geom[0], a_geom[1], a_geom[2])
        cxx, cxy, cyy = ops.reduce_sum(gx * xa), ops.reduce_sum(gx * ya), ops.reduce_sum(gy * ya)
    elif kind == pc.EMBEDDING:
        rows = ops.expand_dims(ops.cast(a_factor, mstype.float32), 1)
        g_f = ops.cast(g_factor, mstype.float32)
        xg = pc.apply_right(x, g_f, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        yg = pc.apply_right(y, g_f, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        cxx, cxy, cyy = _dots(rows * xg, rows * yg, x, y)
    elif kind == pc.LAYERNORM:
        diagonal = ops.square(g32) / batch_size
        cxx, cxy, cyy = _dots(diagonal * x, diagonal * y, x, y)
    nxx, nxy, nyy = _dots(x, y, x, y)
    return ops.stack([cxx + ridge * nxx, cxy + ridge * nxy, cyy + ridge * nyy, ops.reduce_sum(h * x),
                      ops.reduce_sum(h * y)])


@take_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _take_step_tensor(alpha, beta, direction, weight, previous):
    """``s = -alpha u + beta y``; ``w += s``; ``y <- s``."""
    step = beta * ops.cast(previous, mstype.float32) - alpha * ops.cast(direction, mstype.float32)
    done = ops.assign(previous, ops.cast(step, F.dtype(previous)))
    return F.depend(True, F.depend(ops.assign_add(weight, ops.cast(step, F.dtype(weight))), done))


def _model(alpha, beta, system):
    """``m(alpha, beta)`` and the curvature norm ``k = [alpha beta] M [alpha beta]^T``; with ``beta = 0`` the
    terms of y are left out (a non-finite M01, M11 or b1 does not spoil the 1-D step)."""
    zero = ops.zeros((), mstype.float32)
    moved = ops.not_equal(beta, zero)
    cross = 2.0 * alpha * beta * system[1] + beta * beta * system[2]
    k = alpha * alpha * system[0] + ops.select(moved, cross, zero)
    return 0.5 * k + alpha * system[3] + ops.select(moved, beta * system[4], zero), k


def solve_coefficients(system, kl_clip=None):
    """``(alpha, beta)`` from ``system = (M00, M01, M11, b0, b1)`` (float32 vector): the 2-D minimiser, the
    1-D fallback or zero, then the ``kl_clip`` trust region (module docstring); always finite."""
    m00, m01, m11, b0, b1 = system[0], system[1], system[2], system[3], system[4]
    zero = ops.zeros((), mstype.float32)
    one = ops.ones((), mstype.float32)
    safe00 = ops.select(m00 > 0, m00, one)
    alpha1 = -b0 / safe00
    q1, _ = _model(alpha1, zero, system)
    ok1 = ops.logical_and(m00 > 0, ops.logical_and(ops.isfinite(alpha1), ops.isfinite(q1)))
    det = m00 * m11 - m01 * m01
    regular = ops.logical_and(ops.logical_and(m00 > 0, m11 > 0), det > DEGENERATE * m00 * m11)
    safe_det = ops.select(regular, det, one)
    alpha2 = (m01 * b1 - m11 * b0) / safe_det
    beta2 = (m01 * b0 - m00 * b1) / safe_det
    q2, _ = _model(alpha2, beta2, system)
    finite2 = ops.logical_and(ops.logical_and(ops.isfinite(alpha2), ops.isfinite(beta2)), ops.isfinite(q2))
    ok2 = ops.logical_and(ops.logical_and(regular, finite2), ops.logical_or(q2 <= q1, ops.logical_not(ok1)))
    alpha = ops.select(ok2, alpha2, ops.select(ok1, alpha1, zero))
    beta = ops.select(ok2, beta2, zero)
    if kl_clip is not None:
        _, k = _model(alpha, beta, system)
        usable = ops.logical_and(ops.isfinite(k), k > 0)
        nu = ops.select(usable, ops.minimum(one, ops.sqrt(kl_clip / ops.select(usable, k, one))), one)
        alpha, beta = alpha * nu, beta * nu
    return alpha, beta


class QuadraticStep(nn.Cell):
    """The solve and the step of ``learning_rate="adaptive"`` (module docstring), built with the optimizer.

    ``step(weights, gradients, directions, previous, damping, thor_step, factor_loss_scale)`` -> success.
    State (float32 Parameters of shape (), in checkpoints): ``step_size`` (``thor_step_size``: alpha of the
    last step), ``momentum_coefficient`` (``thor_momentum_coefficient``: its beta), ``curvature_scale``
    (``thor_step_curvature_loss_scale``: the loss scale the stored G carries).
    """

    def __init__(self, config: ThorConfig, treatments: tuple, decay_flags: tuple, a_factors: Sequence,
                 g_factors: Sequence, batch_size: float):
        super().__init__(auto_prefix=False)
        self.treatments = treatments
        self.decay_flags = decay_flags
        self.a_factors = tuple(a_factors)
        self.g_factors = tuple(g_factors)
        self.batch_size = float(batch_size)
        self.weight_decay = Tensor(config.weight_decay, mstype.float32)
        self.kl_clip = None if config.kl_clip is None else Tensor(config.kl_clip, mstype.float32)
        self.hyper_map = ops.HyperMap()
        self.step_size = Parameter(Tensor(np.float32(0.0)), name="thor_step_size", requires_grad=False)
        self.momentum_coefficient = Parameter(Tensor(np.float32(0.0)), name="thor_momentum_coefficient",
                                              requires_grad=False)
        self.curvature_scale = Parameter(Tensor(np.float32(config.loss_scale)),
                                         name="thor_step_curvature_loss_scale", requires_grad=False)
        self.ranks = int(config.ranks)
        if self.ranks > 1:
            self.allreduce = sum_allreduce()
            self.rank_mean = 1.0 / self.ranks

    def construct(self, weights, gradients, directions, previous, damping, thor_step, factor_loss_scale):
        scale = ops.select(thor_step, ops.reshape(factor_loss_scale, ()), self.curvature_scale * 1.0)
        scale = F.depend(scale, ops.assign(self.curvature_scale, scale))
        unscale = ops.reciprocal(ops.square(scale))
        d = ops.reshape(ops.cast(damping, mstype.float32), ())
        terms = self.hyper_map(F.partial(system_terms, d, self.weight_decay, unscale, self.batch_size),
                               self.treatments, self.decay_flags, gradients, directions, previous, weights,
                               self.a_factors, self.g_factors)
        system = ops.reduce_sum(ops.stack(terms), 0)
        if self.ranks > 1:
            system = self.allreduce(system) * self.rank_mean
        alpha, beta = solve_coefficients(system, self.kl_clip)
        alpha = F.depend(alpha, ops.assign(self.step_size, alpha))
        beta = F.depend(beta, ops.assign(self.momentum_coefficient, beta))
        return self.hyper_map(F.partial(take_step, alpha, beta), directions, weights, previous)


class AdaptiveLrThorOptimizer(ThorOptimizer):
    """THOR with ``learning_rate="adaptive"`` (built by ``thor()`` for it): :class:`ThorOptimizer` whose
    update is :class:`QuadraticStep`'s (``quadratic_step``); ``moments`` hold the previous update,
    ``momentum`` is unused and ``get_lr()`` is 0 (``quadratic_step.step_size`` is the step size taken)."""

    def __init__(self, net: nn.Cell, layers: Sequence, config: ThorConfig):
        super().__init__(net, layers, config)
        none = Tensor(np.zeros((1,), np.float32))  # for the parameters of no THOR layer (never read)
        owners = self._param_owners
        self.quadratic_step = QuadraticStep(
            config, self.param_treatment, self.decay_flags,
            tuple(self.thor_cells[i].matrix_a_cov if i >= 0 else none for i in owners),
            tuple(self.thor_cells[i].matrix_g_cov if i >= 0 else none for i in owners), self.batch_size_float)
        self.update_is_moment = Tensor(-1.0, mstype.float32)  # quad_model's delta = -lr * moment = moment

    def _update(self, params, gradients, lam, damping, step, thor_step):
        """The directions (THOR's preconditioning, decay, clip; no KL scaling), the solved step, then the
        damping rule's ``after_update`` on the step taken."""
        directions = self._precondition(gradients, lam)
        if self.apply_weight_decay:
            directions = self.hyper_map(F.partial(apply_decay, self.weight_decay_tensor), self.decay_flags,
                                        params, directions)
        if self.enable_clip_grad:
            directions = self.hyper_map(clip_to_unit_norm, directions)
        success = self.quadratic_step(params, gradients, directions, self.moments, damping, thor_step,
                                      self.factor_loss_scale)
        return self.damping_rule.after_update(success, step, gradients, self.update_is_moment, self.moments)
