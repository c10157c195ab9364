r"""THOR's quadratic model of the loss over the span of one or two directions, and its one solve.

For directions ``v = (v_0, v_1)`` (the new preconditioned direction and the previous update; or one direction,
the update a learning-rate schedule made), every part of the model is a matrix of inner products summed over
all trainable parameters ``j`` (``c_j``: the parameter's curvature, its spec's ``apply(+1)``):

.. code-block:: text

    A[i, k] = sum_j <c_j(v_i), v_k>          the curvature of the stored factors, undamped
    D[i, k] = sum_j <v_i, v_k>               what the damping multiplies
    R[i, k] = sum_j [decay_filter(w_j)] <v_i, v_k>     what weight decay multiplies
    e[i]    = sum_j <g_j, v_i>               the gradient of the loss the training cell measures
    b[i]    = e[i] + sum_j [decay_filter(w_j)] <wd w_j, v_i>   the gradient of loss + wd/2 ||w||^2

    M(kappa, d) = kappa (A + d D) + wd R     the model's matrix; its value at coefficients w = (alpha, beta):
    m(w) = 1/2 w^T M w + b . w               (the change of the regularised loss the step w . v makes)

:func:`build` computes every part at once: the parameters are cut into chunks of at most ``CHUNK_FLOATS``
entries (in order; a larger parameter is a chunk of its own), each chunk's entries are laid out as the rows
of a matrix ``V`` (one row per direction), and a few products of ``V`` (with ``g``, with the decayed ``w``,
with ``c(v)``) give all its inner products: a handful of kernels per chunk, not a dozen per parameter.

:func:`solve` chooses the coefficients, each one either solved or fixed:

.. code-block:: text

    fixed = (None, None):  the minimiser of m over (alpha, beta):
        det = M00 M11 - M01^2;  (alpha, beta) = (M01 b1 - M11 b0, M01 b0 - M00 b1) / det
        when M00 > 0, M11 > 0, det > DEGENERATE M00 M11, all finite, and m there not above the 1-D step's;
        else the 1-D step below; else (0, 0)
    fixed = (None, 0.0):   the 1-D step (-b0 / M00, 0) when M00 > 0 and it and m there are finite, else (0, 0)

:func:`coefficients` is the step of ``learning_rate="adaptive"``: both solved (``momentum="adaptive"``), or
the average ``((1 - mu) alpha_1, mu)`` of the model's 1-D steps for a momentum ``mu``, then
:func:`trust_region`, which scales a step to ``w^T M w <= kl_clip``. :func:`change` is the model's value
without weight decay at fixed coefficients (a learning-rate schedule's update: the damping rule's predicted
change).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor, ops

__all__ = ["QuadModel", "CHUNK_FLOATS", "DEGENERATE", "chunk_plan", "build", "matrix", "quadratic", "change",
           "solve", "coefficients", "trust_region", "mean_over", "fused_plan", "build_fused", "ModelPlan",
           "model_plan", "build_model", "pack", "unpack", "SYSTEM_SIZE", "Chunk"]

#: the 2x2 system counts as singular when det <= DEGENERATE * M00 * M11 (the directions nearly parallel)
DEGENERATE = 1e-5
#: the largest chunk of parameter entries laid out as one matrix (a larger parameter is reduced on its own)
CHUNK_FLOATS = 1 << 18
#: the number of floats :func:`pack` stores a two-direction model in
SYSTEM_SIZE = 13


class QuadModel(NamedTuple):
    """The parts of the quadratic model (module docstring): ``A``, ``D``, ``R`` are ``(k, k)``, ``b`` and
    ``e`` ``(k,)`` float32 Tensors, for ``k`` (1 or 2) directions.

    Inside a compiled step the model travels as the plain tuple of these fields in this order, and every
    function unpacks it by name (``a, d, r, b, e = model``): MindSpore 2.10's GRAPH_MODE does not carry a
    NamedTuple through a function call (it falls back to interpreted Python, in float64). Python code reads a
    stored model as ``QuadModel(*unpack(system))``."""

    A: Tensor
    D: Tensor
    R: Tensor
    b: Tensor
    e: Tensor


class Chunk(NamedTuple):
    """One chunk of :func:`build`: the indices of its parameters, of those ``decay_filter`` keeps and of those
    with a curvature (constants of the graph)."""

    params: Tuple[int, ...]
    decayed: Tuple[int, ...]
    curved: Tuple[int, ...]


def chunk_plan(sizes: Sequence[int], decayed: Sequence[bool], curved: Sequence[bool]) -> Tuple[Chunk, ...]:
    """The parameters (their entry counts ``sizes``) cut into consecutive :class:`Chunk` s of at most
    :data:`CHUNK_FLOATS` entries (a parameter larger than that alone)."""
    groups, current, filled = [], [], 0
    for index, size in enumerate(sizes):
        if current and filled + size > CHUNK_FLOATS:
            groups.append(current)
            current, filled = [], 0
        current.append(index)
        filled += size
    if current:
        groups.append(current)
    return tuple(Chunk(tuple(g), tuple(j for j in g if decayed[j]), tuple(j for j in g if curved[j]))
                 for g in groups)


def _flat(values, index):
    """``values[j]`` for ``j`` in ``index``, each as a flat float32 vector, as one vector."""
    parts = ()
    for j in index:
        parts = parts + (ops.reshape(ops.cast(values[j], mstype.float32), (-1,)),)
    return ops.concat(parts) if len(parts) > 1 else parts[0]


def _matrix_rows(vectors, index):
    """``(k, n)``: each of the ``k`` tuples of ``vectors`` laid out over the parameters ``index``."""
    return ops.stack(tuple(_flat(vector, index) for vector in vectors))


def build(directions, gradients, terms, products, chunks, with_terms=True):
    """The model's parts (:class:`QuadModel`'s fields, as a tuple) from tuples over the parameters:
    ``directions`` (a tuple of one or two tuples of vectors ``v_i``), ``gradients``, ``terms`` (the decay
    terms ``wd * w``, ``update.decay_term``: read for the chunks' ``decayed`` parameters only, and only
    ``with_terms``: without weight decay b = e), ``products`` (``c_j(v_i)`` per direction; read for the
    chunks' ``curved`` parameters only) and ``chunks`` (:func:`chunk_plan`). One chunk after the other, each
    with a few products of its laid-out entries."""
    k = len(directions)
    d = ops.zeros((k, k), mstype.float32)
    r, a = d, d
    e = ops.zeros((k,), mstype.float32)
    decay_dot = e
    for chunk in chunks:
        v = _matrix_rows(directions, chunk.params)
        both = ops.matmul(ops.concat((v, ops.expand_dims(_flat(gradients, chunk.params), 0))),
                          ops.transpose(v, (1, 0)))
        d = d + both[:k]
        e = e + both[k]
        if chunk.decayed:
            v_d = v if chunk.decayed == chunk.params else _matrix_rows(directions, chunk.decayed)
            if with_terms:
                rows = ops.concat((v_d, ops.expand_dims(_flat(terms, chunk.decayed), 0)))
                both = ops.matmul(rows, ops.transpose(v_d, (1, 0)))
                r = r + both[:k]
                decay_dot = decay_dot + both[k]
            else:
                r = r + ops.matmul(v_d, ops.transpose(v_d, (1, 0)))
        if chunk.curved:
            v_c = v if chunk.curved == chunk.params else _matrix_rows(directions, chunk.curved)
            a = a + ops.matmul(_matrix_rows(products, chunk.curved), ops.transpose(v_c, (1, 0)))
    return _symmetric(a), _symmetric(d), _symmetric(r), e + decay_dot, e


def fused_plan(directions: int, decayed: Sequence[bool], curved: Sequence[bool]) -> Tensor:
    """The plan of ``MsOptimQuadProducts`` (``factor_kernels.quad_kernels``): the number of directions, then
    per parameter ``1 * decayed + 2 * curved``."""
    flags = [float(directions)] + [float(int(d) + 2 * int(c)) for d, c in zip(decayed, curved)]
    return Tensor(np.array(flags, np.float64))


def build_fused(op, plan, directions, gradients, terms, products, decayed, with_terms=True):
    """:func:`build` as one fused CPU op over every parameter (``op``: ``MsOptimQuadProducts``; ``plan``:
    :func:`fused_plan`); where the op reads nothing (the second group of one direction, the decay terms that
    ``decayed`` leaves out, or all of them without ``with_terms``) it is handed a placeholder."""
    second = directions[1] if len(directions) > 1 else directions[0]
    second_products = products[1] if len(products) > 1 else products[0]
    read = ()
    for j in range(len(decayed)):
        read = read + ((terms[j],) if decayed[j] and with_terms else (directions[0][j],))
    out = op(*(directions[0] + second + gradients + read + products[0] + second_products + (plan,)))
    rows = out[3]
    if len(directions) > 1:
        return out[2], out[0], out[1], (rows[0] + rows[1]) if with_terms else rows[0], rows[0]
    e = rows[0][:1]
    return out[2][:1, :1], out[0][:1, :1], out[1][:1, :1], (e + rows[1][:1]) if with_terms else e, e


class ModelPlan(NamedTuple):
    """How :func:`build_model` builds a step rule's model: ``fused`` is ``()`` (the composite ops, one
    ``chunks`` entry after the other) or ``(op, plan)`` (:func:`build_fused`); ``decayed`` flags the
    parameters whose weight decay the model holds (their R), ``with_terms`` whether weight decay is applied
    (the decay terms are read for b)."""

    chunks: Tuple[Chunk, ...]
    decayed: Tuple[bool, ...]
    fused: tuple
    with_terms: bool


def model_plan(sizes: Sequence[int], decayed: Sequence[bool], curved: Sequence[bool], directions: int,
               op=None, with_terms: bool = False) -> ModelPlan:
    """The :class:`ModelPlan` of a model over ``directions`` directions; ``op``: the fused CPU op
    (``MsOptimQuadProducts``), or None for the composite ops; ``with_terms``: weight decay is applied."""
    fused = () if op is None else (op, fused_plan(directions, decayed, curved))
    return ModelPlan(chunk_plan(sizes, decayed, curved), tuple(bool(d) for d in decayed), fused,
                     bool(with_terms))


def build_model(plan, directions, gradients, terms, products):
    """The model's parts as ``plan`` (:func:`model_plan`) says: :func:`build_fused` or :func:`build`."""
    if plan.fused:
        op, flags = plan.fused
        return build_fused(op, flags, directions, gradients, terms, products, plan.decayed, plan.with_terms)
    return build(directions, gradients, terms, products, plan.chunks, plan.with_terms)


