"""`from ms_optim import nn` in place of `from mindspore import nn`.

The optimizers and THOR layers below are ms_optim's own implementations; every other name
(`nn.Dense`, `nn.Momentum`, `nn.Cell`, ...) is MindSpore's, so a script needs no other change.
`_EXPORTS` re-implements MindSpore's names (what `ms_optim.use()` replaces); `_EXTRAS` are ms_optim's
own additions: names MindSpore has not (`Conv1dThor`), and `TrainOneStepCell`, MindSpore's cell plus the
extra forward pass of `thor(..., damping="adaptive")`, which `use()` leaves alone (MindSpore's
`nn.TrainOneStepCell` stays MindSpore's; an adaptive THOR optimizer refuses to be stepped by it).
"""
from ms_optim._facade import lazy_dir, lazy_getattr

_EXPORTS = {
    "Lamb": "ms_optim.optim.lamb",
    "LARS": "ms_optim.optim.lars",
    "ASGD": "ms_optim.optim.asgd",
    "thor": "ms_optim._thor.factory",
    "DenseThor": "ms_optim._thor.net.layers",
    "Conv2dThor": "ms_optim._thor.net.layers",
    "EmbeddingThor": "ms_optim._thor.net.layers",
    # MindSpore's needs an Ascend-only status op on CPU; this one has the same signature and runs anywhere.
    "TrainOneStepWithLossScaleCell": "ms_optim.loss_scale",
}
_EXTRAS = {
    "Conv1dThor": "ms_optim._thor.net.layers",
    # MindSpore's cell plus the extra forward pass of thor(..., damping="adaptive"); not installed by use()
    "TrainOneStepCell": "ms_optim.loss_scale",
}

__all__ = sorted({**_EXPORTS, **_EXTRAS})
__getattr__ = lazy_getattr({**_EXPORTS, **_EXTRAS}, __name__, fallback="mindspore.nn")
__dir__ = lazy_dir({**_EXPORTS, **_EXTRAS}, fallback="mindspore.nn")
