r"""The quadratic model of a THOR step, from the Kronecker factors the layers store.

``damping="adaptive"`` (``ms_optim._thor.adaptive``) compares the loss change a step made with the change
this model predicts for it. With ``g_j`` the gradient of trainable parameter ``j`` (divided by the loss scale,
averaged over data-parallel ranks; no weight decay: the loss the training cell measures has none) and
``delta_j`` the change the step made to it (``delta_j = -lr[t] * accum_j``, the momentum accumulation after
the step: weight decay, clipping and KL clipping included):

.. code-block:: text

    q = sum_j <g_j, delta_j> + 1/2 sum_j c_j(delta_j)

    Dense/Conv weight (delta: out x (in*kh*kw)):  c = <G_l delta, delta A_l>  (vec(d)^T (A_l (x) G_l) vec(d))
    Embedding table (vocab x dim):                c = <diag(a_l) delta, delta G_l>
    LayerNorm gamma/beta:                         c = <g^2 / batch_size, delta^2>  (the diagonal THOR inverts)
    every other parameter (biases, BatchNorm):    c = 0                            (no curvature is stored)

``A_l`` and ``G_l`` are the layer's stored factors (``matrix_a_cov``, ``matrix_g_cov``), diagonal blocks as
stored (``factors.stored_shape``) and G divided by the square of the loss scale of the backward pass that
collected them: the block-diagonal Kronecker curvature the preconditioner inverts, without the damping
(as kfac-jax's default, the damping is no part of the model the reduction ratio is measured against).

Why the stored factors and not a Jacobian-vector product: they are already in memory, the model costs a
few products of a weight's size per layer (the cost of preconditioning one gradient), and no second
backward-like pass through the net is needed; the ratio then measures how well THOR's own curvature
predicts the step, which is what the damping of that curvature should follow. Under the ``"gpu"`` and
``"ascend"`` conventions the factors are those conventions' (their normalisation is the curvature THOR
inverts there; MindSpore's post-processing of the inverses, ``device_rules``, is not modelled).

The same curvature, as a bilinear form over two directions, builds the 2x2 system of
``learning_rate="adaptive"`` (:data:`system_terms`, :func:`model_system`, :func:`solve_coefficients`; the
formulas are in ``ms_optim._thor.adaptive_lr``), which calibrates it on the batch.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import ops
from mindspore.ops import composite as C

from ms_optim._thor import preconditioner as pc

__all__ = ["model_term", "predicted_change", "system_terms", "flat_system_terms", "pick", "flat_float32",
           "model_system", "solve_coefficients", "averaged_coefficients", "quadratic", "DEGENERATE"]

#: the 2x2 system counts as singular when det <= DEGENERATE * M00 * M11 (the directions nearly parallel)
DEGENERATE = 1e-5

#: ``hyper_map(F.partial(model_term, lr, u, batch_size), treatments, gradients, moments, a_factors,
#: g_factors)``: ``<g, delta> + c(delta) / 2`` of each parameter (``u = 1 / loss_scale**2`` of the stored G)
model_term = C.MultitypeFuncGraph("thor_model_term")


@model_term.register("Tensor", "Tensor", "Number", "Tuple", "Tensor", "Tensor", "Tensor", "Tensor")
def _model_term_tensor(lr, g_unscale, batch_size, treatment, gradient, moment, a_factor, g_factor):
    """One parameter's ``<g, delta> + c(delta) / 2`` (module docstring), float32; ``delta = -lr * accum``."""
    kind, g_geom, a_geom = treatment
    g32 = ops.cast(gradient, mstype.float32)
    delta = -lr * ops.cast(moment, mstype.float32)
    linear = ops.reduce_sum(g32 * delta)
    if kind == pc.MATRIX:
        d2 = ops.reshape(delta, (delta.shape[0], -1))
        left = pc.apply_left(ops.cast(g_factor, mstype.float32), d2, g_geom[0], g_geom[1], g_geom[2])
        right = pc.apply_right(d2, ops.cast(a_factor, mstype.float32), a_geom[0], a_geom[1], a_geom[2])
        return linear + 0.5 * g_unscale * ops.reduce_sum(left * right)
    if kind == pc.EMBEDDING:
        rows = delta * ops.expand_dims(ops.cast(a_factor, mstype.float32), 1)
        right = pc.apply_right(delta, ops.cast(g_factor, mstype.float32), g_geom[0], g_geom[1], g_geom[2])
        return linear + 0.5 * g_unscale * ops.reduce_sum(rows * right)
    if kind == pc.LAYERNORM:
        return linear + 0.5 * ops.reduce_sum(ops.square(g32) / batch_size * ops.square(delta))
    return linear


