"""The training cells: the portable loss-scaled training cell (``ms_optim.nn.TrainOneStepWithLossScaleCell``)
with the ``build_train_network`` that builds it on CPU (``ms_optim.amp.build_train_network``), and the plain
``TrainOneStepCell`` (``ms_optim.nn.TrainOneStepCell``) that also runs the extra forward pass adaptive THOR
needs.

MindSpore 2.10's own cell tests overflow with a status op that has no CPU kernel
(``NPUGetFloatStatusV2``), and its ``build_train_network`` refuses an overflow-skipping manager on CPU; the
classes here test overflow with ``ops.isfinite`` instead and otherwise keep MindSpore's constructor,
attributes and outputs, so that ``use()`` can install them as MindSpore's own. With a THOR optimizer whose
learning rate or damping is ``"adaptive"``, both cells run the network once more after the optimizer, on the
steps the optimizer names, and hand it the two losses (``ms_optim._extra_pass``: :class:`LossProbe`);
called in GRAPH_MODE they run the step as two graphs, the optimizer's and the extra pass's
(``_TwoGraphs``: no weight is copied), with the numbers of one.
"""
from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, context, nn, ops
from mindspore import dtype as mstype
from mindspore.amp import DynamicLossScaleManager
from mindspore.train import amp as _ms_amp

from ms_optim._extra_pass import LossAndGrads, LossProbe, _TwoGraphs, loss_probe_for, measures_loss
from ms_optim._loss_scale_checks import check_loss_scale_at_step, check_loss_scale_manager, check_scale_sense

__all__ = ["TrainOneStepCell", "TrainOneStepWithLossScaleCell", "LossAndGrads", "LossProbe", "loss_probe_for",
           "build_train_network"]

# MindSpore's function, taken when this module is first imported (before use() can replace it).
_MINDSPORE_BUILD_TRAIN_NETWORK = _ms_amp.build_train_network

_all_finite = ops.MultitypeFuncGraph("_all_finite")


@_all_finite.register("Tensor")
def _tensor_all_finite(grad):
    """True when every element of ``grad`` is finite."""
    return ops.isfinite(grad).all()


_unscale = ops.MultitypeFuncGraph("_unscale")


@_unscale.register("Tensor", "Tensor")
def _tensor_unscale(inverse_scale, grad):
    """grad / scale, in the gradient's dtype."""
    return grad * ops.cast(inverse_scale, ops.dtype(grad))


class TrainOneStepCell(_TwoGraphs, nn.TrainOneStepCell):
    """``mindspore.nn.TrainOneStepCell`` that also runs the extra forward pass a THOR optimizer with
    ``learning_rate`` or ``damping`` "adaptive" needs (:class:`LossProbe`); for every other optimizer it is
    MindSpore's cell, step for step.

    Args:
        network (Cell): the network with its loss.
        optimizer (Union[Cell]): the optimizer.
        sens (numbers.Number): the loss scale the backward pass is seeded with. Default: ``None`` (1.0).
        return_grad (bool): also return the gradients. Default: ``False``.

    Outputs: the loss (and the gradients with ``return_grad``), as MindSpore's cell.

    Examples:
        >>> import mindspore as ms
        >>> import ms_optim
        >>> from ms_optim import nn
        >>> net = nn.SequentialCell([nn.Dense(4, 3)])
        >>> opt = ms_optim.thor(net, ms.Tensor(0.1), "adaptive", 0.9)
        >>> step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    """

    def __init__(self, network, optimizer, sens=None, return_grad=False):
        super().__init__(network, optimizer, sens, return_grad)
        self.loss_probe = loss_probe_for(network, optimizer)
        if self.loss_probe is not None:  # the loss from the gradient's own forward (LossAndGrads)
            self.loss_and_grads = LossAndGrads(network, self.weights)
            self.sens_tensor = Tensor(float(self.sens), mstype.float32)
        self._set_parts(self.loss_probe is not None and not return_grad)

    def _step(self, *inputs):
        """The loss, the gradients and the update: ``(loss, grads)`` (the loss ordered after the update)."""
        loss, grads = self.loss_and_grads(self.sens_tensor, *inputs)
        grads = self.grad_reducer(grads)
        if self.use_graceful_exit:
            grads = self.graceful_exit.exit_by_request(grads, self.init_param, self.exit_param)
        return ops.depend(loss, self.optimizer(grads)), grads

    def _optimizer_part(self, *inputs):
        """The step up to the probe (``_TwoGraphs``): ``(loss,)``."""
        return (self._step(*inputs)[0],)

    def _probe_part(self, carried, *inputs):
        """The probe after :meth:`_optimizer_part`: the loss."""
        return self.loss_probe(carried[0], *inputs)

    _carried_count = 1

    def _carried_placeholder(self) -> tuple:
        """What :meth:`_optimizer_part` returns, for compiling :meth:`_probe_part` ahead (a float32 loss)."""
        return (Tensor(0.0, mstype.float32),)

    def construct(self, *inputs):
        if self.loss_probe is None:
            return super().construct(*inputs)
        if not self.return_grad:
            return self._probe_part(self._optimizer_part(*inputs), *inputs)
        loss, grads = self._step(*inputs)
        loss = self.loss_probe(loss, *inputs)
        grad_with_param_name = {}
        for index, value in enumerate(grads):
            grad_with_param_name[self.weights_name[index]] = value
        return loss, grad_with_param_name


