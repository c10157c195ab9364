"""Float16 ``x + y`` in graphs computed through float32: the same bits, without the CPU kernel's index arrays.

Why. On CPU, MindSpore 2.10's ``Add`` kernel keeps, for float16 operands, two 64-bit index arrays with
one entry per output element (16 bytes per element against the 2 of the float16 result), made when the
kernel first runs and kept for the life of the process; for float32 it keeps none. In a float16 ResNet
(amp "O2"/"O3", which model-zoo trainers give THOR) every residual ``out + identity`` is such an ``Add``,
so those arrays grow with the batch and the image, and stay (the benchmarks page has what the float32
route saves at ResNet-50's training size).

What. :func:`float16_add_via_float32` re-registers the graph meaning of ``+`` for two tensors so that,
when both are float16 and of one static shape, the graph computes ``cast(cast(x, f32) + cast(y, f32),
f16)``; every other pair keeps MindSpore's own ``+``. It applies to graphs compiled afterwards in the
whole process (GRAPH mode and ``ms.jit``; PYNATIVE's ``Tensor.__add__`` does not use it).
:func:`restore_float16_add` undoes it (for graphs compiled afterwards). Both are public
(``ms_optim.float16_add_via_float32``, ``ms_optim.restore_float16_add``).

When. ``ModelThor`` installs it on CPU (device_target "CPU"), in ``_build_train_network``, i.e. when the
model builds its training cell (at construction, as ``Model``) -- before that cell is compiled -- and
leaves it installed. To have MindSpore's ``+`` in graphs compiled later in the same process, call
``ms_optim.restore_float16_add()`` after building the ``ModelThor`` (graphs already compiled keep the add
they were compiled with).

Same numbers. The float32 sum of two float16 values rounded to float16 is the correctly rounded float16
sum: float32 carries 24 bits, at least 2 * 11 + 2, which makes the double rounding of an addition
innocuous, and overflow gives the same infinity. The gradient of ``+`` passes ``dL/d(x+y)`` to both
operands; through the casts it goes float16 -> float32 -> float16, which is exact. Broadcasting pairs
are left alone: their gradients reduce over the broadcast axes, and a float32 reduction can round
differently from a float16 one.
"""
from __future__ import annotations

from mindspore import dtype as mstype
from mindspore import ops
from mindspore.ops.composite.multitype_ops import add_impl

__all__ = ["float16_add_via_float32", "restore_float16_add"]

# MindSpore's graph function for ``Tensor + Tensor`` (None if a MindSpore version names it otherwise: then
# nothing is re-registered)
_MINDSPORE_ADD = getattr(add_impl, "_tensor_add_tensor", None)
_STATE = {"installed": False}


def _same_static_shape(x_shape, y_shape) -> bool:
    """Whether two shapes are equal and fully known (read when the graph is compiled)."""
    return x_shape == y_shape and -1 not in x_shape and -2 not in x_shape


def _add_tensors(x, y):
    """``x + y`` of two tensors; float16 pairs of one static shape through float32 (module docstring)."""
    if x.dtype == mstype.float16 and y.dtype == mstype.float16 and _same_static_shape(x.shape, y.shape):
        return ops.cast(_MINDSPORE_ADD(ops.cast(x, mstype.float32), ops.cast(y, mstype.float32)),
                        mstype.float16)
    return _MINDSPORE_ADD(x, y)


def float16_add_via_float32() -> None:
    """Make graphs compiled from now on add float16 tensors of one shape through float32 (whole process).

    On CPU, MindSpore's ``Add`` kernel keeps two 64-bit index arrays per output element of a float16 sum,
    for the life of the process; for float32 it keeps none. ``cast(cast(x, f32) + cast(y, f32), f16)``
    gives the same bits as the float16 sum (the float32 sum rounded once more to float16 is the correctly
    rounded float16 sum), and its gradient is exact. Other pairs (other dtypes, broadcasting) keep
    MindSpore's own ``+``; PYNATIVE's ``Tensor.__add__`` is not affected. Idempotent.

    ``ms_optim.train_thor.ModelThor`` calls it on CPU when it builds its training cell (at construction);
    :func:`ms_optim.restore_float16_add` undoes it.
    """
    if not _STATE["installed"] and _MINDSPORE_ADD is not None:
        add_impl.add.register("Tensor", "Tensor")(_add_tensors)
        _STATE["installed"] = True


def restore_float16_add() -> None:
    """Give ``+`` of two tensors MindSpore's own meaning again, for graphs compiled from now on (graphs
    already compiled keep theirs): the undo of :func:`ms_optim.float16_add_via_float32`, e.g. after a
    ``ModelThor`` on CPU installed it. Idempotent; does nothing when it is not installed."""
    if _STATE["installed"]:
        add_impl.add.register("Tensor", "Tensor")(_MINDSPORE_ADD)
        _STATE["installed"] = False
