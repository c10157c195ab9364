"""The layer-wise trust ratio shared by Lamb and LARS (one small pure function, optax style).

Both optimizers scale a per-parameter update ``u`` by how large the weight ``w`` is compared with
that update::

    ratio = coefficient * ||w|| / denominator      where ||w|| > 0 and ||u|| > 0
    ratio = 1                                       otherwise (a zero weight or a zero update)

with ``denominator = ||u||`` by default (Lamb: ``u = r``, the Adam direction plus weight decay,
``coefficient = 1``) or an explicit one (LARS: ``u = g``, ``denominator = ||g|| + wd*||w|| + epsilon``).
The zero rule keeps a freshly zero-initialised weight (a bias) or a parameter without gradient
from being frozen or blown up by a 0/0.

The fused CPU kernels (:mod:`ms_optim.optim._fused`) apply the same rule inside their C++ loops;
the tests run both paths against one NumPy oracle, so the two cannot drift apart unnoticed.

Everything here is plain ``mindspore.ops`` on 0-D float32 tensors, usable in PYNATIVE and in
GRAPH mode (inside ``construct``), and independent of any optimizer state.
"""
from __future__ import annotations

from typing import Optional, Union

import mindspore as ms
from mindspore import Tensor, ops

__all__ = ["l2_norm", "trust_ratio"]


def l2_norm(x: Tensor) -> Tensor:
    """Euclidean norm of all elements of ``x`` as a 0-D float32 tensor (one pass over ``x``)."""
    x = ops.cast(x, ms.float32)
    return ops.sqrt(ops.reduce_sum(x * x))


def trust_ratio(param_norm: Tensor, update_norm: Tensor, denominator: Optional[Tensor] = None,
                coefficient: Union[float, Tensor] = 1.0) -> Tensor:
    """Layer-wise trust ratio ``coefficient * ||w|| / denominator``, or 1 where a norm is 0.

    Args:
        param_norm: ``||w||``, a 0-D float tensor.
        update_norm: ``||u||``, a 0-D float tensor; only its being zero matters when ``denominator``
            is given.
        denominator: the divisor; ``None`` means ``update_norm`` (Lamb).
        coefficient: the scale in front (LARS's ``coefficient``; 1 for Lamb); a Tensor when called
            eagerly in PYNATIVE mode, a float is fine inside compiled code (``construct``, ``jit``).

    Returns:
        0-D float tensor: the ratio, exactly 1.0 where ``param_norm == 0`` or ``update_norm == 0``.
    """
    if denominator is None:
        denominator = update_norm
    zero = ops.zeros_like(param_norm)
    both_positive = ops.logical_and(ops.gt(param_norm, zero), ops.gt(update_norm, zero))
    one = ops.ones_like(param_norm)
    # divide by a safe value so that no inf/nan is ever produced (not even in the branch not taken)
    safe_denominator = ops.select(both_positive, denominator, one)
    return ops.select(both_positive, coefficient * param_norm / safe_denominator, one)
