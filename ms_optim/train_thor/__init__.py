"""`from ms_optim.train_thor import ConvertModelUtils` in place of `mindspore.train.train_thor`."""
from ms_optim._facade import lazy_dir, lazy_getattr

_EXPORTS = {
    "ConvertModelUtils": "ms_optim._thor.model",
    "ConvertNetUtils": "ms_optim._thor.net.convert",
    "ModelThor": "ms_optim._thor.model",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(_EXPORTS, __name__)
__dir__ = lazy_dir(_EXPORTS)
