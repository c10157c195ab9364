"""ms_optim: THOR, LARS, ASGD and Lamb for MindSpore, on CPU, GPU and Ascend.

Public names: ``ms_optim.nn`` (drop-in for ``mindspore.nn``), ``ms_optim.train_thor`` (drop-in for
``mindspore.train.train_thor``), ``ms_optim.amp`` (drop-in for ``mindspore.amp``: ``build_train_network``
also builds the loss-scaled network on CPU), and every optimizer/THOR name at top level (``ms_optim.Lamb``,
``ms_optim.thor``, ``ms_optim.ConvertModelUtils``, ...), ``ms_optim.release_freed_memory`` (give a
graph compilation's freed memory back to the system: ``ms_optim._memory``) and
``ms_optim.float16_add_via_float32`` (float16 ``+`` in graphs through float32, the same bits without the CPU
``Add`` kernel's per-element index arrays; ``ModelThor`` does it on CPU: ``ms_optim._float16_add``) with its
undo ``ms_optim.restore_float16_add``.
"""
from ms_optim import amp  # noqa: F401  (the facade is lazy: importing it loads nothing else)
from ms_optim._facade import lazy_dir, lazy_getattr
from ms_optim.nn import _EXPORTS as _NN_EXPORTS
from ms_optim.nn import _EXTRAS as _NN_EXTRAS
from ms_optim.train_thor import _EXPORTS as _TRAIN_THOR_EXPORTS

__version__ = "0.1.0"

# use()/undo_use(): point MindSpore's own names at ms_optim's (what `python -m ms_optim.run` does).
_EXPORTS = {**_NN_EXPORTS, **_NN_EXTRAS, **_TRAIN_THOR_EXPORTS, "use": "ms_optim._patch",
            "undo_use": "ms_optim._patch", "release_freed_memory": "ms_optim._memory",
            "float16_add_via_float32": "ms_optim._float16_add",
            "restore_float16_add": "ms_optim._float16_add"}

__all__ = sorted(_EXPORTS) + ["amp", "nn", "train_thor"]
__getattr__ = lazy_getattr(_EXPORTS, __name__)
__dir__ = lazy_dir(_EXPORTS)
