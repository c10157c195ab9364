"""Loss-scale training cells written the way MindSpore's model zoo writes them, for the drop-in tests.

``zoo_cells()`` defines the classes when it is called, from ``mindspore.nn.TrainOneStepWithLossScaleCell``
as it is at that moment: called under ``ms_optim.use()`` they derive from ms_optim's portable cell, as a
zoo script's classes do under ``python -m ms_optim.run``.

* ``BertStyle`` (official/nlp/Bert/src/bert_for_pre_training.py): its own ``scale_update_cell`` argument,
  ``self.degree``/``self.grad_reducer`` from ``reducer_flag`` (a non-mean reducer, then gradients divided
  by scale * degree), its own ``loss_scale`` Parameter, per-tensor clipping by norm (the zoo's
  GRADIENT_CLIP_TYPE 1; it runs before the overflow test, so an inf gradient must turn NaN there, as it
  does: inf/inf), and the inherited
  ``start_overflow_check``/``get_overflow_status`` with the manager called directly.
* ``GlobalNormStyle`` (official/cv/SwinTransformer/src/trainers/train_one_step_with_scale_and_clip_global_norm.py):
  the inherited ``scale_sense`` and ``process_loss_scale``, and clip by global norm after the overflow test.
"""
from __future__ import annotations

from typing import Dict

CLIP_NORM = 0.3          # BertStyle: every gradient tensor scaled to L2 norm <= CLIP_NORM
CLIP_GLOBAL_NORM = 0.2    # GlobalNormStyle: gradients scaled to global norm <= CLIP_GLOBAL_NORM


def zoo_cells() -> Dict[str, type]:
    """The two zoo-style subclasses of ``mindspore.nn.TrainOneStepWithLossScaleCell`` (as it is now)."""
    import mindspore.nn as nn
    from mindspore import Parameter, Tensor, ops
    from mindspore import dtype as mstype
    from mindspore.communication import get_group_size
    from mindspore.nn.wrap.grad_reducer import DistributedGradReducer

    grad_scale = ops.MultitypeFuncGraph("grad_scale")

    @grad_scale.register("Tensor", "Tensor")
    def _grad_scale(scale, grad):
        return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))

    clip_grad = ops.MultitypeFuncGraph("clip_grad")

    @clip_grad.register("Number", "Tensor")
    def _clip_grad(limit, grad):
        norm = ops.sqrt(ops.reduce_sum(grad * grad))
        return grad * limit / ops.maximum(norm, ops.cast(limit, ops.dtype(grad)))

    class BertStyle(nn.TrainOneStepWithLossScaleCell):
        """As the zoo's BertTrainOneStepWithLossScaleCell."""

        def __init__(self, network, optimizer, scale_update_cell=None):
            super(BertStyle, self).__init__(network, optimizer, scale_update_cell)
            self.cast = ops.Cast()
            self.degree = 1
            if self.reducer_flag:
                self.degree = get_group_size()
                self.grad_reducer = DistributedGradReducer(optimizer.parameters, False, self.degree)
            self.loss_scale = None
            self.loss_scaling_manager = scale_update_cell
            if scale_update_cell:
                self.loss_scale = Parameter(Tensor(scale_update_cell.get_loss_scale(), dtype=mstype.float32))
            self.enable_tuple_broaden = True

        def construct(self, x, y, sens=None):
            weights = self.weights
            loss = self.network(x, y)
            scaling_sens = self.loss_scale if sens is None else sens
            status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
            grads = self.grad(self.network, weights)(x, y, self.cast(scaling_sens, mstype.float32))
            grads = self.grad_reducer(grads)
            degree_sens = self.cast(scaling_sens * self.degree, mstype.float32)
            grads = self.hyper_map(ops.partial(grad_scale, degree_sens), grads)
            grads = self.hyper_map(ops.partial(clip_grad, CLIP_NORM), grads)
            cond = self.get_overflow_status(status, grads)
            overflow = cond
            if sens is None:
                overflow = self.loss_scaling_manager(self.loss_scale, cond)
            if not overflow:
                self.optimizer(grads)
            return loss, cond, scaling_sens

    class GlobalNormStyle(nn.TrainOneStepWithLossScaleCell):
        """As the zoo's TrainOneStepWithLossScaleCellGlobalNormClip."""

        def __init__(self, network, optimizer, scale_sense=1.0, use_global_norm=True,
                     clip_global_norm_value=CLIP_GLOBAL_NORM):
            super(GlobalNormStyle, self).__init__(network, optimizer, scale_sense)
            self.use_global_norm = use_global_norm
            self.clip_global_norm_value = clip_global_norm_value

        def construct(self, *inputs):
            weights = self.weights
            loss = self.network(*inputs)
            scaling_sens = self.scale_sense
            status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
            scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
            grads = self.grad(self.network, weights)(*inputs, scaling_sens_filled)
            grads = self.hyper_map(ops.partial(grad_scale, scaling_sens), grads)
            grads = self.grad_reducer(grads)
            cond = self.get_overflow_status(status, grads)
            overflow = self.process_loss_scale(cond)
            if not overflow:
                if self.use_global_norm:
                    grads = ops.clip_by_global_norm(grads, clip_norm=self.clip_global_norm_value)
                loss = ops.depend(loss, self.optimizer(grads))
            return loss

    return {"bert": BertStyle, "global_norm": GlobalNormStyle}