def _symmetric(part):
    """``(P + P^T) / 2``: a part whose two off-diagonal entries are the same inner product in two orders."""
    return 0.5 * (part + ops.transpose(part, (1, 0)))


def matrix(model, kappa, damping, weight_decay):
    """``M(kappa, d) = kappa (A + d D) + wd R``."""
    a, d, r, _, _ = model
    return kappa * (a + damping * d) + weight_decay * r


def quadratic(m, alpha, beta):
    """``[alpha beta] m [alpha beta]^T`` for a 2x2 ``m`` (``beta = 0`` leaves the second direction out: a
    non-finite entry there does not spoil a 1-D step)."""
    moved = ops.not_equal(beta, ops.zeros((), mstype.float32))
    cross = 2.0 * alpha * beta * m[0, 1] + beta * beta * m[1, 1]
    return alpha * alpha * m[0, 0] + ops.select(moved, cross, ops.zeros((), mstype.float32))


def _value(m, b, alpha, beta):
    """``m(alpha, beta)`` and ``[alpha beta] M [alpha beta]^T``."""
    k = quadratic(m, alpha, beta)
    moved = ops.not_equal(beta, ops.zeros((), mstype.float32))
    return 0.5 * k + alpha * b[0] + ops.select(moved, beta * b[1], ops.zeros((), mstype.float32)), k