class TrainOneStepWithLossScaleCell(_TwoGraphs, nn.TrainOneStepWithLossScaleCell):
    r"""``mindspore.nn.TrainOneStepWithLossScaleCell`` with a portable overflow test: runs on CPU too.

    One call is one training step with loss scale :math:`s` (the current value of ``scale_sense``):

    1. the loss and its gradients, the backward pass seeded with :math:`s`;
    2. the gradients divided by :math:`s`, then averaged over the data-parallel ranks;
    3. overflow :math:`= \lnot \bigwedge_j \mathrm{isfinite}(g_j)`, OR-ed over the ranks
       (:meth:`get_overflow_status`);
    4. the loss-scale manager's update cell updates :math:`s` from the overflow flag;
    5. only without overflow: the optimizer runs, so an overflowing step leaves every parameter and every
       optimizer state as it was.

    For a THOR optimizer (:func:`ms_optim.nn.thor`) the cell also tells the optimizer the scale of this
    step's backward pass (its factors carry it squared), and with ``learning_rate`` or ``damping``
    ``"adaptive"`` it runs the extra forward pass those need after the optimizer (see
    :ref:`thor-adaptive-damping`). A scale that cannot train is refused: when the cell is built (the
    constructor's ``scale_sense``) and before a step whose scale a dynamic manager drove to 0 or to a
    non-finite value.

    Under ``ms_optim.use()`` this class *is* ``mindspore.nn.TrainOneStepWithLossScaleCell``, so a
    script's own subclass inherits this constructor, MindSpore's attributes (``scale_sense``,
    ``loss_scaling_manager``, ``reducer_flag``, ``grad_reducer``, ``allreduce``, ``is_distributed``,
    ``degree``, ...), MindSpore's ``process_loss_scale`` and the portable :meth:`start_overflow_check` and
    :meth:`get_overflow_status`.

    Args:
        network (Cell): the network with its loss (e.g. ``nn.WithLossCell``).
        optimizer (Cell): the optimizer (any ``mindspore.nn.Optimizer``, ms_optim's included).
        scale_sense (Union[Tensor, Cell]): the loss scale as a floating-point Tensor of shape () or (1,),
            or the update cell of a loss-scale manager (``DynamicLossScaleManager(...).get_update_cell()``,
            ``FixedLossScaleManager(...).get_update_cell()``).

    Inputs:
        *inputs (Tensor): the inputs of ``network`` (data and label).

    Outputs:
        tuple[Tensor]: ``(loss, overflow, scale)``: the loss, whether this step overflowed (bool), and the
        loss scale after this step's update, as MindSpore's cell returns them.

    Besides MindSpore's attributes, ``loss_scale_step`` (an int32 Parameter) counts the steps run; the error
    that stops a run whose scale went bad names that step.

    Raises:
        TypeError: if ``scale_sense`` is neither a Tensor nor a Cell, a bool or integer Tensor, or a Cell that
            is not a loss-scale update cell: one with ``get_loss_scale()`` (returning a number) and
            ``construct(loss_scale, overflow)``, as MindSpore's ``DynamicLossScaleUpdateCell`` and
            ``FixedLossScaleUpdateCell``.
        ValueError: if the Tensor's shape is not () or (1,) (as MindSpore's cell); if the Tensor, or the
            update cell's ``get_loss_scale()``, is NaN, infinite or <= 0; if a
            ``DynamicLossScaleUpdateCell``'s ``scale_factor`` is; and during training, before a step whose
            loss scale has become NaN, infinite or <= 0 (the dynamic manager's updates, or a value assigned):
            that step does not run, and the message names the scale and the step.

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> opt = nn.Lamb(net.trainable_params(), learning_rate=0.01)
        >>> manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0**10, scale_factor=2, scale_window=50)
        >>> step = nn.TrainOneStepWithLossScaleCell(net, opt, scale_sense=manager.get_update_cell())
    """

    def __init__(self, network, optimizer, scale_sense):
        check_scale_sense(scale_sense)
        super().__init__(network, optimizer, scale_sense)
        # the number of steps run, for the message of check_loss_scale_at_step
        self.loss_scale_step = Parameter(Tensor(0, mstype.int32), name="loss_scale_step", requires_grad=False)
        # MindSpore sets it in data parallel only; subclasses read it (grads / degree)
        if not self.reducer_flag:
            self.degree = 1
        self.overflow_status = Tensor(np.zeros(8, np.int32))  # start_overflow_check's placeholder, made once
        self.feeds_loss_scale = callable(getattr(optimizer, "feed_loss_scale", None))
        # thor(..., learning_rate or damping="adaptive"): the extra forward pass
        self.loss_probe = loss_probe_for(network, optimizer)
        # with the probe: the loss from the gradient's own forward
        self.loss_and_grads = None if self.loss_probe is None else LossAndGrads(network, self.weights)
        self._set_parts(self.loss_probe is not None)

    def set_sense_scale(self, sens):
        """Set the loss scale to the Tensor ``sens``, as MindSpore's cell does.

        Raises:
            TypeError, ValueError: as the constructor for ``scale_sense``; the scale is then left as it was.
        """
        if isinstance(sens, Tensor):
            check_scale_sense(sens)
        super().set_sense_scale(sens)

    def _optimizer_part(self, *inputs):
        """The step up to the probe (``_TwoGraphs``): ``(loss, cond, scale_sense, overflow)``."""
        step = self.loss_scale_step + 1
        # a copy (the manager may update scale_sense below), checked before anything of this step runs
        used_scale = check_loss_scale_at_step(self.scale_sense * 1.0, step)
        ops.assign(self.loss_scale_step, step)
        if self.loss_probe is None:
            loss = self.network(*inputs)
            sens = ops.ones_like(loss) * ops.cast(used_scale, ops.dtype(loss))
            grads = self.grad(self.network, self.weights)(*inputs, sens)
        else:
            loss, grads = self.loss_and_grads(used_scale, *inputs)
        grads = self.hyper_map(ops.partial(_unscale, ops.reciprocal(used_scale)), grads)
        grads = self.grad_reducer(grads)
        if self.feeds_loss_scale:
            grads = ops.depend(grads, self.optimizer.feed_loss_scale(used_scale))
        cond = self.get_overflow_status(None, grads)
        overflow = self.process_loss_scale(cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, self.scale_sense, overflow  # the scale after the manager's update

    def _probe_part(self, carried, *inputs):
        """The probe after :meth:`_optimizer_part` (none after an overflow): ``(loss, cond, scale_sense)``, as
        MindSpore's cell returns them."""
        loss, cond, scale, overflow = carried
        if self.loss_probe is not None:
            if not overflow:
                loss = self.loss_probe(loss, *inputs)
        return loss, cond, scale

    _carried_count = 4

    def _carried_placeholder(self) -> tuple:
        """What :meth:`_optimizer_part` returns, for compiling :meth:`_probe_part` ahead."""
        return (Tensor(0.0, mstype.float32), Tensor(False), ops.zeros_like(self.scale_sense), Tensor(False))

    def construct(self, *inputs):
        return self._probe_part(self._optimizer_part(*inputs), *inputs)

    def start_overflow_check(self, pre_cond, compute_input):
        """Start an overflow check (MindSpore's hook for subclasses): returns ``(status, compute_input)``.

        There is no device status register to clear: ``status`` is a placeholder int32 vector of 8 zeros
        ordered after ``pre_cond``, to be passed to :meth:`get_overflow_status`; ``compute_input`` is
        returned unchanged.
        """
        status = ops.depend(self.overflow_status, pre_cond)
        return status, compute_input

    def get_overflow_status(self, status, compute_output):
        """True when any gradient has a non-finite element (on any data-parallel rank); ``status`` (from
        :meth:`start_overflow_check`) only orders the check."""
        compute_output = ops.depend(compute_output, status)
        flags = self.hyper_map(_all_finite, compute_output)
        finite = ops.stack(flags).all()
        overflow = ops.logical_not(finite)
        if self.is_distributed:
            count = self.allreduce(ops.cast(overflow, mstype.float32).reshape((1,)))
            overflow = (count > 0.0).reshape(())
        return overflow


# the construct each class runs as two graphs (a subclass that writes its own runs that one, as one graph)
TrainOneStepCell._two_graph_construct = TrainOneStepCell.construct  # pylint: disable=protected-access
TrainOneStepWithLossScaleCell._two_graph_construct = TrainOneStepWithLossScaleCell.construct  # pylint: disable=protected-access


def _skips_overflow(manager) -> bool:
    """The manager's update cell exists (it can skip an overflowing step): the case MindSpore
    refuses on CPU."""
    return manager is not None and manager.get_update_cell() is not None


def build_train_network(network, optimizer, loss_fn=None, level="O0", boost_level="O0", **kwargs):
    """``mindspore.amp.build_train_network`` that also builds a loss-scaled network on CPU.

    Same arguments, defaults and result as MindSpore's. On CPU, when the loss-scale manager (the
    ``loss_scale_manager`` keyword, else the level's default: ``DynamicLossScaleManager()`` for ``"O2"``)
    can skip overflowing steps, MindSpore raises ValueError; here MindSpore's function prepares the network
    and loss (mixed precision, loss cell) without a manager, and the result is
    :class:`ms_optim.nn.TrainOneStepWithLossScaleCell` with the manager's update cell. For a THOR
    optimizer with ``learning_rate`` or ``damping`` "adaptive", a plain training step is
    :class:`ms_optim.nn.TrainOneStepCell` (MindSpore's, plus the extra forward pass that optimizer
    needs). Everything else is MindSpore's.

    Raises:
        TypeError, ValueError: a ``loss_scale_manager`` whose loss scale (or a dynamic manager's
            ``scale_factor``) is not a number, or is NaN, infinite or <= 0 (on every device, before anything
            is built).
        ValueError: as MindSpore's; and on CPU, for a skipping manager together with ``boost_level``
            "O1"/"O2", pipeline stages or gradient accumulation (cells that have no portable loss-scale
            version here).
    """
    manager = kwargs["loss_scale_manager"] if "loss_scale_manager" in kwargs else (
        DynamicLossScaleManager() if level == "O2" else None)  # amp level O2's documented default
    check_loss_scale_manager(manager)
    on_cpu = context.get_context("device_target") == "CPU" and not context.get_context("enable_ge")
    if not (on_cpu and _skips_overflow(manager)):
        built = _MINDSPORE_BUILD_TRAIN_NETWORK(network, optimizer, loss_fn, level, boost_level, **kwargs)
        return _with_probe(built, optimizer)
    plain = _MINDSPORE_BUILD_TRAIN_NETWORK(network, optimizer, loss_fn, level, boost_level,
                                           **dict(kwargs, loss_scale_manager=None))
    if type(plain) is not nn.TrainOneStepCell:  # pylint: disable=unidiomatic-typecheck
        raise ValueError(f"For 'build_train_network', a loss_scale_manager that skips overflowing steps "
                         f"({type(manager).__name__}) is supported on CPU only for a plain training step, "
                         f"but this call builds {type(plain).__name__} (boost_level {boost_level!r}, "
                         f"pipeline stages or gradient accumulation).")
    return TrainOneStepWithLossScaleCell(plain.network, optimizer,
                                         scale_sense=manager.get_update_cell()).set_train()


def _with_probe(built, optimizer):
    """``built``, or for an adaptive THOR (``learning_rate`` or ``damping`` "adaptive") built as MindSpore's
    plain ``nn.TrainOneStepCell``: ms_optim's ``TrainOneStepCell`` on the same network and sens, which runs
    the extra forward pass that optimizer needs (MindSpore's cell would be refused when the step compiles)."""
    if type(built) is not nn.TrainOneStepCell or not measures_loss(optimizer):  # pylint: disable=unidiomatic-typecheck
        return built
    return TrainOneStepCell(built.network, optimizer, sens=built.sens).set_train()
