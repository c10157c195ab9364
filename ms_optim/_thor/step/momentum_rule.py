r"""The step rule of a learning-rate schedule: THOR's momentum update, as MindSpore's THOR makes it.

On step ``t`` with ``g`` the gradients (divided by the loss scale) and ``u`` their preconditioning (each
parameter's spec's ``apply(-1)``: ``G^-1 g A^-1`` and the other kinds' rules):

.. code-block:: text

    if kl_clip is not None:  u <- nu u for every parameter       (``kl_clip.py``)
    u     <- u + weight_decay * w          where decay_filter(w)
    u     <- u / max(||u||_2, 1)           per tensor, if enable_clip_grad
    accum <- momentum * accum + u
    w     <- w - lr[t] * accum             (Nesterov: w <- w - lr[t] * (u + momentum * accum))

With ``damping="adaptive"`` every step is measured. The rule computes the change the quadratic model
predicts for the update the step made, ``delta = -lr[t] accum``: ``q = <g, delta> + 1/2 K(delta,
delta)`` (``quad_model.change`` of the one-direction model over ``delta``: the Kronecker curvature of the
stored factors without the damping, as kfac-jax measures its ratio, and without weight decay, which the
measured loss has not). The training cell runs the network once more on the step's batch: ``L1``, against the
step's loss ``L0`` (``L0``, ``L1`` and ``q`` averaged over the data-parallel ranks).
:meth:`MomentumRule.finish` takes the step back when it failed::

    failed = L1 not finite, or L1 - L0 > 2**-16 max(|L0|, |L1|) (it raised the loss on its batch),
             or q >= 0 outside rounding noise (the model itself says the step overshot its minimum)
    then    w <- w before the step (a copy: adding back a long update would round a small weight away),
            accum <- 0 (the momentum that made the step goes with it),
            d <- d * max(r, the Levenberg-Marquardt factor)  (r = 2 after a kept step, doubled by each
                                                               step taken back in a row: ``damping.py``)

so the next step is shorter and turns towards the gradient. On the adaptation steps the damping rule also
takes ``rho = (L1 - L0) / q`` (``FAILED_RATIO`` when not finite) for its Levenberg-Marquardt factor. A
learning rate too large for the net then gives taken-back steps and a higher damping, never a non-finite loss
or state.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import Tensor, nn, ops
from mindspore.ops import functional as F
from mindspore.ops import operations as P

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.modes import Mode
from ms_optim._thor.net.factor_kernels import quad_kernels
from ms_optim._thor.parallel import RankMean
from ms_optim._thor.step import quad_model as qm
from ms_optim._thor.step.damping import FAILED_RATIO, raised_loss, unresolved
from ms_optim._thor.step.kl_clip import apply_kl_clip
from ms_optim._thor.step.table import ParameterTable
from ms_optim._thor.step.update import (
    apply_decay,
    clip_to_unit_norm,
    curvature_product,
    decay_terms,
    momentum_step,
    nesterov_step,
    precondition,
    read_after,
    restore,
    scale,
    sequential_step,
)

__all__ = ["MomentumRule"]


class MomentumRule(nn.Cell):
    """THOR's update at the learning rate of the schedule (module docstring).

    Args:
        config (ThorConfig): the settings (weight decay, clipping, KL clip, Nesterov, the damping's mode).
        table (ParameterTable): the trainable parameters' specs, slots and flags.
        moments (ParameterTuple): the momentum accumulations (``moments.<name>``).
        momentum (Parameter): the momentum coefficient.
        damping_rule (Cell): the damping rule (its ``predicted`` and ``adapt`` with ``damping="adaptive"``).

    ``rule.read_weights(params, anchor)`` reads what the step needs of the weights' values before the
    optimizer's branches (the decay terms; with ``damping="adaptive"`` the copy of the weights a failed step
    is taken back to); ``rule(params, gradients, lr, context, step, terms)`` makes the update and returns its
    token; ``rule.finish(loss_before, loss_after)`` runs after the training cell's extra pass on the steps
    ``rule.probe_due`` names.
    """

    def __init__(self, config: ThorConfig, table: ParameterTable, weights, moments, momentum,
                 damping_rule: nn.Cell, fused: bool = False):
        super().__init__(auto_prefix=False)
        self.weights = weights
        self.forms, self.slots, self.decay_flags = table.forms, table.slots, table.decay_flags
        self.curved = table.curved
        self.moments = moments
        self.momentum = momentum
        self.opt = P.ApplyMomentum()
        self.hyper_map = ops.HyperMap()
        self.weight_decay = Tensor(config.weight_decay, mstype.float32)
        self.apply_weight_decay = config.weight_decay > 0
        self.decay = self.weight_decay if self.apply_weight_decay else None
        self.use_nesterov = config.use_nesterov
        self.enable_clip_grad = config.enable_clip_grad
        self.kl_clip = None if config.kl_clip is None else Tensor(config.kl_clip, mstype.float32)
        # one parameter after the other (precondition, decay, momentum) unless a rule needs all gradients at
        # once
        self.sequential = config.kl_clip is None and not config.enable_clip_grad and not config.use_nesterov
        self.measures = config.damping_mode == Mode.ADAPTIVE
        self.damping_rule = damping_rule
        if self.measures:
            # the model of the damping's predicted change: one direction, no weight decay; in one fused CPU op
            # over every parameter where they are all float32
            quad = quad_kernels(len(table.sizes)) if fused else None
            self.model_plan = qm.model_plan(table.sizes, (False,) * len(table.sizes), table.curved, 1,
                                            None if quad is None else quad.products)
            self.mean_over_ranks = RankMean(config.ranks)
            self.failed = Tensor(FAILED_RATIO, mstype.float32)
            # the parameters before the step: a step that failed is taken back exactly (adding back a long
            # update would round away a small weight)
            self.before = weights.clone(prefix="thor_before", init="zeros")

    def read_weights(self, params, anchor):
        """With ``damping="adaptive"``: the decay terms (``update.decay_terms``) and the copy of the weights
        before the step, read before the optimizer's branches (``update.py``), ordered after ``anchor``. On
        THOR's schedule the step reads each term itself, just in time (``params`` returned in their place)."""
        if not self.measures:
            return params
        # every value read before the first copy is written (one read of each weight)
        values = self.hyper_map(F.partial(read_after, anchor), params)
        terms = decay_terms(self.hyper_map, self.decay, self.decay_flags, values)
        return F.depend(terms, self.hyper_map(ops.assign, self.before, values))

    def _staged(self, params, gradients, lr, context, terms):
        """Precondition every gradient, then the rules that read all of them (KL clip, unit-norm clip), decay
        and the momentum (or Nesterov) steps."""
        raw_gradients = gradients
        gradients = self.hyper_map(F.partial(precondition, context), self.forms, self.slots, gradients)
        if self.kl_clip is not None:
            gradients = apply_kl_clip(gradients, raw_gradients, lr, self.kl_clip)
        if self.apply_weight_decay:
            if not self.measures:  # read here (``read_weights``)
                terms = decay_terms(self.hyper_map, self.decay, self.decay_flags, params)
            gradients = self.hyper_map(apply_decay, self.decay_flags, terms, gradients)
        if self.enable_clip_grad:
            gradients = self.hyper_map(clip_to_unit_norm, gradients)
        if self.use_nesterov:
            return self.hyper_map(F.partial(nesterov_step, self.momentum, lr), gradients, params,
                                  self.moments)
        return self.hyper_map(F.partial(momentum_step, self.opt, self.momentum, lr), gradients, params,
                              self.moments)

    def construct(self, params, gradients, lr, context, step, terms):
        if self.sequential:
            update = (self.opt, self.momentum, lr, self.decay, not self.measures)
            success = self.hyper_map(F.partial(sequential_step, update, context), self.forms, self.slots,
                                     self.decay_flags, terms, gradients, params, self.moments)
        else:
            success = self._staged(params, gradients, lr, context, terms)
        if self.measures:
            success = F.depend(success, self._predict(terms, gradients, lr, context, success))
        return success

    def _predict(self, terms, gradients, lr, context, success):
        """q of the update just made (module docstring), stored in the damping rule's ``predicted``."""
        moments = F.depend(self.moments, success)
        lr32 = -ops.reshape(ops.cast(lr, mstype.float32), ())
        deltas = self.hyper_map(F.partial(scale, lr32), moments)
        products = self.hyper_map(F.partial(curvature_product, context), self.curved, self.forms,
                                  self.slots, gradients, deltas)
        model = qm.build_model(self.model_plan, (deltas,), gradients, terms, (products,))
        return ops.assign(self.damping_rule.predicted, qm.change(model))

    def probe_due(self, global_step):
        """Every step of ``damping="adaptive"`` needs the loss after it on its batch."""
        return True

    def finish(self, loss_before, loss_after, global_step):
        """A step that raised the loss on its batch is taken back; the damping's update, with the reduction
        ratio of an adaptation step (module docstring)."""
        values = ops.stack([ops.reshape(ops.cast(loss_before, mstype.float32), ()),
                            ops.reshape(ops.cast(loss_after, mstype.float32), ()),
                            self.damping_rule.predicted * 1.0])
        values = self.mean_over_ranks(values)
        change = values[1] - values[0]
        noise = unresolved(change, values[2], values[0], values[1])
        overshot = ops.logical_not(ops.logical_or(noise, values[2] < 0))
        rejected = ops.logical_or(raised_loss(values[0], values[1]), overshot)
        if rejected:
            rejected = F.depend(rejected, self.hyper_map(restore, self.weights, self.before, self.moments))
        ratio = change / values[2]
        ratio = ops.select(ops.isfinite(ratio), ratio, self.failed)
        adaptation = self.damping_rule.due_after(global_step)
        return self.damping_rule.adapt(ratio, change, values[2], noise, rejected, adaptation)
