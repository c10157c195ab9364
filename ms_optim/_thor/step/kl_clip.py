r"""KL clipping of THOR's preconditioned update (``thor(..., kl_clip=c)``), in kfac-pytorch's form.

With ``kl_clip=None`` (the default) nothing here runs and THOR is MindSpore's THOR exactly. With a
positive ``c``, on every step ``t``:

.. code-block:: text

    g_j  <- grad_j / loss_scale          the gradient of trainable parameter j, as the step receives it
    v_j  <- preconditioned g_j           Dense/Conv2d weight: Ginv g Ainv; embedding table: diag(Ainv) g Ginv;
                                         LayerNorm gamma/beta: g / (g^2 / batch_size + lam);
                                         every other parameter (biases, BatchNorm, ...): v_j = g_j
    s    <- sum_j <v_j, g_j>             over ALL trainable parameters (elementwise products summed)
    q    <- lr[t]^2 * |s|
    nu   <- min(1, sqrt(c / q))          if q is finite and > 0, else nu <- 1
    v_j  <- nu * v_j                     for every trainable parameter j

and the step goes on (weight decay, clipping, momentum) with the scaled ``v``. ``q`` estimates the
KL divergence (twice the quadratic model of the loss change) a step of ``lr[t] * v`` would cause;
clipping it at ``c`` bounds the step in the natural-gradient metric whatever the damping, which is
what keeps small damping from blowing up a network between two inverse refreshes.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import ops
from mindspore.ops import functional as F

__all__ = ["kl_clip_factor", "apply_kl_clip"]


def kl_clip_factor(preconditioned, gradients, lr, kl_clip):
    """``nu = min(1, sqrt(kl_clip / (lr^2 * |sum_j <v_j, g_j>|)))`` (1 when the denominator is 0 or
    not finite), a float32 scalar. ``preconditioned``/``gradients``: tuples of Tensors (v and g, same
    order and shapes); ``lr``: the learning rate of this step (scalar Tensor); ``kl_clip``: a float32
    scalar Tensor."""
    vg = ops.zeros((), mstype.float32)
    for j in range(len(gradients)):
        v = ops.cast(preconditioned[j], mstype.float32)
        g = ops.cast(gradients[j], mstype.float32)
        vg = vg + ops.reduce_sum(v * g)
    lr32 = ops.cast(ops.reshape(lr, ()), mstype.float32)
    q = lr32 * lr32 * ops.abs(vg)
    one = ops.ones((), mstype.float32)
    usable = ops.logical_and(ops.isfinite(q), q > 0)
    nu = ops.minimum(one, ops.sqrt(kl_clip / ops.select(usable, q, one)))
    return ops.select(usable, nu, one)


def apply_kl_clip(preconditioned, gradients, lr, kl_clip):
    """Every ``v_j`` times :func:`kl_clip_factor` (each in its own dtype); returns the new tuple."""
    nu = kl_clip_factor(preconditioned, gradients, lr, kl_clip)
    clipped = ()
    for j in range(len(preconditioned)):
        v = preconditioned[j]
        clipped += (v * ops.cast(nu, F.dtype(v)),)
    return clipped