def predicted_change(terms) -> object:
    """``q``: the sum of the per-parameter terms of :data:`model_term` (a float32 scalar)."""
    return ops.reduce_sum(ops.stack(terms))


# ----------------------------------------------------------------- learning_rate="adaptive"'s 2x2 system
#: ``hyper_map(F.partial(system_terms, wd, u), treatments, decay_flags, gradients, directions, previous,
#: weights, a_factors, g_factors)``: each Dense/Conv weight's and embedding table's share of the 13 numbers
#: ``(K, N, W, b, e)`` (every other parameter's: :func:`flat_system_terms`)
system_terms = C.MultitypeFuncGraph("thor_system_terms")


def _dots(ca, cb, a, b):
    """``(<ca, a>, <ca, b>, <cb, b>)``: a bilinear form from its two half-products."""
    return ops.reduce_sum(ca * a), ops.reduce_sum(ca * b), ops.reduce_sum(cb * b)


@system_terms.register("Tensor", "Tensor", "Tuple", "Bool", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor")
def _system_terms_tensor(weight_decay, g_unscale, treatment, decay, gradient, direction, previous, weight,
                         a_factor, g_factor):
    """One factored parameter's ``(K(x,x), K(x,y), K(y,y), N.., W.., <h,x>, <h,y>, <g,x>, <g,y>)``, float32
    (module docstring)."""
    kind, g_geom, a_geom = treatment
    g32 = ops.cast(gradient, mstype.float32)
    x = -ops.cast(direction, mstype.float32)
    y = ops.cast(previous, mstype.float32)
    zero = ops.zeros((), mstype.float32)
    if kind == pc.MATRIX:
        x2 = ops.reshape(x, (x.shape[0], -1))
        y2 = ops.reshape(y, (y.shape[0], -1))
        g_f = ops.cast(g_factor, mstype.float32)
        a_f = ops.cast(a_factor, mstype.float32)
        gx = pc.apply_left(g_f, x2, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        gy = pc.apply_left(g_f, y2, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        xa = pc.apply_right(x2, a_f, a_geom[0], a_geom[1], a_geom[2])
        ya = pc.apply_right(y2, a_f, a_geom[0], a_geom[1], a_geom[2])
        kxx, kxy, kyy = ops.reduce_sum(gx * xa), ops.reduce_sum(gx * ya), ops.reduce_sum(gy * ya)
    else:  # pc.EMBEDDING
        rows = ops.expand_dims(ops.cast(a_factor, mstype.float32), 1)
        g_f = ops.cast(g_factor, mstype.float32)
        xg = pc.apply_right(x, g_f, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        yg = pc.apply_right(y, g_f, g_geom[0], g_geom[1], g_geom[2]) * g_unscale
        kxx, kxy, kyy = _dots(rows * xg, rows * yg, x, y)
    nxx, nxy, nyy = _dots(x, y, x, y)
    h = g32
    wxx, wxy, wyy = zero, zero, zero
    if decay:
        h = g32 + weight_decay * ops.cast(weight, mstype.float32)
        wxx, wxy, wyy = nxx, nxy, nyy
    return ops.stack([kxx, kxy, kyy, nxx, nxy, nyy, wxx, wxy, wyy, ops.reduce_sum(h * x),
                      ops.reduce_sum(h * y), ops.reduce_sum(g32 * x), ops.reduce_sum(g32 * y)])


def pick(values, index):
    """``(values[i] for i in index)`` as a tuple (``index`` a constant tuple of ints; graph-mode safe)."""
    out = ()
    for i in index:
        out = out + (values[i],)
    return out


def flat_float32(values, index):
    """``values[i]`` for ``i`` in ``index``, each cast to float32 and flattened, as one vector."""
    parts = ()
    for i in index:
        parts = parts + (ops.reshape(ops.cast(values[i], mstype.float32), (-1,)),)
    return ops.concat(parts)


def flat_system_terms(weight_decay, batch_size, layernorm, decay, gradient, direction, previous, weight):
    """The 13 terms (:data:`system_terms`) of every parameter without Kronecker factors (LayerNorm gamma/beta:
    ``K`` from the diagonal ``g^2 / batch_size`` THOR inverts; the plain ones: ``K = 0``), summed, from their
    entries as flat float32 vectors: one computation for them all instead of a dozen small ones each (a net
    has many such parameters, each a few hundred entries or less). ``layernorm`` and ``decay`` are constant
    float32 masks of the same length (1.0 on a LayerNorm entry, 1.0 where ``decay_filter`` holds, else 0.0);
    ``direction`` is ``u`` (``x = -u``)."""
    x = -direction
    y = previous
    diagonal = layernorm * ops.square(gradient) / batch_size
    kxx, kxy, kyy = _dots(diagonal * x, diagonal * y, x, y)
    nxx, nxy, nyy = _dots(x, y, x, y)
    wxx, wxy, wyy = _dots(decay * x, decay * y, x, y)
    h = gradient + (weight_decay * decay) * weight
    return ops.stack([kxx, kxy, kyy, nxx, nxy, nyy, wxx, wxy, wyy, ops.reduce_sum(h * x),
                      ops.reduce_sum(h * y), ops.reduce_sum(gradient * x), ops.reduce_sum(gradient * y)])


def quadratic(a, b, m00, m01, m11):
    """``[a b] [[m00, m01], [m01, m11]] [a b]^T`` (``b = 0`` leaves the y terms out: a non-finite y entry does
    not spoil a 1-D step)."""
    moved = ops.not_equal(b, ops.zeros((), mstype.float32))
    cross = 2.0 * a * b * m01 + b * b * m11
    return a * a * m00 + ops.select(moved, cross, ops.zeros((), mstype.float32))


def _model(alpha, beta, system):
    """``m(alpha, beta)`` and the curvature norm ``k = [alpha beta] M [alpha beta]^T``."""
    k = quadratic(alpha, beta, system[0], system[1], system[2])
    moved = ops.not_equal(beta, ops.zeros((), mstype.float32))
    return 0.5 * k + alpha * system[3] + ops.select(moved, beta * system[4], ops.zeros((), mstype.float32)), k


def model_system(terms, kappa, damping, weight_decay):
    """``(M00, M01, M11, b0, b1)`` of ``M(kappa)`` (module docstring) from the 13 summed terms."""
    m = kappa * (terms[0:3] + damping * terms[3:6]) + weight_decay * terms[6:9]
    return ops.concat([m, terms[9:11]])


def _one_dimensional(system):
    """``(-b0 / M00, its model value, usable)``: the model's minimiser along x alone, usable when ``M00 > 0``
    and it and its model value are finite."""
    m00, b0 = system[0], system[3]
    zero = ops.zeros((), mstype.float32)
    alpha = -b0 / ops.select(m00 > 0, m00, ops.ones((), mstype.float32))
    value, _ = _model(alpha, zero, system)
    return alpha, value, ops.logical_and(m00 > 0, ops.logical_and(ops.isfinite(alpha), ops.isfinite(value)))


def _trust_region(alpha, beta, system, kl_clip):
    """``(alpha, beta) min(1, sqrt(kl_clip / k))``, ``k = [alpha beta] M [alpha beta]^T`` (unchanged where
    ``k`` is not positive and finite, or without ``kl_clip``)."""
    if kl_clip is None:
        return alpha, beta
    one = ops.ones((), mstype.float32)
    _, k = _model(alpha, beta, system)
    usable = ops.logical_and(ops.isfinite(k), k > 0)
    nu = ops.select(usable, ops.minimum(one, ops.sqrt(kl_clip / ops.select(usable, k, one))), one)
    return alpha * nu, beta * nu


def solve_coefficients(system, kl_clip=None):
    """``(alpha, beta)`` from ``system = (M00, M01, M11, b0, b1)`` (float32 vector): the 2-D minimiser, the
    1-D fallback or zero, then the ``kl_clip`` trust region (module docstring); always finite."""
    m00, m01, m11, b0, b1 = system[0], system[1], system[2], system[3], system[4]
    zero = ops.zeros((), mstype.float32)
    one = ops.ones((), mstype.float32)
    alpha1, q1, ok1 = _one_dimensional(system)
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
    return _trust_region(alpha, beta, system, kl_clip)


def averaged_coefficients(system, momentum, kl_clip=None):
    """``(alpha, beta) = ((1 - momentum) (-b0 / M00), momentum)`` from ``system = (M00, M01, M11, b0, b1)``:
    the step is ``momentum`` times the previous one plus ``1 - momentum`` times the model's minimiser along
    the new direction; ``(0, 0)`` when that minimiser is not usable (``M00 <= 0`` or not finite); then the
    ``kl_clip`` trust region (module docstring); always finite."""
    zero = ops.zeros((), mstype.float32)
    alpha1, _, ok1 = _one_dimensional(system)
    alpha = ops.select(ok1, (1.0 - momentum) * alpha1, zero)
    beta = ops.select(ok1, momentum + zero, zero)
    return _trust_region(alpha, beta, system, kl_clip)
