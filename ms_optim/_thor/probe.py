r"""The extra forward pass of ``learning_rate="adaptive"`` and ``damping="adaptive"``, run by the training
cell.

``learning_rate="adaptive"`` (``ms_optim._thor.adaptive_lr``) needs the loss at its trial point on every
step's batch, and the Levenberg-Marquardt rule of ``damping="adaptive"`` (``ms_optim._thor.adaptive``) needs
``L1``, the loss after an adaptation step's update on that step's batch. The optimizer sees only gradients,
so the training cell computes them:

.. code-block:: text

    loss, grads <- network(*inputs) and its gradients, one forward pass    (LossAndGrads)
    optimizer(grads)
    learning_rate="adaptive":                                              (the optimizer made the trial)
        L_p <- network(*inputs);  optimizer.quadratic_step.finish(loss, L_p)
    else, if optimizer.global_step % adapt_every == 0:                     (the step was an adaptation step)
        L1 <- network(*inputs)                                             (training mode, no gradient)
        optimizer.damping_rule.adapt(loss, L1)

:func:`loss_probe_for` builds a :class:`LossProbe` for an optimizer whose damping rule needs one (None for
any other optimizer, which then runs exactly as before) and binds the rule, so that the optimizer's step
compiles. :class:`TrainOneStepCell` is MindSpore's ``nn.TrainOneStepCell`` with the probe after the
optimizer (same arguments and outputs); ``ms_optim.loss_scale.TrainOneStepWithLossScaleCell`` runs it in
the branch where the optimizer runs, and ``ModelThor`` builds one of the two. With MindSpore's own cells the
optimizer's step refuses to compile (RuntimeError): a plain ``nn.TrainOneStepCell(net, opt)`` becomes
``ms_optim.nn.TrainOneStepCell(net, opt)``.

With the probe, both cells take the step's loss and gradients from :class:`LossAndGrads`, so a step runs the
network's forward twice: once for the loss and the gradients, once for the probe. MindSpore's cells call
``loss = network(*inputs)`` and differentiate ``network`` separately; GRAPH_MODE reuses that first forward
inside the gradient's only while the network is called nowhere else in the step, so with the probe's call
such a step would run the forward three times. In GRAPH_MODE the probe's forward is also taken as the value
of ``ops.value_and_grad``, whose gradients nothing reads (so only its forward pass runs): a plain call of the
network next to the gradient's makes MindSpore 2.10 fail to compile some networks ("Illegal AnfNode for
evaluating", e.g. the zoo BERT's masked-LM gather at ``arange(batch) * seq`` offsets). Without the probe the
cells are MindSpore's, step for step.
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore.common.dtype as mstype
from mindspore import Tensor, context, nn, ops
from mindspore.ops import functional as F

__all__ = ["LossProbe", "LossAndGrads", "loss_probe_for", "needs_probe", "unbound_message",
           "TrainOneStepCell"]


def unbound_message(argument: str, what: str) -> str:
    """The RuntimeError of an adaptive THOR stepped by a training cell without the probe: ``argument`` (e.g.
    ``"damping='adaptive'"``) needs ``what`` (the loss it measures), which only these cells compute."""
    return (f"For 'thor', {argument} needs {what} on the same batch, which the training cell computes: step "
            f"it with ms_optim.nn.TrainOneStepCell or ms_optim.nn.TrainOneStepWithLossScaleCell (MindSpore's "
            f"arguments), a ModelThor (ms_optim.train_thor.ConvertModelUtils.convert_to_thor_model) or "
            f"MindSpore's Model under ms_optim.use(); MindSpore's own TrainOneStepCell, and its Model "
            f"without use(), never run that forward pass.")


class _ParsedMode(nn.Cell):
    """``in_graph``, read when the graph is parsed: a property of a base class, which MindSpore's parser
    evaluates in Python and puts in the graph as a constant (see ``ms_optim._thor.taps._ParsedChoices``)."""

    @property
    def in_graph(self) -> bool:
        """Whether the cell runs compiled (GRAPH_MODE)."""
        return context.get_context("mode") != context.PYNATIVE_MODE


class LossProbe(_ParsedMode):
    """The extra forward pass after the optimizer: the loss at ``learning_rate="adaptive"``'s trial point,
    every step, and its final step (``ms_optim._thor.adaptive_lr``); else, after an adaptation step of
    ``damping="adaptive"``, the loss on the same inputs and the damping rule's update.

    Args:
        network (Cell): the network with its loss (the training cell's ``network``).
        optimizer (Cell): the THOR optimizer (its ``quadratic_step`` or ``damping_rule``, and its
            ``global_step``).

    Inputs: ``(loss, *inputs)``, the step's loss (ordered after the optimizer) and inputs. Output: ``loss``,
    ordered after the step's finish or the damping update.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell):
        super().__init__(auto_prefix=False)  # the network's and optimizer's parameter names stay as they are
        self.network = network
        self.rule = optimizer.damping_rule
        self.global_step = optimizer.global_step
        self.quadratic_step = getattr(optimizer, "quadratic_step", None)
        self.trial = self.quadratic_step is not None
        self.weights = optimizer.parameters

    def probe_loss(self, *inputs):
        """The network's loss on ``inputs`` (a forward pass in training mode). In GRAPH_MODE it is the value
        of ``ops.value_and_grad``, whose gradients nothing reads, so only the forward pass runs: a plain call
        next to :class:`LossAndGrads`'s gradient fails to compile on some networks (module docstring)."""
        if self.in_graph:
            return ops.value_and_grad(self.network, None, self.weights)(*inputs)[0]
        return self.network(*inputs)

    def construct(self, loss, *inputs):
        if self.trial:  # the trial point is in place: the forward reads the weights after the optimizer
            first = F.depend(inputs[0], loss)
            after = self.probe_loss(first, *inputs[1:])
            return F.depend(loss, self.quadratic_step.finish(loss, after))
        if self.rule.due_after(ops.depend(self.global_step, loss)):
            after = self.probe_loss(*inputs)
            loss = F.depend(loss, self.rule.adapt(loss, after))
        return loss


class _ScaledLoss(nn.Cell):
    """``(loss * scale, loss)``: the output :class:`LossAndGrads` differentiates (the loss seeded with the
    training cell's scale, a Tensor) and the loss itself, from one forward pass of ``network``."""

    def __init__(self, network: nn.Cell):
        super().__init__(auto_prefix=False)  # the network's parameter names stay as they are
        self.network = network

    def construct(self, inputs, scale):
        loss = self.network(*inputs)
        return loss * ops.cast(scale, ops.dtype(loss)), loss


class LossAndGrads(nn.Cell):
    """The step's loss and the gradients of ``weights`` from ONE forward pass, for the training cells that
    run :class:`LossProbe`.

    MindSpore's cells call ``loss = network(*inputs)`` and then differentiate ``network`` again; in
    GRAPH_MODE MindSpore reuses the first call's forward inside the gradient's only while the network is
    called nowhere else in the step. The probe is another call, so that reuse stops and the step would run
    the forward three times. Here the loss is the gradient's own forward output (``ops.value_and_grad`` of
    ``(loss * scale, loss)`` with the loss as auxiliary output), so the step runs it twice: this one and the
    probe's. The gradients are those of the loss seeded with ``scale``, as MindSpore's cells compute them.

    Args:
        network (Cell): the network with its loss.
        weights (ParameterTuple): the parameters to differentiate (the training cell's ``weights``).

    Inputs: ``(scale, *inputs)``: the scale of the loss's gradient (a float32 Tensor: ``TrainOneStepCell``'s
    constant ``sens``, or the loss-scale cell's scale of this step) and the network's inputs.
    Outputs: ``(loss, grads)``.
    """

    def __init__(self, network: nn.Cell, weights):
        super().__init__(auto_prefix=False)
        self.scaled = _ScaledLoss(network)
        self.weights = weights

    def construct(self, scale, *inputs):
        (_, loss), grads = ops.value_and_grad(self.scaled, None, self.weights, has_aux=True)(inputs, scale)
        return loss, grads


def _needs(optimizer) -> Tuple[bool, bool]:
    """Whether ``optimizer``'s learning rate (``quadratic_step``) and its damping rule need the extra pass."""
    rule = getattr(optimizer, "damping_rule", None)
    return (getattr(optimizer, "quadratic_step", None) is not None,
            rule is not None and bool(getattr(rule, "needs_probe", False)))


def needs_probe(optimizer) -> bool:
    """Whether ``optimizer`` must be stepped by a training cell that runs :class:`LossProbe` (a THOR with
    ``learning_rate`` or ``damping`` "adaptive")."""
    return any(_needs(optimizer))


def loss_probe_for(network: nn.Cell, optimizer) -> Optional[LossProbe]:
    """A :class:`LossProbe` when ``optimizer`` needs the extra pass (``learning_rate="adaptive"``, or a
    damping rule that needs it; both are then bound), else None."""
    for_lr, for_rule = _needs(optimizer)
    if not (for_lr or for_rule):
        return None
    if for_rule:
        optimizer.damping_rule.bind()
    if for_lr:
        optimizer.quadratic_step.bind()
    return LossProbe(network, optimizer)


class TrainOneStepCell(nn.TrainOneStepCell):
    """``mindspore.nn.TrainOneStepCell`` that also runs the extra forward pass of ``thor(...,
    learning_rate="adaptive")`` and ``thor(..., damping="adaptive")`` (:class:`LossProbe`) after the
    optimizer; for every other optimizer it is MindSpore's cell, step for step.

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
        # with the probe: the loss from the gradient's own forward (see LossAndGrads)
        if self.loss_probe is not None:
            self.loss_and_grads = LossAndGrads(network, self.weights)
            self.sens_tensor = Tensor(float(self.sens), mstype.float32)  # the constant scale, as a Tensor

    def construct(self, *inputs):
        if self.loss_probe is None:
            return super().construct(*inputs)
        loss, grads = self.loss_and_grads(self.sens_tensor, *inputs)
        grads = self.grad_reducer(grads)
        if self.use_graceful_exit:
            grads = self.graceful_exit.exit_by_request(grads, self.init_param, self.exit_param)
        loss = ops.depend(loss, self.optimizer(grads))
        loss = self.loss_probe(loss, *inputs)
        if self.return_grad:
            grad_with_param_name = {}
            for index, value in enumerate(grads):
                grad_with_param_name[self.weights_name[index]] = value
            return loss, grad_with_param_name
        return loss
