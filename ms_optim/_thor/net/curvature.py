r"""How each layer kind applies its curvature to a vector: ``spec.apply(slot, vector, power, step)``.

THOR's curvature of one trainable parameter is a Kronecker product of its layer's stored factors (or, for the
parameters of no factored layer, a diagonal or nothing). Everything the optimizer does with it goes through
one method of the parameter's spec (``kinds.py``): ``power=-1`` is the damped inverse THOR preconditions with
(from the inverses of the last refresh), ``power=+1`` the curvature itself, ``K v`` (from the stored factors,
undamped: the quadratic model adds the damping). The forms (``V``: the vector viewed as its layer's matrix):

.. code-block:: text

    Kronecker (Dense, conv: V is out x (in*kh*kw))     -1: G^-1 V A^-1            +1: u G V A
    row-diagonal (Embedding: V is vocab x dim)          -1: diag(A^-1) V G^-1      +1: u diag(a) V G
    gradient square (LayerNorm gamma and beta)          -1: V / (g^2 / B + lam)    +1: (g^2 / B) V
    none (biases, BatchNorm, ...)                       -1: V                      +1: 0

``G``, ``A`` (and an embedding's diagonal ``a``) are the blocks the layer stores, their inverses those the
optimizer stores (``inversion/slot.py``); ``u = 1 / s**2`` undoes the loss scale ``s`` the stored G carries;
``g`` is the parameter's gradient this step, ``B`` thor()'s ``batch_size`` and ``lam = sqrt(damping)``.

The arguments (plain tuples: GRAPH_MODE maps the method over the parameters with ``hyper_map``, each element
with its own spec's method as a constant):

* ``slot``: the parameter's layer, ``(g_geom, a_geom, g_inv, a_inv, g_cov, a_cov)`` (geometries ``(n, nblocks,
  bs)`` and the four Parameters; ``a_geom`` is unused for a diagonal A), or ``()`` for a parameter of no
  layer;
* ``step``: ``(kernel, lam, g_unscale, batch_size, gradient)``: ``()`` or the fused CPU ops ``(precondition,
  product)`` of block matrices (``factor_kernels``: ``L v R`` and ``s L v R``), ``lam``, ``u``, ``B`` and the
  gradient.

A form's ``has_curvature`` says whether ``+1`` can be non-zero: the quadratic model computes products only
where it is True. A new kind with another curvature is a spec with its own ``apply``; nothing else changes.
``apply`` is a static method. The optimizer's graph reaches it by its form's index (:func:`form_index`, a
constant in ``hyper_map``'s sequences; :func:`apply_form` calls the form), not by the function itself: a
function passed through ``hyper_map`` makes MindSpore compile the calling function once per parameter
instead of once per signature (on ResNet-50 a third more graph before optimization, and a compile that much
longer), where a constant integer lets parameters of the same signature share one compiled function.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import jit_class, ops
from mindspore.ops import functional as F

from ms_optim._thor.net.blocks import apply_left, apply_right

__all__ = ["KroneckerCurvature", "RowDiagonalCurvature", "GradientSquareCurvature", "NoCurvature",
           "form_index", "apply_form"]


@jit_class
class KroneckerCurvature:
    """``G V A`` over the ``(out, -1)`` view ``V`` of a Dense or conv weight's vector."""

    has_curvature = True

    @staticmethod
    def apply(slot, vector, power, step):
        g_geom, a_geom, g_inv, a_inv, g_cov, a_cov = slot
        kernel, _, g_unscale, _, _ = step
        if kernel:  # the ops read a conv kernel's vector as out x (in*kh*kw) themselves: no reshapes
            if power > 0:
                return ops.cast(kernel[1](ops.cast(vector, mstype.float32), g_cov, a_cov, g_unscale),
                                F.dtype(vector))
            return ops.cast(kernel[0](ops.cast(vector, mstype.float32), g_inv, a_inv), F.dtype(vector))
        if power > 0:
            left, right = ops.cast(g_cov, mstype.float32), ops.cast(a_cov, mstype.float32)
        else:
            left, right = g_inv, a_inv
        shape = vector.shape
        v2 = ops.reshape(ops.cast(vector, mstype.float32), (shape[0], -1))
        v2 = apply_left(left, v2, g_geom[0], g_geom[1], g_geom[2])
        product = ops.reshape(apply_right(v2, right, a_geom[0], a_geom[1], a_geom[2]), shape)
        if power > 0:
            product = product * g_unscale
        return ops.cast(product, F.dtype(vector))


@jit_class
class RowDiagonalCurvature:
    """``diag(a) V G`` over an embedding table ``V`` (vocab x dim): A is kept as its diagonal ``a``."""

    has_curvature = True

    @staticmethod
    def apply(slot, vector, power, step):
        g_geom, _, g_inv, a_inv, g_cov, a_cov = slot
        _, _, g_unscale, _, _ = step
        v32 = ops.cast(vector, mstype.float32)
        if power > 0:
            rows = v32 * ops.expand_dims(ops.cast(a_cov, mstype.float32), 1)
            product = apply_right(rows, ops.cast(g_cov, mstype.float32), g_geom[0], g_geom[1], g_geom[2])
            return ops.cast(product * g_unscale, F.dtype(vector))
        rows = v32 * ops.expand_dims(a_inv, 1)
        return ops.cast(apply_right(rows, g_inv, g_geom[0], g_geom[1], g_geom[2]), F.dtype(vector))


@jit_class
class GradientSquareCurvature:
    """The elementwise ``g^2 / B`` of the parameter's own gradient (THOR's LayerNorm rule)."""

    has_curvature = True

    @staticmethod
    def apply(slot, vector, power, step):
        _, lam, _, batch_size, gradient = step
        if power > 0:
            return ops.square(gradient) / batch_size * vector
        return vector / (ops.square(gradient) / batch_size + lam)


@jit_class
class NoCurvature:
    """No curvature is stored: the vector passes unchanged (``-1``), its curvature is 0 (``+1``)."""

    has_curvature = False

    @staticmethod
    def apply(slot, vector, power, step):
        if power > 0:
            return ops.zeros_like(vector)
        return vector


#: every form's ``apply`` a parameter table has named, in the order they were first named (a list that only
#: grows, so an index once given stays valid for every optimizer of the process)
_FORMS: list = []


def form_index(apply) -> int:
    """The index :func:`apply_form` reaches ``apply`` (a spec's static ``apply``) by, registering it the
    first time: a new kind's own ``apply`` needs nothing else."""
    if apply not in _FORMS:
        _FORMS.append(apply)
    return _FORMS.index(apply)


def apply_form(form, slot, vector, power, step):
    """``apply(slot, vector, power, step)`` of the form whose index is ``form`` (graph side: a constant)."""
    return _FORMS[form](slot, vector, power, step)
