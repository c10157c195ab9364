"""`from ms_optim import amp` in place of `from mindspore import amp`.

``build_train_network`` (what ``Model`` calls) is ms_optim's: on CPU it also builds the loss-scaled
training network that MindSpore refuses there (see ``ms_optim.loss_scale``). Every other name is
MindSpore's.
"""
from ms_optim._facade import lazy_dir, lazy_getattr

_EXPORTS = {
    "build_train_network": "ms_optim.loss_scale",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(_EXPORTS, __name__, fallback="mindspore.amp")
__dir__ = lazy_dir(_EXPORTS, fallback="mindspore.amp")
