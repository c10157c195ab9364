r"""THOR's per-parameter rules, mapped over the parameters with ``hyper_map``: preconditioning and the
curvature product (each parameter's spec's ``apply``), weight decay, unit-norm clipping, momentum, and the
quadratic rule's trial and final moves.

The momentum rule (``momentum_rule.py``) runs them in one of two ways, same numbers:

* staged: the preconditioned gradients of every parameter, then the decay of every parameter, then the
  momentum steps (needed when a rule reads all of them: ``kl_clip``, ``enable_clip_grad``; and for Nesterov);
* :data:`sequential_step` otherwise: for each parameter in turn, precondition, decay and momentum step, with
  the parameter's preconditioning waiting for the previous parameter's update, so that one preconditioned
  gradient is alive at a time instead of a second gradient-sized set at the step's peak.

With an adaptive learning rate or damping the weights' values are read once, before the step's first branch
(:func:`decay_terms`, called by the step rules' ``read_weights``): a Parameter read again in a branch graph
that also writes it makes MindSpore copy it (a ``TensorMove`` of every such weight in each of the graphs
that read it, every step), and the adaptive step reads the weights three times. THOR's scheduled step reads
each weight's decay term just in time, in the branch: MindSpore copies the weights there, but reading every
term first would hold a parameter-sized set of terms through the preconditioning and raise the step's peak.

.. code-block:: text

    g     <- g + weight_decay * w          where the decay filter keeps w (and weight_decay > 0)
    accum <- momentum * accum + g
    w     <- w - lr * accum                (Nesterov: w <- w - lr * (g + momentum * accum))
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from ms_optim._thor.net.curvature import apply_form

__all__ = ["precondition", "curvature_product", "read_after", "decay_term", "decay_terms", "apply_decay",
           "clip_to_unit_norm", "momentum_step", "nesterov_step", "sequential_step", "scale", "restore",
           "take_trial", "move", "write_flag"]

precondition = C.MultitypeFuncGraph("thor_precondition")
curvature_product = C.MultitypeFuncGraph("thor_curvature_product")
read_after = C.MultitypeFuncGraph("thor_read_after")
decay_term = C.MultitypeFuncGraph("thor_decay_term")
apply_decay = C.MultitypeFuncGraph("thor_apply_decay")
clip_to_unit_norm = C.MultitypeFuncGraph("thor_clip_to_unit_norm")
momentum_step = C.MultitypeFuncGraph("thor_momentum_step")
nesterov_step = C.MultitypeFuncGraph("thor_nesterov_step")
sequential_step = C.MultitypeFuncGraph("thor_sequential_step")
scale = C.MultitypeFuncGraph("thor_scale")
restore = C.MultitypeFuncGraph("thor_restore")
take_trial = C.MultitypeFuncGraph("thor_take_trial")
move = C.MultitypeFuncGraph("thor_move")
write_flag = C.MultitypeFuncGraph("thor_write_flag")


@precondition.register("Tuple", "Number", "Tuple", "Tensor")
def _precondition_tensor(context, form, slot, gradient):
    """One parameter's preconditioned gradient: its spec's ``apply(slot, g, -1, context + (g,))`` (``form``:
    the apply's index, ``net/curvature.py``; ``context = (kernel, lam, g_unscale, batch_size)``)."""
    return apply_form(form, slot, gradient, -1, context + (gradient,))


@curvature_product.register("Tuple", "Bool", "Number", "Tuple", "Tensor", "Tensor")
def _curvature_product_tensor(context, curved, form, slot, gradient, vector):
    """``K v`` of one parameter: its spec's ``apply(slot, v, +1, context + (g,))``; ``v`` itself, unread, for
    a parameter without curvature (``curved`` False: no op is spent on its zero)."""
    if curved:
        return apply_form(form, slot, vector, 1, context + (gradient,))
    return vector


@decay_term.register("Tensor", "Bool", "Tensor")
def _decay_term_tensor(weight_decay, decay, weight):
    """``wd * w`` where the decay filter keeps the parameter; else ``wd`` itself (a placeholder
    :data:`apply_decay` does not read)."""
    if decay:
        return weight_decay * weight
    return weight_decay


@read_after.register("Tensor", "Tensor")
def _read_after_tensor(anchor, weight):
    """The weight's value, read after ``anchor``."""
    return ops.depend(weight, anchor)


@read_after.register("Tuple", "Tensor")
def _read_after_tuple(anchor, weight):
    """The weight's value, read after every element of ``anchor``."""
    return ops.depend(weight, anchor)


def decay_terms(hyper_map, weight_decay, decay_flags, weights, anchor=None):
    """The weight-decay terms ``wd * w`` of every parameter (:data:`decay_term`; the weights read after
    ``anchor`` when one is given), or ``weights`` themselves, unread, when ``weight_decay`` is None (no
    decay)."""
    if weight_decay is None:
        return weights
    if anchor is not None:
        weights = hyper_map(F.partial(read_after, anchor), weights)
    return hyper_map(F.partial(decay_term, weight_decay), decay_flags, weights)


@apply_decay.register("Bool", "Tensor", "Tensor")
def _apply_decay_tensor(decay, term, gradient):
    """``g + wd * w`` where the decay filter keeps the parameter (``term``: its :data:`decay_term`)."""
    if decay:
        return gradient + term
    return gradient


@clip_to_unit_norm.register("Tensor")
def _clip_to_unit_norm_tensor(gradient):
    """Per-tensor clip to L2 norm 1: g / max(||g||, 1)."""
    norm = ops.sqrt(ops.reduce_sum(ops.square(ops.cast(gradient, mstype.float32))))
    scale = ops.cast(ops.reciprocal(ops.maximum(norm, 1.0)), F.dtype(gradient))
    return gradient * scale


@momentum_step.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _momentum_step_tensor(opt, momentum, learning_rate, gradient, weight, moment):
    """accum = m * accum + g; w -= lr * accum (the fused ApplyMomentum kernel)."""
    return F.depend(True, opt(weight, moment, learning_rate, gradient, momentum))


@nesterov_step.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _nesterov_step_tensor(momentum, learning_rate, gradient, weight, moment):
    """accum = m * accum + g; w -= lr * (g + m * accum). Written out: ``ApplyMomentum(use_nesterov=True)``'s
    CPU kernel in MindSpore 2.10 ignores the flag (it performs the plain momentum update)."""
    gradient = ops.cast(gradient, F.dtype(moment))
    accum = momentum * moment + gradient
    done = ops.assign(moment, accum)
    update = ops.cast(learning_rate * (gradient + momentum * accum), F.dtype(weight))
    return F.depend(True, F.depend(ops.assign_sub(weight, update), done))


@sequential_step.register("Tuple", "Tuple", "Number", "Tuple", "Bool", "Tensor", "Tensor", "Tensor", "Tensor")
def _sequential_step_tensor(update, context, form, slot, decay, term, gradient, weight, moment):
    """One parameter: :data:`precondition`, :data:`apply_decay` (``term``: its :data:`decay_term`),
    :data:`momentum_step`.

    ``update = (opt, momentum, learning_rate, weight_decay or None, read)``; with ``read`` the decay term is
    read here, from the weight (``term`` is then a placeholder). ``context``, ``form`` and ``slot`` as
    :data:`precondition`'s. The momentum steps are side effects, run in parameter order, and each parameter's
    reads of its inverses (and of its weight) are ordered after the previous step, so one preconditioned
    gradient is alive at a time. (A depend of the gradient on the moment Parameter itself ordered nothing: a
    Parameter is no node of the execution order.)
    """
    opt, momentum, learning_rate, weight_decay, read = update
    gradient = precondition(context, form, slot, gradient)
    if weight_decay is not None:
        if read:
            term = decay_term(weight_decay, decay, weight)
        gradient = apply_decay(decay, term, gradient)
    return momentum_step(opt, momentum, learning_rate, gradient, weight, moment)


@scale.register("Tensor", "Tensor")
def _scale_tensor(factor, value):
    """``factor * value`` in float32."""
    return factor * ops.cast(value, mstype.float32)


@restore.register("Tensor", "Tensor", "Tensor")
def _restore_tensor(weight, before, moment):
    """Take back a momentum step: the weight as ``before`` it, ``accum <- 0`` (the accumulation that made the
    step is dropped with it)."""
    back = ops.assign(weight, before)
    return F.depend(True, ops.assign(moment, ops.depend(ops.zeros_like(moment), back)))


@take_trial.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _take_trial_tensor(coefs, direction, weight, previous, stored):
    """``x = -u`` into ``stored``; ``w += a0 x + b0 y`` (``coefs = [a0, b0]``; ``u``: the preconditioned
    ``direction``, ``y``: the previous update)."""
    x = -ops.cast(direction, mstype.float32)
    kept = ops.assign(stored, ops.cast(x, F.dtype(stored)))
    step = coefs[0] * x + coefs[1] * ops.cast(previous, mstype.float32)
    return F.depend(True, F.depend(ops.assign_add(weight, ops.cast(step, F.dtype(weight))), kept))


@move.register("Tensor", "Tensor", "Tensor", "Tensor")
def _move_tensor(coefs, vector, weight, previous):
    """``w += c0 v + c1 y``; ``y <- c2 v + c3 y`` (``coefs = [c0 .. c3]``, ``y``: the previous update)."""
    v = ops.cast(vector, mstype.float32)
    y = ops.cast(previous, mstype.float32)
    moved = ops.assign_add(weight, ops.cast(coefs[0] * v + coefs[1] * y, F.dtype(weight)))
    step = ops.depend(coefs[2] * v + coefs[3] * y, moved)
    return F.depend(True, ops.assign(previous, ops.cast(step, F.dtype(previous))))


@write_flag.register("Tensor", "Tensor")
def _write_flag_tensor(value, flag):
    """A layer's ``thor_flag`` <- ``value``: one ``hyper_map`` over the layers' flags at the end of the step
    (an unrolled loop of assignments keeps a larger compiled graph)."""
    return ops.assign(flag, value)
