"""THOR's factors on CPU as one op per factor: the fused kernels of ``ms_optim/optim/_thor_fused.cc``.

Written with ``mindspore.ops``, a layer's factor is a dozen graph nodes (im2col, padding, reshapes, a
batched product, a sum, a scale, the store-if-finite check, the store), and every THOR layer's tap holds
two of them inside an ``if thor_flag`` branch. Compile time and the compiled graph's memory follow the
node count, and on a deep conv net such taps are the larger part of THOR's compile. Here each factor is
one ``ops.Custom`` node of type ``"aot"`` that does all of it in place:

* ``MsOptimPatchGram(factor, x, flag, plan)``: the diagonal blocks of ``scale * sum p p^T`` over the
  im2col patches ``p`` of an NCHW input (a conv's A), or over the positions of ``dL/ds`` (a conv's G,
  a 1x1 kernel);
* ``MsOptimRowGram(factor, rows, flag, plan)``: the blocks of ``scale * R^T R`` for ``(N, n)`` rows (a
  Dense layer's A and G, an Embedding's G);
* ``MsOptimIdCounts(factor, ids, flag, plan)``: ``scale * counts`` of the ids in ``[0, vocab_size)`` (an
  Embedding's A).

Each also reads the layer's ``thor_flag`` and does nothing while it is False (so a float32 tap calls it
without a branch; a float16 tap, inside its ``if thor_flag`` branch: see ``taps.py``); it writes the factor
only when every value is finite (the previous one is kept, as the composite tap does) and returns ``[1.0]``
when it wrote, else ``[0.0]``. ``plan`` is a float64 constant with the scale and, for the patches, the conv
geometry and the block layout (``factors.conv_output_geometry``, ``factors.factor_blocks``). float16 inputs
(amp) are read as they are, and the sums are float32 as in the composite tap. A fourth op,
``MsOptimBlockPrecondition(g, g_inv, a_inv)``, is a Dense or conv gradient's ``G^-1 g A^-1`` with the stored
block inverses (``preconditioner.precondition_parameter``), and a fifth, ``MsOptimBlockInverse(inverse,
factor, lam, scale, plan)``, a factor's damped, checked inversion, written in place
(``inversion/batched.py``); ``MsOptimBlockInverseOut(factor, lam, scale, plan) -> (inverse, ok)`` is the same
as a pure op for the layer-by-layer inversion (``inversion/slot.py``). ``MsOptimBlockProduct`` is a curvature
product ``scale * G v A`` of the stored factors (``net/curvature.py``); ``MsOptimQuadTrial``,
``MsOptimQuadMove`` and ``MsOptimQuadProducts`` are ``learning_rate="adaptive"``'s moves and quadratic model
over all the parameters at once (:func:`quad_kernels`).

The products are oneDNN's ``dnnl_sgemm`` from MindSpore's own ``lib/libdnnl.so.3`` (the library
MindSpore's CPU kernels use), bound once per process through ``MsOptimSetSgemm``. The kernels are used
under the same switch as the other fused kernels (``_fused.fused_switch_on``: CPU and ``MS_OPTIM_FUSED``
not ``0``); on GPU and Ascend, without ``g++`` or without oneDNN the taps run the composite ops of
``factors.py``, which are also the reference the tests compare these kernels with (both against the
NumPy oracle).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
import warnings
from typing import NamedTuple, Optional

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops import constexpr

from ms_optim._thor.net.factors import conv_output_geometry, factor_blocks
from ms_optim.optim import _fused

__all__ = ["FactorKernels", "factor_kernels", "QuadKernels", "quad_kernels", "patch_plan_tensor",
           "row_plan_tensor", "count_plan_tensor"]

#: Largest patch panel (float32 values) ``MsOptimPatchGram`` lays out for one product: 8 MiB.
PANEL_FLOATS = 1 << 21

_lock = threading.Lock()
_kernels: Optional["FactorKernels"] = None
_unavailable: Optional[str] = None


class _FactorCustom(_fused._InplaceCustom):  # pylint: disable=protected-access
    """``(factor, input, flag, plan) -> written[1]``, writing ``factor`` in place (as the fused optimizer
    ops)."""

    __mindspore_signature__ = _fused._signature(4, 1)  # pylint: disable=protected-access


class _InverseCustom(_fused._InplaceCustom):  # pylint: disable=protected-access
    """``(inverse, factor, lam, scale, plan) -> written[1]``, writing ``inverse`` in place."""

    __mindspore_signature__ = _fused._signature(5, 1)  # pylint: disable=protected-access


class FactorKernels(NamedTuple):
    """THOR's fused CPU ops, by name (a tuple: positions work too, and GRAPH_MODE, which cannot read a
    named tuple's fields, gets the ops the Python side picked by name: ``taps.FactorTap.kernels``)."""

    patch_gram: ops.Custom          # MsOptimPatchGram: a conv's A and G
    row_gram: ops.Custom            # MsOptimRowGram: a Dense layer's A and G, an Embedding's G
    id_counts: ops.Custom           # MsOptimIdCounts: an Embedding's A
    precondition: ops.Custom        # MsOptimBlockPrecondition: G^-1 g A^-1
    block_inverse: ops.Custom       # MsOptimBlockInverse: damped inversion in place
    block_inverse_out: ops.Custom   # MsOptimBlockInverseOut: the same as a pure op, (inverse, ok)
    product: ops.Custom             # MsOptimBlockProduct: scale * G v A (a curvature product)