def change(model):
    """The undamped model's change of the measured loss (no weight decay) at the single direction's
    coefficient 1: ``e0 + A00 / 2``."""
    a, _, _, _, e = model
    return e[0] + 0.5 * a[0, 0]


def _one_dimensional(m, b):
    """``(-b0 / M00, m there, usable)``: usable when ``M00 > 0`` and both are finite (reads ``M00`` and ``b0``
    only: a model over one direction serves)."""
    m00, b0 = m[0, 0], b[0]
    alpha = -b0 / ops.select(m00 > 0, m00, ops.ones((), mstype.float32))
    value = 0.5 * alpha * alpha * m00 + alpha * b0
    return alpha, value, ops.logical_and(m00 > 0, ops.logical_and(ops.isfinite(alpha), ops.isfinite(value)))


def solve(m, b, fixed=(None, None)):
    """``(alpha, beta, found)`` for the model's matrix ``m`` and gradient ``b`` (module docstring): both
    solved (``fixed=(None, None)``) or ``beta`` fixed at 0 (``fixed=(None, 0.0)``); ``found`` says whether a
    step was (``(0, 0)`` otherwise); always finite."""
    zero = ops.zeros((), mstype.float32)
    alpha1, q1, ok1 = _one_dimensional(m, b)
    if fixed[1] is not None:
        return ops.select(ok1, alpha1, zero), zero, ok1
    m00, m01, m11 = m[0, 0], m[0, 1], m[1, 1]
    det = m00 * m11 - m01 * m01
    regular = ops.logical_and(ops.logical_and(m00 > 0, m11 > 0), det > DEGENERATE * m00 * m11)
    safe_det = ops.select(regular, det, ops.ones((), mstype.float32))
    alpha2 = (m01 * b[1] - m11 * b[0]) / safe_det
    beta2 = (m01 * b[0] - m00 * b[1]) / safe_det
    q2, _ = _value(m, b, alpha2, beta2)
    finite2 = ops.logical_and(ops.logical_and(ops.isfinite(alpha2), ops.isfinite(beta2)), ops.isfinite(q2))
    ok2 = ops.logical_and(ops.logical_and(regular, finite2), ops.logical_or(q2 <= q1, ops.logical_not(ok1)))
    return (ops.select(ok2, alpha2, ops.select(ok1, alpha1, zero)), ops.select(ok2, beta2, zero),
            ops.logical_or(ok1, ok2))


