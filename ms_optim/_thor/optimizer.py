r"""THOR's optimizer Cell, ``ThorOptimizer``: its state and its step (built by ``factory.thor``).

One class for every device (CPU, GPU, Ascend); the device changes no code path. Built from
``mindspore.ops`` only; a ``mindspore.nn.Optimizer`` subclass over ``net.trainable_params()``, so
``Model``, ``TrainOneStepCell``, loss-scale cells and checkpoints work as with MindSpore's optimizers.

Algorithm (one call of the optimizer is one step ``t``, its ``global_step``; ``f = frequency``;
``lr`` and ``damping`` are 1-D Tensors indexed by ``t`` (a 0-D Tensor is the same value every step)):

.. code-block:: text

    g      <- grad / loss_scale                              for every trainable parameter
    lam    <- sqrt(damping[t])
    if t % f == 0:                                            # a "THOR step": self.inversion(...)
        for every THOR layer l (in cells_and_names() order):
            A_l <- layer.matrix_a_cov                         # collected by the layer this step
            G_l <- layer.matrix_g_cov / factor_loss_scale**2  # the scale of THIS step's backward
        (A, G) <- mean over data-parallel ranks ("kfc"; "gpu"/"ascend" average the inverses of the local
                  factors instead, as MindSpore does)
        Ainv_l <- blockdiag_k (A_l,k + lam I)^-1              # 128-wide diagonal blocks (last smaller),
        Ginv_l <- blockdiag_k (G_l,k + lam I)^-1              # or the whole matrix (inverse="full")
        (gpu/ascend: MindSpore's special inverses, e.g. Ascend's max-abs scale: ms_optim._thor.device_rules)
        (embedding: Ainv_l <- 1 / (a_l + lam), a_l the diagonal of A)
        (with trace_thresholds: only the layers the trace rule of ms_optim._thor.trace selects)
        How is the strategy's, chosen when the optimizer is built (ms_optim._thor.inversion): every layer at
        once (one fused op per factor on CPU, batched per block width elsewhere), layer by layer, shared
        across ranks (distribute_inverses) or averaged across ranks (gpu/ascend); the same numbers.
    (other steps reuse the stored Ainv, Ginv: no factor work at all)
    Dense/Conv2d weight:   g <- Ginv g Ainv                   (conv weight as out x (in*kh*kw))
    Embedding table:       g <- diag(Ainv) g Ginv
    nn.LayerNorm gamma/beta: g <- g / (g^2 / batch_size + lam)
    everything else (biases, BatchNorm, ...): g unchanged
    if kl_clip is not None: g <- nu * g for every parameter    # KL clipping, ms_optim._thor.kl_clip
    if weight_decay > 0:   g <- g + weight_decay * w           where decay_filter(w)
    if enable_clip_grad:   g <- g / max(||g||_2, 1)            per tensor
    accum <- momentum * accum + g
    w     <- w - lr[t] * accum
             (Nesterov: w <- w - lr[t] * (g + momentum * accum))
    t     <- t + 1;  every layer's thor_flag <- (t % f == 0)   # the layers collect A, G on the next step

The ``thor_flag`` write is the schedule contract between this optimizer and the layers; it is
explained once, in ``ms_optim._thor`` ("The schedule").

Loss scaling and G. A layer stores G from the gradient as it reaches the layer, i.e. multiplied by
the loss scale s of that backward pass, so G carries s**2. The optimizer divides it by the square of
``factor_loss_scale``, a non-trainable float32 Parameter (shape ()) holding the scale used in the
current backward pass; it starts at ``loss_scale`` (right for no scaling and for
``FixedLossScaleManager(drop_overflow_update=False)``, where ``TrainOneStepCell`` gets
``sens = loss_scale``). A loss-scale cell whose scale changes (``DynamicLossScaleManager``) must
feed the scale the gradients of this step were multiplied by, before the optimizer runs and before
the manager updates it: inside its ``construct``, ``optimizer.feed_loss_scale(scale)`` (an
``ops.assign``; ``ModelThor``'s loss-scale cell does it). MindSpore's own
``TrainOneStepWithLossScaleCell`` does not: with it the optimizer keeps ``loss_scale``, right only
while the live scale equals it (that cell does not run on CPU in MindSpore 2.10 anyway).

An inverse is accepted only if finite and accurate (see ``ms_optim._thor.preconditioner``); a
rejected factor keeps the layer's previous inverse (the identity before the first accepted one),
so a singular or non-finite factor never puts NaN into the parameters.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, jit, nn, ops
from mindspore.nn.optim.optimizer import Optimizer
from mindspore.ops import functional as F
from mindspore.ops import operations as P

from ms_optim._thor import preconditioner as pc
from ms_optim._thor.config import ThorConfig
from ms_optim._thor.damping import build_damping_rule
from ms_optim._thor.device_rules import inverse_rules
from ms_optim._thor.factor_kernels import factor_kernels
from ms_optim._thor.inversion import build_inversion, choose_strategy
from ms_optim._thor.kl_clip import apply_kl_clip
from ms_optim._thor.layers import ThorLayer
from ms_optim._thor.modes import Strategy, Treatment
from ms_optim._thor.slot import LayerSlot
from ms_optim._thor.update import (
    apply_decay,
    clip_to_unit_norm,
    momentum_step,
    nesterov_step,
    sequential_step,
    write_flag,
)
from ms_optim.optim._base import check_schedule_length

__all__ = ["ThorOptimizer", "LayerSlot"]

_NAME = "thor"

# ----------------------------------------------------------------------------------- the optimizer
class ThorOptimizer(Optimizer):
    r"""THOR's optimizer Cell (built by ``ms_optim._thor.factory.thor``; the update rule is in the module
    docstring).

    Public attributes (stable; ``ModelThor`` and the benchmarks rely on them):

    * ``frequency`` (int) and ``get_frequency()``; ``global_step`` (int32 Parameter, shape (1,)): the
      step t; t is a THOR step iff ``t % frequency == 0``;
    * ``thor_cells`` (tuple of ``ThorLayer``), in ``net.cells_and_names()`` order; ``num_layers``;
      ``slots`` (``nn.CellList`` of :class:`LayerSlot`, one per layer: its constants and inverses);
    * ``matrix_a_inv`` / ``matrix_g_inv`` (ParameterTuples, names ``matrix_a_inv_blocks_<i>`` /
      ``matrix_g_inv_blocks_<i>``): the stored inverses, ``(nblocks, bs, bs)`` (embedding A:
      ``(vocab,)``); ``a_layouts`` / ``g_layouts``: their ``BlockLayout``\ s. (MindSpore calls its
      inverses ``matrix_a_inv_<i>`` with other, device-specific shapes -- 4-D on GPU, float16
      fractal blocks on Ascend; distinct names let a MindSpore THOR checkpoint load here without a
      shape clash: its inverses are skipped and recomputed on the next THOR step.)
    * ``factor_loss_scale`` (float32 Parameter, shape ()): the loss scale of the current backward
      pass, G is divided by its square; ``feed_loss_scale(scale)`` writes it (see the module
      docstring, "Loss scaling and G");
    * ``moments`` (``moments.<param name>``), ``momentum`` (Parameter), ``learning_rate`` (as
      ``nn.Optimizer``), ``damping`` (float32 Tensor), ``loss_scale``, ``batch_size``,
      ``weight_decay`` (float), ``decay_flags``, ``use_nesterov``, ``enable_clip_grad``,
      ``inverse`` (``"blocked"``/``"full"``), ``block_size``, ``split_indices``, ``kl_clip`` (float or None),
      ``factor_convention`` (``"gpu"``/``"ascend"``/``"kfc"``, applied by the layers: ``_thor.conventions``);
      ``config`` (the :class:`~ms_optim._thor.config.ThorConfig` it was built from).
    * ``inversion``: the inversion strategy Cell (``ms_optim._thor.inversion``), chosen when the optimizer is
      built; ``strategy`` its name (a :class:`~ms_optim._thor.modes.Strategy`); ``sharing`` and ``trace``
      are its ``InverseSharing`` (which layers this rank inverts) and its
      :class:`~ms_optim._thor.trace.TraceSchedule` (None: fixed schedule; its ``inversions`` count the
      inversions per layer).
    """

    def __init__(self, net: nn.Cell, layers: Sequence[ThorLayer], config: ThorConfig):
        # learning_rate="adaptive" (a subclass, ms_optim._thor.adaptive_lr): no schedule; nn.Optimizer's is 0
        learning_rate = Tensor(0.0, mstype.float32) if config.adaptive_lr else config.learning_rate
        super().__init__(learning_rate, net.trainable_params(), 0.0, config.loss_scale)
        self.config = config
        self.frequency = config.frequency
        self.batch_size = config.batch_size
        self.use_nesterov = config.use_nesterov
        self.enable_clip_grad = config.enable_clip_grad
        self.inverse = config.inverse
        self.block_size = config.block_size
        self.split_indices = None if config.split_indices is None else list(config.split_indices)
        self.kl_clip = config.kl_clip
        self.factor_convention = config.factor_convention
        self.kl_clip_tensor = Tensor(config.kl_clip if config.kl_clip is not None else 0.0, mstype.float32)
        self.momentum = Parameter(Tensor(config.momentum, mstype.float32), name="momentum")
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.opt = P.ApplyMomentum()

        # weight decay: our own flags (nn.Optimizer's default filter would skip 'beta'/'gamma')
        self.weight_decay = config.weight_decay
        self.apply_weight_decay = self.weight_decay > 0
        self.decay_flags = tuple(bool(config.decay_filter(p)) for p in self._parameters)
        self.weight_decay_tensor = Tensor(self.weight_decay, mstype.float32)
        self.exec_weight_decay = False  # nn.Optimizer's own decay path stays off
        # learning rate schedule's length (None: a 0-D Tensor, no end); the damping's is its rule's
        self.lr_steps = int(learning_rate.shape[0]) if learning_rate.ndim == 1 else None

        self.thor_cells = tuple(layers)
        self.num_layers = len(self.thor_cells)
        kernels = factor_kernels()
        rules = inverse_rules(self.thor_cells, config.factor_convention)  # MindSpore's rules for gpu/ascend
        self.strategy = choose_strategy(config, rules)
        self._map_parameters(net, rules, kernels)
        self.matrix_a_inv = ParameterTuple([slot.a_inv for slot in self.slots])
        self.matrix_g_inv = ParameterTuple([slot.g_inv for slot in self.slots])
        self.matrix_a_cov = ParameterTuple([layer.matrix_a_cov for layer in self.thor_cells])
        self.matrix_g_cov = ParameterTuple([layer.matrix_g_cov for layer in self.thor_cells])
        self.thor_flags = ParameterTuple([layer.thor_flag for layer in self.thor_cells])
        self.inversion = build_inversion(self.strategy, self.slots, self.thor_cells, config, kernels)
        self._build_damping_rule()
        self.factor_loss_scale = Parameter(Tensor(config.loss_scale, mstype.float32),
                                           name="factor_loss_scale", requires_grad=False)
        self.frequency_tensor = Tensor([self.frequency], mstype.int32)
        self.zero_step = Tensor([0], mstype.int32)
        self.one_step = Tensor([1], mstype.int32)
        self.lr_steps_tensor = Tensor(self.lr_steps or 0, mstype.int32)
        self.sync_thor_flags()

    @property
    def sharing(self):
        """The strategy's ``InverseSharing``: which layers this rank inverts, and the inversion counter."""
        return self.inversion.sharing

    @property
    def trace(self):
        """The strategy's trace rule (``TraceSchedule``), or None on the fixed schedule."""
        return self.inversion.trace

    @property
    def a_layouts(self) -> Tuple[Optional[pc.BlockLayout], ...]:
        """The ``BlockLayout`` of every layer's A (None for an embedding's diagonal A)."""
        return tuple(slot.a_layout for slot in self.slots)

    @property
    def g_layouts(self) -> Tuple[pc.BlockLayout, ...]:
        """The ``BlockLayout`` of every layer's G."""
        return tuple(slot.g_layout for slot in self.slots)

    def _map_parameters(self, net: nn.Cell, rules, kernels) -> None:
        """Per trainable parameter: its treatment and layer; one complete ``LayerSlot`` per THOR layer
        (``self.slots``), with the layer-by-layer inversion's constants where the strategy inverts so."""
        role = {}
        for i, layer in enumerate(self.thor_cells):
            role[id(layer.weight_param())] = (layer.spec.treatment, i)
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.LayerNorm):
                for param in (cell.gamma, cell.beta):
                    role.setdefault(id(param), (Treatment.LAYERNORM, -1))
        kinds, owners = [], []
        grad_index = [0] * self.num_layers
        for j, param in enumerate(self._parameters):
            kind, owner = role.get(id(param), (Treatment.PLAIN, -1))
            if owner >= 0:
                grad_index[owner] = j
            kinds.append(kind)
            owners.append(owner)
        layerwise = self.strategy != Strategy.BATCHED
        inverse_out = None if kernels is None else kernels.block_inverse_out
        self.slots = nn.CellList([LayerSlot(i, layer, grad_index[i], self.config.factor_block_size, rules[i],
                                            inverse_out, layerwise)
                                  for i, layer in enumerate(self.thor_cells)],
                                 auto_prefix=False)
        none = (0, 0, 0)
        self.param_treatment = tuple((kind, self.slots[owner].g_geom if owner >= 0 else none,
                                      self.slots[owner].a_geom if owner >= 0 else none)
                                     for kind, owner in zip(kinds, owners))
        no_inverse = Tensor(np.zeros((1,), np.float32))  # for the parameters of no THOR layer (never read)
        self.param_g_inv = tuple(self.slots[owner].g_inv if owner >= 0 else no_inverse for owner in owners)
        self.param_a_inv = tuple(self.slots[owner].a_inv if owner >= 0 else no_inverse for owner in owners)
        self._param_owners = tuple(owners)
        self.batch_size_float = float(self.batch_size)
        self.precondition_kernel = () if kernels is None else (kernels.precondition,)
        # one parameter after the other (precondition, decay, momentum) unless a rule needs all gradients
        # at once
        self.sequential_update = self.config.sequential_update

    def _build_damping_rule(self) -> None:
        """``damping_rule`` (``ms_optim._thor.damping``): the schedule, or the adaptive rule with each
        parameter's layer's stored factors for its quadratic model; ``damping`` is the schedule Tensor or the
        adaptive rule's Parameter."""
        self.damping_rule = build_damping_rule(self.config, self.thor_cells, self.param_treatment,
                                               self.batch_size_float)
        if self.config.adaptive_damping:
            none = Tensor(np.zeros((1,), np.float32))  # for the parameters of no THOR layer (never read)
            owners = self._param_owners
            self.damping_rule.set_param_factors(
                tuple(self.thor_cells[i].matrix_a_cov if i >= 0 else none for i in owners),
                tuple(self.thor_cells[i].matrix_g_cov if i >= 0 else none for i in owners))
            self.damping = self.damping_rule.value
            self.damping_steps = None
        else:
            self.damping = self.damping_rule.damping
            self.damping_steps = self.damping_rule.steps
        self.damping_steps_tensor = Tensor(self.damping_steps or 0, mstype.int32)

    # ------------------------------------------------------------------ public helpers
    def get_frequency(self) -> int:
        """The THOR frequency f: A, G and their inverses are recomputed on steps 0, f, 2f, ..."""
        return self.frequency

    def sync_thor_flags(self) -> None:
        """Set every layer's ``thor_flag`` to ``global_step % frequency == 0`` (host side). Called when the
        optimizer is built; call it after loading a checkpoint that holds the optimizer's ``global_step``
        but not the net's flags (a checkpoint of the whole training cell holds both and needs nothing).
        """
        step = int(self.global_step.asnumpy().reshape(-1)[0])
        value = Tensor(np.array(step % self.frequency == 0))
        for flag in self.thor_flags:
            ops.assign(flag, value)  # in place: a compiled graph ignores set_data on Parameters it writes

    def feed_loss_scale(self, scale):
        """Write the loss scale this step's gradients (and so the layers' G) were multiplied by.

        Call it from a loss-scale training cell's ``construct``, with the scale read BEFORE the
        loss-scale manager updates it, and order it before the optimizer call (e.g.
        ``grads = ops.depend(grads, optimizer.feed_loss_scale(scale))``). ``scale``: a Tensor of
        shape () or (1,). Returns the result of the ``ops.assign``.
        """
        value = ops.cast(ops.reshape(scale, ()), mstype.float32)
        return ops.assign(self.factor_loss_scale, value)

    # ------------------------------------------------------------------ the step
    def _check_schedules(self, step):
        """The shared end-of-schedule check (``check_schedule_length``) for each 1-D Tensor."""
        if self.lr_steps is not None:
            step = check_schedule_length(_NAME, "learning_rate", self.lr_steps, self.lr_steps_tensor, step)
        if self.damping_steps is not None:
            step = check_schedule_length(_NAME, "damping", self.damping_steps, self.damping_steps_tensor,
                                         step)
        return step

    def _precondition(self, gradients, lam):
        """Apply the stored inverses (Dense/Conv/Embedding) and the LayerNorm rule; others unchanged.

        One ``hyper_map`` (``pc.precondition_parameter``), not a loop growing a tuple (GRAPH_MODE compiles
        that several times slower)."""
        precondition = F.partial(pc.precondition_parameter, self.precondition_kernel, lam,
                                 self.batch_size_float)
        return self.hyper_map(precondition, self.param_treatment, gradients, self.param_g_inv,
                              self.param_a_inv)

    def _staged_update(self, params, gradients, lam, lr):
        """Precondition every gradient, then the rules that read all of them (KL clip, unit-norm clip), decay
        and the momentum (or Nesterov) steps, at learning rate ``lr``."""
        raw_gradients = gradients
        gradients = self._precondition(gradients, lam)
        if self.kl_clip is not None:
            gradients = apply_kl_clip(gradients, raw_gradients, lr, self.kl_clip_tensor)
        if self.apply_weight_decay:
            gradients = self.hyper_map(F.partial(apply_decay, self.weight_decay_tensor), self.decay_flags,
                                       params, gradients)
        if self.enable_clip_grad:
            gradients = self.hyper_map(clip_to_unit_norm, gradients)
        if self.use_nesterov:
            return self.hyper_map(F.partial(nesterov_step, self.momentum, lr), gradients, params,
                                  self.moments)
        return self.hyper_map(F.partial(momentum_step, self.opt, self.momentum, lr), gradients, params,
                              self.moments)

    def _update(self, params, gradients, lam, damping, step, thor_step):
        """The update after the inversion branch: THOR's (the learning-rate schedule and the momentum), then
        the damping rule's ``after_update``. ``learning_rate="adaptive"`` overrides it
        (``ms_optim._thor.adaptive_lr.AdaptiveLrThorOptimizer``)."""
        lr = self.get_lr()  # read once: the update and the damping rule use the same value
        if self.sequential_update:  # the same rules, one parameter at a time (ms_optim._thor.update)
            update = (self.opt, self.momentum, lr,
                      self.weight_decay_tensor if self.apply_weight_decay else None)
            success = self.hyper_map(F.partial(sequential_step, update, (self.precondition_kernel, lam,
                                                                         self.batch_size_float)),
                                     self.param_treatment, self.decay_flags, gradients, params, self.moments,
                                     self.param_g_inv, self.param_a_inv)
        else:
            success = self._staged_update(params, gradients, lam, lr)
        return self.damping_rule.after_update(success, step, gradients, lr, self.moments)

    @jit(backend="ms_backend")
    def construct(self, gradients):
        params = self._parameters
        gradients = self.scale_grad(gradients)
        step = self._check_schedules(self.global_step)
        next_flag = ops.reshape(ops.equal(ops.floor_mod(step + self.one_step, self.frequency_tensor),
                                          self.zero_step), ())
        refreshed = self.zero_step
        anchor = self.inversion.anchor(gradients)  # what the THOR branch reads the factors after
        damping = self.damping_rule(step, anchor, self.factor_loss_scale)  # ms_optim._thor.damping
        lam = ops.sqrt(damping)
        thor_step = ops.all(ops.equal(ops.floor_mod(step, self.frequency_tensor), self.zero_step))
        if self.damping_rule.refresh(thor_step, damping):  # a THOR step (or, adaptive: a new damping)
            refreshed = self.inversion(anchor, lam, self.damping_rule.inversion_scale(thor_step,
                                                                                      self.factor_loss_scale,
                                                                                      damping))
        # The updates follow the THOR branch through its side effects (the stores of the inverses): every read
        # of a parameter after it is ordered after it. Its token is still read once, on one scalar (a depend
        # on the gradient tuple is one Depend per gradient): a branch whose result nothing reads makes
        # MindSpore compile the rest of the step into both branches (ResNet-50: the update twice, 1775 and
        # 1445 nodes).
        lam = F.depend(lam, refreshed)
        success = self._update(params, gradients, lam, damping, step, thor_step)
        success = F.depend(success, self.assignadd(self.global_step, self.global_step_increase_tensor))
        return F.depend(success, self.hyper_map(F.partial(write_flag, next_flag), self.thor_flags))
