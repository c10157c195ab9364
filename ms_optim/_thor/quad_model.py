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
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import ops
from mindspore.ops import composite as C

from ms_optim._thor import preconditioner as pc

__all__ = ["model_term", "predicted_change"]

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
