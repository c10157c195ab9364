"""A loss-scaled training step that runs on every backend, with MindSpore's signature.

MindSpore 2.10's ``nn.TrainOneStepWithLossScaleCell`` detects overflow with a status op that has no
CPU kernel (``NPUGetFloatStatusV2``), so on CPU it fails at the first step. This cell is a drop-in
subclass with the same constructor ``(network, optimizer, scale_sense)`` and the same outputs
``(loss, overflow, scale after the update)``, whose overflow test is made of portable ops:

    overflow = not all(isfinite(g) for g in grads)      (OR-ed over data-parallel ranks)

Each step: the loss's gradient is seeded with the current scale s, gradients are divided by s,
all-reduced in data-parallel runs, tested for overflow, the scale manager (``scale_sense`` as a
``DynamicLossScaleUpdateCell``/``FixedLossScaleUpdateCell``, or a Tensor) updates s, and the
optimizer runs only when there was no overflow, so an overflowing step leaves parameters and
every optimizer state untouched.

For an ms_optim THOR optimizer it also feeds the scale this step's backward pass used (read before
the manager updates it) into the optimizer (``feed_loss_scale``), because the THOR layers' G factors
carry that scale squared.

``from ms_optim import nn`` gives this class as ``nn.TrainOneStepWithLossScaleCell``; ``ModelThor``
uses it for ``DynamicLossScaleManager`` and ``FixedLossScaleManager(drop_overflow_update=True)``.
"""
from __future__ import annotations

from mindspore import dtype as mstype
from mindspore import nn, ops

__all__ = ["TrainOneStepWithLossScaleCell"]

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


class TrainOneStepWithLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """``mindspore.nn.TrainOneStepWithLossScaleCell`` with a portable overflow test (runs on CPU too).

    Args:
        network (Cell): the network with its loss (e.g. ``nn.WithLossCell``).
        optimizer (Cell): the optimizer (any ``mindspore.nn.Optimizer``, ms_optim's included).
        scale_sense (Union[Tensor, Cell]): the loss scale as a Tensor, or the update cell of a loss-scale
            manager (``DynamicLossScaleManager(...).get_update_cell()``).

    Outputs:
        Tuple of (loss, overflow, scale): the loss, whether this step overflowed (bool Tensor), and the
        loss scale after this step's update (as MindSpore's cell returns it).

    Raises:
        TypeError: if ``scale_sense`` is neither a Cell nor a Tensor (as MindSpore's cell).

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim import nn
        >>> net = nn.WithLossCell(nn.Dense(4, 2), nn.MSELoss())
        >>> opt = nn.Lamb(net.trainable_params(), learning_rate=0.01)
        >>> manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0**10, scale_factor=2, scale_window=50)
        >>> step = nn.TrainOneStepWithLossScaleCell(net, opt, scale_sense=manager.get_update_cell())
    """

    def __init__(self, network, optimizer, scale_sense):
        super().__init__(network, optimizer, scale_sense)
        self.feeds_loss_scale = callable(getattr(optimizer, "feed_loss_scale", None))

    def construct(self, *inputs):
        loss = self.network(*inputs)
        used_scale = self.scale_sense * 1.0  # a copy: the manager may update scale_sense below
        sens = ops.ones_like(loss) * ops.cast(used_scale, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.hyper_map(ops.partial(_unscale, ops.reciprocal(used_scale)), grads)
        grads = self.grad_reducer(grads)
        if self.feeds_loss_scale:
            grads = ops.depend(grads, self.optimizer.feed_loss_scale(used_scale))
        cond = self.get_overflow_status(None, grads)
        overflow = self.process_loss_scale(cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, self.scale_sense  # after the manager's update, as MindSpore's cell returns it

    def get_overflow_status(self, status, compute_output):
        """True when any gradient has a non-finite element (on any data-parallel rank)."""
        flags = self.hyper_map(_all_finite, compute_output)
        finite = ops.stack(flags).all()
        overflow = ops.logical_not(finite)
        if self.is_distributed:
            count = self.allreduce(ops.cast(overflow, mstype.float32).reshape((1,)))
            overflow = (count > 0.0).reshape(())
        return overflow