def _ops(path: str) -> FactorKernels:
    """The ops of the library at ``path``."""
    factor_ops = tuple(_FactorCustom(f"{path}:{name}") for name in ("MsOptimPatchGram", "MsOptimRowGram",
                                                                     "MsOptimIdCounts"))
    precondition = ops.Custom(f"{path}:MsOptimBlockPrecondition", out_shape=lambda grad, g_inv, a_inv: grad,
                              out_dtype=lambda grad, g_inv, a_inv: ms.float32, func_type="aot")
    inverse_out = ops.Custom(f"{path}:MsOptimBlockInverseOut",
                             out_shape=lambda factor, lam, scale, plan: [factor, [1]],
                             out_dtype=lambda *dtypes: [ms.float32, ms.float32], func_type="aot")
    block_inverse = _InverseCustom(f"{path}:MsOptimBlockInverse")
    product = ops.Custom(f"{path}:MsOptimBlockProduct", out_shape=lambda v, left, right, scale: v,
                         out_dtype=lambda *dtypes: ms.float32, func_type="aot")
    return FactorKernels(*factor_ops, precondition, block_inverse, inverse_out, product)


class QuadKernels(NamedTuple):
    """The ops of ``learning_rate="adaptive"`` over ``count`` parameters at once (``quad_kernels``)."""

    trial: ops.Custom      # MsOptimQuadTrial(weights, stored, previous, directions, coefs[2]), writes 2 count
    move: ops.Custom       # MsOptimQuadMove(weights, previous, vectors, coefs[4]): writes 2 * count
    products: ops.Custom   # MsOptimQuadProducts(6 groups of count, plan) -> (4, 2, 2)


def quad_kernels(count: int) -> Optional[QuadKernels]:
    """The :class:`QuadKernels` for ``count`` float32 parameters, when THOR's fused ops are available (else
    None: the composite ops run)."""
    if factor_kernels() is None:
        return None
    path = _fused.library_path()

    def inplace(name: str, inputs: int, written: int) -> ops.Custom:
        signature = _fused._signature(inputs, written)  # pylint: disable=protected-access
        cls = type(f"_{name}{count}", (_fused._InplaceCustom,), {"__mindspore_signature__": signature})  # pylint: disable=protected-access
        return cls(f"{path}:{name}")

    products = ops.Custom(f"{path}:MsOptimQuadProducts", out_shape=lambda *shapes: [4, 2, 2],
                          out_dtype=lambda *dtypes: ms.float32, func_type="aot")
    return QuadKernels(inplace("MsOptimQuadTrial", 4 * count + 1, 2 * count),
                       inplace("MsOptimQuadMove", 3 * count + 1, 2 * count), products)


