r"""The extra forward pass of ``damping="adaptive"``, run by the training cell after the optimizer.

The Levenberg-Marquardt rule (``ms_optim._thor.adaptive``) needs ``L1``, the loss after an adaptation step's
update on that step's batch. The optimizer sees only gradients, so the training cell computes it:

.. code-block:: text

    loss  <- network(*inputs);  grads <- ...;  optimizer(grads)             (the training cell's step)
    if optimizer.global_step % adapt_every == 0:                           (the step was an adaptation step)
        L1 <- network(*inputs)                                             (training mode, no gradient)
        optimizer.damping_rule.adapt(loss, L1)

:func:`loss_probe_for` builds a :class:`LossProbe` for an optimizer whose damping rule needs one (None for
any other optimizer, which then runs exactly as before) and binds the rule, so that the optimizer's step
compiles. :class:`TrainOneStepCell` is MindSpore's ``nn.TrainOneStepCell`` with the probe after the
optimizer (same arguments and outputs); ``ms_optim.loss_scale.TrainOneStepWithLossScaleCell`` runs it in
the branch where the optimizer runs, and ``ModelThor`` builds one of the two. With MindSpore's own cells the
optimizer's step refuses to compile (RuntimeError): a plain ``nn.TrainOneStepCell(net, opt)`` becomes
``ms_optim.nn.TrainOneStepCell(net, opt)``.
"""
from __future__ import annotations

from typing import Optional

from mindspore import nn, ops
from mindspore.ops import functional as F

__all__ = ["LossProbe", "loss_probe_for", "TrainOneStepCell"]


class LossProbe(nn.Cell):
    """After an adaptation step, the loss on the same inputs and the damping rule's update.

    Args:
        network (Cell): the network with its loss (the training cell's ``network``).
        optimizer (Cell): the THOR optimizer (its ``damping_rule`` and ``global_step``).

    Inputs: ``(loss, *inputs)``, the step's loss (ordered after the optimizer) and inputs. Output: ``loss``,
    ordered after the damping update.
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Cell):
        super().__init__(auto_prefix=False)  # the network's and optimizer's parameter names stay as they are
        self.network = network
        self.rule = optimizer.damping_rule
        self.global_step = optimizer.global_step

    def construct(self, loss, *inputs):
        if self.rule.due_after(ops.depend(self.global_step, loss)):
            after = self.network(*inputs)
            loss = F.depend(loss, self.rule.adapt(loss, after))
        return loss


def loss_probe_for(network: nn.Cell, optimizer) -> Optional[LossProbe]:
    """A :class:`LossProbe` when ``optimizer``'s damping rule needs the extra pass (the rule is then bound),
    else None."""
    rule = getattr(optimizer, "damping_rule", None)
    if rule is None or not getattr(rule, "needs_probe", False):
        return None
    rule.bind()
    return LossProbe(network, optimizer)


class TrainOneStepCell(nn.TrainOneStepCell):
    """``mindspore.nn.TrainOneStepCell`` that also runs the extra forward pass of ``thor(...,
    damping="adaptive")`` (:class:`LossProbe`) after the optimizer; for every other optimizer it is
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

    def construct(self, *inputs):
        out = super().construct(*inputs)
        if self.loss_probe is None:
            return out
        if self.return_grad:
            return self.loss_probe(out[0], *inputs), out[1]
        return self.loss_probe(out, *inputs)
