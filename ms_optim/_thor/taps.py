"""THOR's backward-pass taps: where a layer's Kronecker factors are computed and stored.

The tap. In training mode a layer passes ``s`` through its tap, an identity with a custom ``bprop``
that receives the layer input and ``dL/ds`` and, while the layer's ``thor_flag`` is True, computes
and assigns both factors. So all factor work happens in the backward pass (a forward pass alone
never computes factors), the forward graph has no control flow (a flag-dependent branch in the
forward pass together with a backward hook makes MindSpore 2.10's GRAPH mode report a graph cycle
for layers called more than once), and it works in PYNATIVE and GRAPH mode, inside
``TrainOneStepCell`` and with ``mindspore.value_and_grad``/``mindspore.grad`` (also under
``ms.jit``). The tap ignores amp's precision flags and casts to float32 itself (in PYNATIVE mode amp
would cast the inputs of *every* op of a float16 cell).

Two ways to compute a factor, with the same numbers. On CPU (``MS_OPTIM_FUSED`` not ``0``) each factor is
one fused op (``factor_kernels.py``) that reads the flag itself (it does nothing while the flag is
False) and stores the factor only if it is finite; elsewhere an ``if flag`` branch runs the composite
ops of ``factors.py`` and stores with ``keep_if``/``assign``. The fused ops run without a branch when the
tap's gradient is float32 (and its input float32 or integer ids): each branch is a runtime ``Switch``
that cuts the backward pass into kernel graphs, and without them ResNet-50's step compiles about 0.9 s
faster (of 7) with the same numbers and memory. Under float16 (amp on CPU) the branch stays: the
backend then casts each saved float16 activation to float32 for its conv's gradient, and in one
backward kernel graph those casts, which read nothing but graph inputs, can all run at its start (the
ResNet trainer's batch-8 peak went from 3.18 to 3.58 GiB, and the rounding of ``dL/ds`` to float16
was folded away); the branches' kernel graphs keep each cast next to its conv. The composite taps made
THOR's compile time and compiled memory grow by a dozen nodes per factor (``factor_kernels`` gives the
figures). Which way a tap's bprop holds is chosen when the graph is parsed (``_FactorTap.factor_pass``), not
by an ``if`` in it: MindSpore expands every branch of a custom bprop at each call site, constant or not.

One tap for many layers. A tap keeps no state of its layer (the layer passes its flag and factors in),
so ``thor()`` gives the layers whose taps compute alike one tap Cell (:func:`share_factor_taps`): compiling
expands each Cell's custom ``bprop`` in a pass of its own over the whole graph, which made one tap per
layer cost layers times graph size (ResNet-50: 54 taps, 5.2 s of a 32 s compile; shared, 6 taps).

The factor formulas (and their normalisation) are in ``factors.py``; the layers (``layers.py``) own
the factor Parameters and the flag and route their pre-activation through a tap in training mode.

A step past the end of THOR's per-step ``learning_rate``/``damping`` is refused by the optimizer, which
runs after the backward pass. In GRAPH mode the whole step is one graph and the refusal leaves the
factors untouched; in PYNATIVE mode the backward pass has already run, so ``thor()`` gives every tap a
:class:`ScheduleGuard` that refuses the same step, with the same error, before the tap writes.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, context, nn, ops
from mindspore import dtype as mstype

from ms_optim._thor.conventions import FactorConvention
from ms_optim._thor.factor_kernels import count_plan_tensor, factor_kernels, patch_plan_tensor, row_plan_tensor
from ms_optim._thor.factors import (
    Pair,
    conv_a,
    conv_g,
    conv_output_geometry,
    dense_a,
    dense_g,
    embedding_a,
    embedding_g,
)
from ms_optim._thor.preconditioner import keep_if
from ms_optim.optim._base import check_schedule_length

__all__ = ["DenseTap", "ConvTap", "EmbeddingTap", "ScheduleGuard", "share_factor_taps"]


class ScheduleGuard(nn.Cell):
    """Refuse the step ``step`` indexes past the end of a per-step list before a tap writes the factors.

    Args:
        owner (str): the name the optimizer's message uses (``"thor"``).
        step (Parameter): the optimizer's ``global_step`` (0-based index of the step being run).
        limits (Sequence[Tuple[str, int]]): (argument name, number of values) of each per-step 1-D list.

    Calling it raises ``check_schedule_length``'s ValueError (the optimizer's own message) when the step is
    past the end of one of the lists, and returns ``step`` (for ``ops.depend``). A Cell of plain MindSpore
    ops, so it also compiles inside ``ms.jit`` in PYNATIVE mode; a tap does not call it in GRAPH mode
    (there the step's single graph is refused as a whole: see ``_FactorTap.schedule_guard``).
    """

    def __init__(self, owner: str, step: Parameter, limits: Sequence[Tuple[str, int]]):
        super().__init__()
        self.owner = owner
        self.step = step
        self.limits = tuple((name, int(size)) for name, size in limits)
        self.sizes = tuple(Tensor(int(size), mstype.int32) for _, size in limits)

    def construct(self):
        step = self.step
        for i in range(len(self.limits)):
            step = check_schedule_length(self.owner, self.limits[i][0], self.limits[i][1], self.sizes[i], step)
        return step


def share_factor_taps(layers: Sequence[nn.Cell]) -> None:
    """Give the THOR layers whose taps have equal ``sharing_key`` one tap Cell.

    Why: compiling expands each Cell's custom ``bprop`` in its own pass over the whole graph
    (MindSpore's ``meta_fg_expand``, one ``resolve`` each), so one tap per layer made that part of the
    compile grow as layers times graph size. A tap holds no state of its layer (the layer passes its
    factors and flag in), so layers of one geometry can call the same Cell: ResNet-50's 54 THOR layers
    need 6 taps. ``ThorLayer.own_factor_tap`` copies a shared tap before a layer's setting changes it.
    """
    taps = {}
    for layer in layers:
        tap = taps.setdefault(layer.factor_tap.sharing_key(), layer.factor_tap)
        tap.shared = tap.shared or tap is not layer.factor_tap
        layer.factor_tap = tap


_ID_TYPES = mstype.int_type + mstype.uint_type


def _kernel_input(value):
    """``value`` as the fused factor ops read it: float32, float16, int32 and int64 as they are, other
    integer ids as int32 (as the composite ``embedding_a`` casts them), other floats as float32."""
    if value.dtype in (mstype.float32, mstype.float16, mstype.int32, mstype.int64):
        return value
    if value.dtype in _ID_TYPES:
        return ops.cast(value, mstype.int32)
    return ops.cast(value, mstype.float32)


def _branch_free(x, dout) -> bool:
    """Whether a tap's fused ops may run without the ``if flag`` branch: ``dout`` float32 and ``x``
    float32 or integer ids (the module's docstring says why float16 keeps the branch)."""
    return dout.dtype == mstype.float32 and x.dtype in (mstype.float32, mstype.int32, mstype.int64)


class _FactorTap(nn.Cell):
    """Identity on the layer's pre-activation ``s`` whose backward pass stores the factors.

    ``tap(s, x, flag, a_cov, g_cov)`` returns ``s``. Its bprop receives the layer input ``x`` and
    ``ds = dL/ds``; while ``flag`` is True it writes ``A(x)`` into ``a_cov`` and ``G(ds)`` into
    ``g_cov`` (a non-finite value is not written) and passes ``ds`` through unchanged. The gradients
    it returns for ``x`` and the state are zeros (``x`` reaches the tap through ``stop_gradient``; its
    real gradient flows through the layer). Subclasses give ``_a_value(x)`` and ``_g_value(ds)``, the
    formulas of ``factors.py`` adapted by ``self.convention`` (a ``conventions.FactorConvention``; KFC,
    i.e. exactly those formulas, unless ``thor(..., factor_convention=...)`` sets another).
    """

    def __init__(self):
        super().__init__()
        self.convention = FactorConvention()
        self.block_size = None  # the layer's factor block width (``ThorLayer.set_factor_block_size``)
        self.__dict__["_schedule_guard"] = None  # see the schedule_guard property
        self.shared = False  # share_factor_taps gave this tap to several layers
        # factor_pass hands out one of these: bound methods made once and kept (MindSpore caches what it parsed by
        # the object's id, and a bound method made per access can take the id of one it parsed before)
        self.__dict__["_passes"] = (self._fused_pass, self._flagged_pass)

    @property
    def schedule_guard(self):
        """The :class:`ScheduleGuard` ``thor()`` set, in PYNATIVE mode; None in GRAPH mode, where the graph
        is compiled without it (read when the graph is parsed)."""
        if context.get_context("mode") != context.PYNATIVE_MODE:
            return None
        return self._schedule_guard

    def set_schedule_guard(self, guard: "ScheduleGuard") -> None:
        """Give this tap the guard ``thor()`` made. Kept out of the Cell tree: the guard holds the
        optimizer's ``global_step``, which is no Parameter of the net (nor in its checkpoints)."""
        self.__dict__["_schedule_guard"] = guard

    def sharing_key(self) -> tuple:
        """What the tap's graph depends on besides its inputs: the class, block width, convention,
        guard and geometry. Taps with equal keys compute alike, so :func:`share_factor_taps` can give
        their layers one Cell."""
        return (type(self), self.block_size, self.convention.name, self.convention.batch_size,
                id(self.__dict__["_schedule_guard"])) + self._geometry()

    def _geometry(self) -> tuple:
        """The subclass's constructor arguments."""
        return ()

    def clone(self) -> "_FactorTap":
        """A new tap set up as this one (:meth:`sharing_key` equal), used by one layer only."""
        tap = type(self)(*self._geometry())
        tap.block_size = self.block_size
        tap.convention = FactorConvention(self.convention.name, self.convention.batch_size)
        tap.set_schedule_guard(self.__dict__["_schedule_guard"])
        return tap

    def add_flags_recursive(self, **flags):
        """Ignore amp's precision flags (``to_float``): the tap casts to float32 itself, and a float16
        flag would make PYNATIVE mode compute the factors in float16."""
        flags = {key: value for key, value in flags.items() if key not in ("fp16", "fp32", "bf16")}
        return super().add_flags_recursive(**flags)

    def _a_value(self, x):
        raise NotImplementedError

    def _g_value(self, ds):
        raise NotImplementedError

    def construct(self, s, x, flag, a_cov, g_cov):
        return s

    @property
    def kernels(self):
        """THOR's fused factor ops (``factor_kernels.factor_kernels``: CPU, ``MS_OPTIM_FUSED`` not 0) or None:
        read when the graph is parsed, like ``schedule_guard``."""
        return factor_kernels()

    def _a_fused(self, kernels, a_cov, x, flag):
        raise NotImplementedError

    def _g_fused(self, kernels, g_cov, ds, flag):
        raise NotImplementedError

    def _store_fused(self, kernels, x, dout, flag, a_cov, g_cov):
        """The fused ops' stores of both factors; returns ``dout`` ordered after them.

        A waits for dout, so a layer called twice keeps its first call's A (its backward runs last), as it
        keeps its G. (Ordering A after G through the flag instead, ops.depend(flag, written_g), compiled
        ResNet-50 slower and 0.11 GiB larger: a depend on a Parameter.)"""
        written_a = self._a_fused(kernels, a_cov, _kernel_input(ops.depend(x, dout)), flag)
        written_g = self._g_fused(kernels, g_cov, _kernel_input(dout), flag)
        return ops.depend(ops.depend(dout, written_a), written_g)

    @property
    def factor_pass(self):
        """The bprop's factor work, chosen when the graph is parsed (like ``kernels``): :meth:`_fused_pass` with the
        fused ops and no guard (GRAPH mode on CPU), else :meth:`_flagged_pass`. Chosen here rather than by an ``if``
        in the bprop: MindSpore parses and expands every branch of a bprop at each of its call sites, even one whose
        condition is a constant, and the composite branch made ResNet-50's compile 0.3 s (of 6.5) slower and its
        compiled step 42 MiB larger."""
        return self.__dict__["_passes"][0 if self.kernels is not None and self.schedule_guard is None else 1]

    def _fused_pass(self, x, dout, flag, a_cov, g_cov):
        """Both factors by the fused ops; without a branch where :func:`_branch_free` allows (decided when the graph
        is compiled: the ops skip their work while the flag is False), else under ``if flag``."""
        kernels = self.kernels
        if _branch_free(x, dout):
            dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
        elif flag:
            dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
        return dout

    def _flagged_pass(self, x, dout, flag, a_cov, g_cov):
        """Both factors under ``if flag``: first the schedule guard (PYNATIVE), then the fused ops or the composite
        ones (stored where finite)."""
        kernels = self.kernels
        guard = self.schedule_guard
        if flag:
            if guard is not None:  # PYNATIVE: the optimizer refuses this step only after the backward pass
                dout = ops.depend(dout, guard())
            if kernels is not None:  # one op per factor (each also reads the flag)
                dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
            else:
                a_new = self._a_value(x)
                a_new = keep_if(ops.isfinite(a_new).all(), a_new, a_cov)
                g_new = self._g_value(dout)
                g_new = keep_if(ops.isfinite(g_new).all(), g_new, g_cov)
                dout = ops.depend(dout, ops.assign(a_cov, a_new))
                dout = ops.depend(dout, ops.assign(g_cov, g_new))
        return dout

    def bprop(self, s, x, flag, a_cov, g_cov, out, dout):
        dout = self.factor_pass(x, dout, flag, a_cov, g_cov)
        # under amp the custom bprop sees the un-cast input s: hand its gradient back in s's dtype
        return (ops.cast(dout, s.dtype), ops.zeros_like(x), ops.zeros_like(flag), ops.zeros_like(a_cov),
                ops.zeros_like(g_cov))


class DenseTap(_FactorTap):
    """Tap of a Dense layer: :func:`dense_a`, :func:`dense_g`."""

    def _a_value(self, x):
        return self.convention.apply(dense_a(x, self.block_size),
                                     self.convention.dense_scales(x.shape[0], x.shape[1])[0])

    def _g_value(self, ds):
        return self.convention.apply(dense_g(ds, self.block_size),
                                     self.convention.dense_scales(ds.shape[0], ds.shape[1])[1])

    def _a_fused(self, kernels, a_cov, x, flag):
        scale = self.convention.dense_scales(x.shape[0], x.shape[1])[0]
        return kernels[1](a_cov, x, flag, row_plan_tensor(x.shape, self.block_size, scale, True))

    def _g_fused(self, kernels, g_cov, ds, flag):
        scale = self.convention.dense_scales(ds.shape[0], ds.shape[1])[1]
        return kernels[1](g_cov, ds, flag, row_plan_tensor(ds.shape, self.block_size, scale, False))


class ConvTap(_FactorTap):
    """Tap of a Conv2d layer (NCHW, group 1): :func:`conv_a` with the layer's geometry, :func:`conv_g`."""

    def __init__(self, kernel_size: Pair, stride: Pair, dilation: Pair, pad_mode: str, padding):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.dilation = dilation
        self.pad_mode = pad_mode
        self.padding = tuple(padding) if isinstance(padding, list) else padding

    def _geometry(self) -> tuple:
        return (self.kernel_size, self.stride, self.dilation, self.pad_mode, self.padding)

    def _a_value(self, x):
        geometry = conv_output_geometry(x.shape[2], x.shape[3], self.kernel_size, self.stride, self.dilation,
                                        self.pad_mode, self.padding)
        scale = self.convention.conv_scales(x.shape[0], geometry[4] * geometry[5])[0]
        a = conv_a(self.convention.conv_input(x), self.kernel_size, self.stride, self.dilation, self.pad_mode,
                   self.padding, self.block_size)
        return self.convention.apply(a, scale)

    def _g_value(self, ds):
        scale = self.convention.conv_scales(ds.shape[0], ds.shape[2] * ds.shape[3])[1]
        return self.convention.apply(conv_g(self.convention.conv_grad(ds), self.block_size), scale)

    def _a_fused(self, kernels, a_cov, x, flag):
        geometry = conv_output_geometry(x.shape[2], x.shape[3], self.kernel_size, self.stride, self.dilation,
                                        self.pad_mode, self.padding)
        scale = self.convention.conv_scales(x.shape[0], geometry[4] * geometry[5])[0]
        x = self.convention.conv_input(x)
        plan = patch_plan_tensor(x.shape, self.kernel_size, self.stride, self.dilation, self.pad_mode, self.padding,
                                 self.block_size, scale, True)
        return kernels[0](a_cov, x, flag, plan)

    def _g_fused(self, kernels, g_cov, ds, flag):
        scale = self.convention.conv_scales(ds.shape[0], ds.shape[2] * ds.shape[3])[1]
        ds = self.convention.conv_grad(ds)
        plan = patch_plan_tensor(ds.shape, (1, 1), (1, 1), (1, 1), "valid", 0, self.block_size, scale, False)
        return kernels[0](g_cov, ds, flag, plan)


class EmbeddingTap(_FactorTap):
    """Tap of an Embedding layer: :func:`embedding_a` (the diagonal of A), :func:`embedding_g`."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.limit = Tensor(np.array(vocab_size, np.int32))

    def _geometry(self) -> tuple:
        return (self.vocab_size,)

    def _a_value(self, x):
        return self.convention.apply(embedding_a(x, self.vocab_size, self.limit),
                                     self.convention.embedding_scales(x.shape[0])[0])

    def _g_value(self, ds):
        return self.convention.apply(embedding_g(ds, self.block_size), self.convention.embedding_scales(ds.shape[0])[1])

    def _a_fused(self, kernels, a_cov, x, flag):
        scale = self.convention.embedding_scales(x.shape[0])[0]
        return kernels[2](a_cov, x, flag, count_plan_tensor(x.shape[0], scale))

    def _g_fused(self, kernels, g_cov, ds, flag):
        scale = self.convention.embedding_scales(ds.shape[0])[1]
        return kernels[1](g_cov, ds, flag, row_plan_tensor(ds.shape, self.block_size, scale, False))