def _onednn_sgemm() -> int:
    """Address of ``dnnl_sgemm`` in MindSpore's own oneDNN library (OSError if there is none)."""
    libraries = sorted(glob.glob(os.path.join(os.path.dirname(ms.__file__), "lib", "libdnnl.so*")))
    if not libraries:
        raise OSError("MindSpore ships no lib/libdnnl.so")
    return ctypes.cast(ctypes.CDLL(libraries[0]).dnnl_sgemm, ctypes.c_void_p).value


def _load() -> Optional[FactorKernels]:
    """Build the ops once per process (None, with one warning, if they cannot be had)."""
    global _kernels, _unavailable  # pylint: disable=global-statement
    path = _fused.library_path()
    if path is None:
        _unavailable = "the fused kernel library is unavailable"
        return None
    try:
        ctypes.CDLL(path).MsOptimSetSgemm(ctypes.c_void_p(_onednn_sgemm()))
        _kernels = _ops(path)
    except (OSError, AttributeError, TypeError, ValueError, RuntimeError) as error:
        _unavailable = " ".join(str(error).split())[:300]
        warnings.warn(f"ms_optim: THOR's fused factor kernels unavailable ({_unavailable}); the factor taps "
                      f"use composite ops (same results, larger graphs). Set MS_OPTIM_FUSED=0 to choose them "
                      f"and silence this warning.", _fused.FusedKernelWarning, stacklevel=3)
    return _kernels


def factor_kernels() -> Optional[FactorKernels]:
    """The :class:`FactorKernels` when the fused switch is on and the ops can be had, else None (the taps and
    the inversion then use the composite ops)."""
    if not _fused.fused_switch_on():
        return None
    with _lock:
        if _kernels is not None or _unavailable is not None:
            return _kernels
        return _load()


@constexpr
def patch_plan_tensor(shape, kernel_size, stride, dilation, pad_mode: str, padding, block_size,
                      multiplier: float, per_position: bool) -> Tensor:
    """``MsOptimPatchGram``'s plan for an NCHW input of ``shape`` (B, C, H, W) and a conv geometry, as one
    constant (with :data:`PANEL_FLOATS`). The scale is ``multiplier / (B * Ho * Wo)`` (``per_position``: a
    conv's A) or ``multiplier * B`` (a conv's G, over the positions of dL/ds)."""
    top, _, left, _, out_h, out_w = conv_output_geometry(shape[2], shape[3], kernel_size, stride, dilation,
                                                         pad_mode, padding)
    scale = multiplier / (shape[0] * out_h * out_w) if per_position else multiplier * shape[0]
    nblocks, bs = factor_blocks(shape[1] * kernel_size[0] * kernel_size[1], block_size)
    return _plan(scale, *kernel_size, *stride, *dilation, top, left, out_h, out_w, nblocks, bs, PANEL_FLOATS)


@constexpr
def row_plan_tensor(shape, block_size, multiplier: float, per_row: bool) -> Tensor:
    """``MsOptimRowGram``'s plan for ``(N, n)`` rows, as one constant: the scale is ``multiplier / N``
    (``per_row``: a Dense A) or ``multiplier * N`` (a G)."""
    scale = multiplier / shape[0] if per_row else multiplier * shape[0]
    return _plan(scale, *factor_blocks(shape[1], block_size))


@constexpr
def count_plan_tensor(count: int, multiplier: float) -> Tensor:
    """``MsOptimIdCounts``'s plan for ``count`` ids, as one constant: the scale ``multiplier / count``."""
    return _plan(multiplier / count)


def _plan(*values: float) -> Tensor:
    return Tensor(np.array(values, np.float64))
