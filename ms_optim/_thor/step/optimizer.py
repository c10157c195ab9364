r"""THOR's optimizer Cell, ``ThorOptimizer``: its state and its step (built by ``factory.thor``).

One class for every device (CPU, GPU, Ascend) and every mode; the device changes no code path, and the modes
choose the parts once, when the optimizer is built: the inversion strategy (``inversion/strategy.py``), the
damping rule (``damping.py``: the schedule or Levenberg-Marquardt) and the step rule (``momentum_rule.py``:
the learning-rate schedule; ``quadratic_rule.py``: ``learning_rate="adaptive"``). Built from ``mindspore.ops``
only; a ``mindspore.nn.Optimizer`` subclass over ``net.trainable_params()``, so ``Model``,
``TrainOneStepCell``, loss-scale cells and checkpoints work as with MindSpore's optimizers.

One call of the optimizer is one step ``t`` (its ``global_step``; ``f = frequency``):

.. code-block:: text

    g    <- grad / loss_scale                                    for every trainable parameter
    d    <- the damping rule's damping of step t;   lam <- sqrt(d)
    the step rule reads what it needs of the weights' values (the decay terms wd * w: ``update.py``)
    if the damping rule refreshes (t % f == 0, "a THOR step"; with damping="adaptive" also when d changed):
        the inversion strategy stores every layer's damped inverses (A + lam I)^-1, (G + lam I)^-1 from the
        factors the layers collected on the last THOR step (G divided by the square of its loss scale)
    the step rule's update, each parameter's curvature applied by its spec (``net/curvature.py``)
    t    <- t + 1;   every layer's thor_flag <- (t % f == 0)      (the layers collect A, G on the next step)

The ``thor_flag`` write is the schedule contract between this optimizer and the layers (``ms_optim._thor``,
"The schedule").

Loss scaling and G. A layer stores G from the gradient as it reaches the layer, i.e. multiplied by the loss
scale s of that backward pass, so G carries s**2. The optimizer divides it by the square of
``factor_loss_scale``, a float32 Parameter (shape ()) holding the scale of the current backward pass; it
starts at ``loss_scale`` (right for no scaling and for ``FixedLossScaleManager(drop_overflow_update=False)``).
A loss-scale cell whose scale changes must feed the scale this step's gradients carry before the optimizer
runs: ``optimizer.feed_loss_scale(scale)`` (ms_optim's ``TrainOneStepWithLossScaleCell`` does). With an
adaptive learning rate or damping the stored G is also read on other steps; ``curvature_loss_scale``
(``thor_curvature_loss_scale``) keeps the scale of the THOR step that stored it.

With ``learning_rate`` or ``damping`` ``"adaptive"`` (``measures_loss``) a step needs the loss on its own
batch after it: the training cell runs the network once more on the steps ``probe_due`` names and hands both
losses to :meth:`ThorOptimizer.finish_step`. ms_optim's ``TrainOneStepCell``,
``TrainOneStepWithLossScaleCell`` and ``ModelThor`` do; stepped by any other cell, such an optimizer refuses
to compile its step (RuntimeError).

An inverse is accepted only if finite and accurate (``inversion/preconditioner.py``); a rejected factor keeps
the layer's previous inverse (the identity before the first accepted one), so a singular or non-finite factor
never puts NaN into the parameters.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, jit, nn, ops
from mindspore.nn.optim.optimizer import Optimizer
from mindspore.ops import functional as F

from ms_optim._thor.config import ThorConfig
from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.inversion.device_rules import inverse_rules
from ms_optim._thor.inversion.slot import LayerSlot
from ms_optim._thor.inversion.strategy import build_inversion, choose_strategy
from ms_optim._thor.modes import Mode, Strategy
from ms_optim._thor.net.factor_kernels import factor_kernels
from ms_optim._thor.net.kinds import parameter_specs
from ms_optim._thor.net.layers import ThorLayer
from ms_optim._thor.step.damping import build_damping_rule, scalar_parameter
from ms_optim._thor.step.momentum_rule import MomentumRule
from ms_optim._thor.step.quadratic_rule import QuadraticRule
from ms_optim._thor.step.table import parameter_table, weight_positions
from ms_optim._thor.step.update import write_flag
from ms_optim.optim._base import check_schedule_length

__all__ = ["ThorOptimizer", "LayerSlot", "unprobed_message"]

_NAME = "thor"


def unprobed_message(config: ThorConfig) -> str:
    """The RuntimeError of an adaptive THOR stepped by a training cell that never runs its extra forward
    pass."""
    if config.lr_mode == Mode.ADAPTIVE:
        argument, what = "learning_rate='adaptive'", "the loss at a trial point of each step"
    else:
        argument, what = "damping='adaptive'", "the loss after each step"
    return (f"For 'thor', {argument} needs {what} on the same batch, which the training cell computes: step "
            f"it with ms_optim.nn.TrainOneStepCell or ms_optim.nn.TrainOneStepWithLossScaleCell (MindSpore's "
            f"arguments), a ModelThor (ms_optim.train_thor.ConvertModelUtils.convert_to_thor_model) or "
            f"MindSpore's Model under ms_optim.use(); MindSpore's own TrainOneStepCell, and its Model "
            f"without use(), never run that forward pass.")


class ThorOptimizer(Optimizer):
    r"""THOR's optimizer Cell (built by ``ms_optim._thor.factory.thor``; the step is in the module docstring).

    Public attributes (stable; ``ModelThor``, the training cells and the benchmarks rely on them):

    * ``frequency`` (int) and ``get_frequency()``; ``global_step`` (int32 Parameter, shape (1,)): the step t;
      t is a THOR step iff ``t % frequency == 0``;
    * ``thor_cells`` (tuple of ``ThorLayer``), in ``net.cells_and_names()`` order; ``num_layers``; ``slots``
      (``nn.CellList`` of ``LayerSlot``, one per layer: its constants and inverses); ``table`` (the
      parameters' ``ParameterTable``: specs, slots, flags);
    * ``matrix_a_inv`` / ``matrix_g_inv`` (ParameterTuples, names ``matrix_a_inv_blocks_<i>`` /
      ``matrix_g_inv_blocks_<i>``): the stored inverses, ``(nblocks, bs, bs)`` (a diagonal A: ``(a_dim,)``);
      ``a_layouts`` / ``g_layouts``: their ``BlockLayout``\ s. (MindSpore calls its inverses
      ``matrix_a_inv_<i>`` with device-specific shapes; distinct names let a MindSpore THOR checkpoint load
      here without a shape clash: its inverses are skipped and recomputed on the next THOR step.)
    * ``factor_loss_scale`` (float32 Parameter, shape ()) and ``feed_loss_scale(scale)`` (module docstring);
      with an adaptive mode ``curvature_loss_scale`` (``thor_curvature_loss_scale``);
    * ``moments`` (``moments.<param name>``: the momentum accumulations; with ``learning_rate="adaptive"`` the
      previous updates), ``momentum`` (Parameter), ``learning_rate`` (as ``nn.Optimizer``; 0 with
      ``learning_rate="adaptive"``), ``damping`` (the schedule Tensor, or the adaptive rule's Parameter),
      ``loss_scale``, ``batch_size``, ``weight_decay`` (float), ``decay_flags``, ``use_nesterov``,
      ``enable_clip_grad``, ``inverse``, ``block_size``, ``split_indices``, ``kl_clip`` (float or None),
      ``factor_convention``; ``config`` (the ``ThorConfig`` it was built from);
    * ``inversion`` (the strategy Cell) and ``strategy`` (its name); ``sharing`` and ``trace`` (its
      ``InverseSharing`` and trace rule, None on the fixed schedule); ``damping_rule`` and ``step_rule``;
    * ``measures_loss``, ``probe_due(global_step)`` and ``finish_step(loss_before, loss_after)``: the contract
      with the training cell (module docstring); ``probed``: set by a training cell that runs the extra pass.
    """

    def __init__(self, net: nn.Cell, layers: Sequence[ThorLayer], config: ThorConfig):
        super().__init__(config.learning_rate, net.trainable_params(), 0.0, config.loss_scale)
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
        self.momentum = Parameter(Tensor(config.momentum, mstype.float32), name="momentum")
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.weight_decay = config.weight_decay
        self.exec_weight_decay = False  # nn.Optimizer's own decay path stays off: the step rules decay
        self.lr_steps = (int(config.learning_rate.shape[0]) if config.lr_mode == Mode.SCHEDULED
                         and config.learning_rate.ndim == 1 else None)

        self.thor_cells = tuple(layers)
        self.num_layers = len(self.thor_cells)
        kernels = factor_kernels()
        rules = inverse_rules(self.thor_cells, config.factor_convention)  # MindSpore's rules for gpu/ascend
        self.strategy = choose_strategy(config, rules)
        cells = [cell for _, cell in net.cells_and_names()]
        roles = parameter_specs(self._parameters, self.thor_cells, cells)
        positions = weight_positions(roles, self.num_layers)
        inverse_out = None if kernels is None else kernels.block_inverse_out
        self.slots = nn.CellList([LayerSlot(i, layer, positions[i], config.factor_block_size, rules[i],
                                            inverse_out, self.strategy != Strategy.BATCHED)
                                  for i, layer in enumerate(self.thor_cells)], auto_prefix=False)
        self.table = parameter_table(self._parameters, roles, self.thor_cells, self.slots,
                                     config.decay_filter)
        self.decay_flags = self.table.decay_flags
        self.matrix_a_inv = ParameterTuple([slot.a_inv for slot in self.slots])
        self.matrix_g_inv = ParameterTuple([slot.g_inv for slot in self.slots])
        self.matrix_a_cov = ParameterTuple([layer.matrix_a_cov for layer in self.thor_cells])
        self.matrix_g_cov = ParameterTuple([layer.matrix_g_cov for layer in self.thor_cells])
        self.thor_flags = ParameterTuple([layer.thor_flag for layer in self.thor_cells])
        self.inversion = build_inversion(self.strategy, self.slots, self.thor_cells, config, kernels)
        self.factor_loss_scale = scalar_parameter(config.loss_scale, "factor_loss_scale")
        self.measures_loss = config.measures_loss
        self.probed = False  # set by a training cell that runs the extra forward pass (ms_optim.loss_scale)
        if self.measures_loss:  # the stored G is read on other steps than the THOR step that stored it
            self.curvature_loss_scale = scalar_parameter(config.loss_scale, "thor_curvature_loss_scale")
        self.damping_rule = build_damping_rule(config, self.thor_cells)
        self.damping = (self.damping_rule.value if config.damping_mode == Mode.ADAPTIVE
                        else self.damping_rule.damping)
        self.damping_steps = None if config.damping_mode == Mode.ADAPTIVE else self.damping_rule.steps
        if config.lr_mode == Mode.ADAPTIVE:
            self.step_rule = QuadraticRule(config, self.table, self._parameters, self.moments,
                                           self.damping_rule, kernels is not None and self._all_float32())
        else:
            self.step_rule = MomentumRule(config, self.table, self._parameters, self.moments, self.momentum,
                                          self.damping_rule,
                                          kernels is not None and self._all_float32())
        self.scheduled_lr = config.lr_mode == Mode.SCHEDULED
        self.adaptive_damping = config.damping_mode == Mode.ADAPTIVE
        self.curvature_kernels = () if kernels is None else (kernels.precondition, kernels.product)
        self.batch_size_tensor = Tensor(float(self.batch_size), mstype.float32)
        self.unit_scale = Tensor(1.0, mstype.float32)
        self.frequency_tensor = Tensor([self.frequency], mstype.int32)
        self.zero_step = Tensor([0], mstype.int32)
        self.one_step = Tensor([1], mstype.int32)
        self.lr_steps_tensor = Tensor(self.lr_steps or 0, mstype.int32)
        self.damping_steps_tensor = Tensor(self.damping_steps or 0, mstype.int32)
        self.unprobed = unprobed_message(config) if self.measures_loss else ""
        self.sync_thor_flags()

    def _all_float32(self) -> bool:
        """Whether every trainable parameter is float32 (the fused ops of ``learning_rate="adaptive"``)."""
        return all(param.dtype == mstype.float32 for param in self._parameters)

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
        """The ``BlockLayout`` of every layer's A (None for a diagonal A)."""
        return tuple(slot.a_layout for slot in self.slots)

    @property
    def g_layouts(self) -> Tuple[pc.BlockLayout, ...]:
        """The ``BlockLayout`` of every layer's G."""
        return tuple(slot.g_layout for slot in self.slots)

    # ------------------------------------------------------------------ public helpers
    def get_frequency(self) -> int:
        """The THOR frequency f: A, G and their inverses are recomputed on steps 0, f, 2f, ..."""
        return self.frequency

    def sync_thor_flags(self) -> None:
        """Set every layer's ``thor_flag`` to ``global_step % frequency == 0`` (host side). Called when the
        optimizer is built; call it after loading a checkpoint that holds the optimizer's ``global_step`` but
        not the net's flags (a checkpoint of the whole training cell holds both and needs nothing)."""
        step = int(self.global_step.asnumpy().reshape(-1)[0])
        value = Tensor(np.array(step % self.frequency == 0))
        for flag in self.thor_flags:
            ops.assign(flag, value)  # in place: a compiled graph ignores set_data on Parameters it writes

    def feed_loss_scale(self, scale):
        """Write the loss scale this step's gradients (and so the layers' G) were multiplied by.

        Call it from a loss-scale training cell's ``construct``, with the scale read BEFORE the loss-scale
        manager updates it, and order it before the optimizer call (e.g. ``grads = ops.depend(grads,
        optimizer.feed_loss_scale(scale))``). ``scale``: a Tensor of shape () or (1,). Returns the result of
        the ``ops.assign``.
        """
        value = ops.cast(ops.reshape(scale, ()), mstype.float32)
        return ops.assign(self.factor_loss_scale, value)

    def probe_due(self, global_step):
        """Whether the step just taken (``global_step``: its successor's index) needs the loss after it on its
        batch (always with an adaptive learning rate; after the adaptation steps of an adaptive damping)."""
        return self.step_rule.probe_due(global_step)

    def finish_step(self, loss_before, loss_after):
        """Finish the step just taken from its loss and the loss on the same batch after it (the training
        cell's extra forward pass, on the steps :meth:`probe_due` names): the step rule's measurement and,
        with ``damping="adaptive"``, the damping's update."""
        return self.step_rule.finish(loss_before, loss_after, self.global_step)

    # ------------------------------------------------------------------ the step
    def _check_schedules(self, step):
        """The shared end-of-schedule check (``check_schedule_length``) for each 1-D Tensor."""
        if self.lr_steps is not None:
            step = check_schedule_length(_NAME, "learning_rate", self.lr_steps, self.lr_steps_tensor, step)
        if self.damping_steps is not None:
            step = check_schedule_length(_NAME, "damping", self.damping_steps, self.damping_steps_tensor,
                                         step)
        return step

    def _curvature_scale(self, thor_step):
        """The loss scale the stored G carries: this step's on a THOR step (recorded), else the recorded
        one."""
        if not self.measures_loss:
            return self.factor_loss_scale
        scale = ops.select(thor_step, ops.reshape(self.factor_loss_scale, ()),
                           self.curvature_loss_scale * 1.0)
        return F.depend(scale, ops.assign(self.curvature_loss_scale, scale))

    @jit(backend="ms_backend")
    def construct(self, gradients):
        if self.measures_loss and not self.probed:
            raise RuntimeError(self.unprobed)
        params = self._parameters
        gradients = self.scale_grad(gradients)
        anchor = self.inversion.anchor(gradients)  # what the THOR branch reads the factors after
        # Every read of the weights' values comes first, before any write of the step and before its branch
        # (``update.py``): read after a write, or again in a branch graph that writes them, MindSpore would
        # copy every weight twice each step.
        terms = self.step_rule.read_weights(params, anchor)
        step = self._check_schedules(self.global_step)
        next_flag = ops.reshape(ops.equal(ops.floor_mod(step + self.one_step, self.frequency_tensor),
                                          self.zero_step), ())
        refreshed = self.zero_step
        damping = self.damping_rule(step, anchor, self.factor_loss_scale)
        lam = ops.sqrt(damping)
        thor_step = ops.all(ops.equal(ops.floor_mod(step, self.frequency_tensor), self.zero_step))
        curvature_scale = self._curvature_scale(thor_step)
        if self.damping_rule.refresh(thor_step, damping):  # a THOR step (or, adaptive: a new damping)
            if self.adaptive_damping:  # the first step's damping, from its factors (damping.py)
                damping = self.damping_rule.settled(damping, anchor, self.factor_loss_scale)
                lam = ops.sqrt(damping)
            refreshed = self.inversion(anchor, lam, self.damping_rule.inversion_scale(
                self.factor_loss_scale, curvature_scale, damping))
        # The updates follow the THOR branch through its side effects (the stores of the inverses): every read
        # of a parameter after it is ordered after it. Its token is still read once, on one scalar (a depend
        # on the gradient tuple is one Depend per gradient): a branch whose result nothing reads makes
        # MindSpore compile the rest of the step into both branches.
        lam = F.depend(lam, refreshed)
        g_unscale = self.unit_scale
        if self.measures_loss:
            g_unscale = ops.reciprocal(ops.square(curvature_scale))
        context = (self.curvature_kernels, lam, g_unscale, self.batch_size_tensor)
        if self.scheduled_lr:
            success = self.step_rule(params, gradients, self.get_lr(), context, step, terms)
        else:
            success = self.step_rule(params, gradients, damping, context, step, terms)
        success = F.depend(success, self.assignadd(self.global_step, self.global_step_increase_tensor))
        return F.depend(success, self.hyper_map(F.partial(write_flag, next_flag), self.thor_flags))
