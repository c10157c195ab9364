r"""THOR's per-parameter update rules after preconditioning: weight decay, unit-norm clipping, momentum.

``ThorOptimizer.construct`` maps them over the parameters (``hyper_map``). Two ways, same numbers:

* staged: the preconditioned gradients of every parameter, then the decay of every parameter, then the
  momentum steps (needed when a rule reads all of them: ``kl_clip``, ``enable_clip_grad``; and for Nesterov);
* :data:`sequential_step` otherwise: for each parameter in turn, precondition, decay and momentum step,
  with the parameter's preconditioning waiting for the previous parameter's update. Staged, the
  preconditioned gradients of all parameters lived at once: a second gradient-sized set at the step's
  peak (BERT-base: 0.4 GiB). Sequential, one parameter's at a time.

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

from ms_optim._thor import preconditioner as pc

__all__ = ["apply_decay", "clip_to_unit_norm", "momentum_step", "nesterov_step", "sequential_step",
           "write_flag"]

apply_decay = C.MultitypeFuncGraph("thor_apply_decay")
clip_to_unit_norm = C.MultitypeFuncGraph("thor_clip_to_unit_norm")
momentum_step = C.MultitypeFuncGraph("thor_momentum_step")
nesterov_step = C.MultitypeFuncGraph("thor_nesterov_step")
sequential_step = C.MultitypeFuncGraph("thor_sequential_step")
write_flag = C.MultitypeFuncGraph("thor_write_flag")


@apply_decay.register("Tensor", "Bool", "Tensor", "Tensor")
def _apply_decay_tensor(weight_decay, decay, weight, gradient):
    """g + wd * w where the decay filter keeps the parameter."""
    if decay:
        return gradient + weight_decay * ops.cast(weight, F.dtype(gradient))
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


@sequential_step.register("Tuple", "Tuple", "Tuple", "Bool", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _sequential_step_tensor(update, precondition, treatment, decay, gradient, weight, moment, g_inv, a_inv):
    """One parameter: ``pc.precondition_parameter``, :data:`apply_decay`, :data:`momentum_step`.

    ``update = (opt, momentum, learning_rate, weight_decay or None)``; ``precondition = (kernel, lam,
    batch_size)`` (``precondition_parameter``'s leading arguments); ``g_inv``/``a_inv``: the parameter's
    layer's stored inverses. The momentum steps are side effects, run in parameter order, and each
    parameter's reads of its inverses (or of its weight, for the decay) are ordered after the previous
    step, so one preconditioned gradient is alive at a time. (A depend of the gradient on the moment
    Parameter itself ordered nothing: a Parameter is no node of the execution order.)
    """
    opt, momentum, learning_rate, weight_decay = update
    kernel, lam, batch_size = precondition
    gradient = pc.precondition_parameter(kernel, lam, batch_size, treatment, gradient, g_inv, a_inv)
    if weight_decay is not None:
        gradient = apply_decay(weight_decay, decay, weight, gradient)
    return momentum_step(opt, momentum, learning_rate, gradient, weight, moment)


@write_flag.register("Tensor", "Tensor")
def _write_flag_tensor(value, flag):
    """A layer's ``thor_flag`` <- ``value``: one ``hyper_map`` over the layers' flags at the end of the step
    (an unrolled loop of assignments kept 11 MiB more of compiled graph at ResNet-50)."""
    return ops.assign(flag, value)