def coefficients(m, b, momentum=None, kl_clip=None):
    """The step ``(alpha, beta)`` of the model's matrix ``m`` and gradient ``b``: with ``momentum`` None both
    solved (:func:`solve`); with a number ``mu`` the average of the model's steps along the first direction,
    ``((1 - mu) alpha_1, mu)`` (``(0, 0)`` where there is none); then :func:`trust_region` with
    ``kl_clip``."""
    if momentum is None:
        alpha, beta, _ = solve(m, b, (None, None))
    else:
        alpha, beta, found = solve(m, b, (None, 0.0))
        alpha, beta = (1.0 - momentum) * alpha, ops.select(found, momentum + beta, beta)
    return trust_region(m, alpha, beta, kl_clip)


def trust_region(m, alpha, beta, kl_clip):
    """``(alpha, beta) min(1, sqrt(kl_clip / k))``, ``k = [alpha beta] m [alpha beta]^T`` (unchanged where
    ``k`` is not positive and finite, or with ``kl_clip`` None)."""
    if kl_clip is None:
        return alpha, beta
    one = ops.ones((), mstype.float32)
    k = quadratic(m, alpha, beta)
    usable = ops.logical_and(ops.isfinite(k), k > 0)
    nu = ops.select(usable, ops.minimum(one, ops.sqrt(kl_clip / ops.select(usable, k, one))), one)
    return alpha * nu, beta * nu


def mean_over(model, mean):
    """Every part of ``model`` (one or two directions) averaged by ``mean`` (a ``RankMean``) in one call."""
    flat = mean(ops.concat(tuple(ops.reshape(part, (-1,)) for part in model)))
    out, start = (), 0
    for part in model:
        size = 1
        for dim in part.shape:
            size = size * dim
        out = out + (ops.reshape(flat[start:start + size], part.shape),)
        start = start + size
    return out


def _upper(part):
    return ops.stack((part[0, 0], part[0, 1], part[1, 1]))


def _symmetric_from(system, start):
    entries = (system[start], system[start + 1], system[start + 1], system[start + 2])
    return ops.reshape(ops.stack(entries), (2, 2))


def pack(model):
    """A two-direction model as the :data:`SYSTEM_SIZE` floats it is stored in between a step and its finish
    (the symmetric parts' upper triangles, then ``b`` and ``e``); :func:`unpack` reverses it."""
    a, d, r, b, e = model
    return ops.concat((_upper(a), _upper(d), _upper(r), b, e))


def unpack(system):
    """The model (fields of :class:`QuadModel`, in order) :func:`pack` stored."""
    return (_symmetric_from(system, 0), _symmetric_from(system, 3), _symmetric_from(system, 6), system[9:11],
            system[11:13])
