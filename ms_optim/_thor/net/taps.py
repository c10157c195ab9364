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
that cuts the backward pass into kernel graphs, so without them the step compiles faster with the same
numbers and memory. Under float16 (amp on CPU) the branch stays: the backend then casts each saved
float16 activation to float32 for its conv's gradient, and in one backward kernel graph those casts,
which read nothing but graph inputs, can all run at its start (raising the peak, and folding away the
rounding of ``dL/ds`` to float16); the branches' kernel graphs keep each cast next to its conv. The
composite taps make THOR's compile time and compiled memory grow by a dozen nodes per factor
(``factor_kernels``). Which way a tap's bprop holds is chosen when the graph is parsed
(``FactorTap.factor_pass``), not by an ``if`` in it: MindSpore expands every branch of a custom bprop at
each call site, constant or not.

One tap class for every kind. A :class:`FactorTap` is built over a layer kind's spec (``kinds.py``), the
static geometry of its layer and the :class:`TapSettings` of the conversion (factor convention,
``batch_size``, block width, schedule guard), all final when the tap is made: the spec computes the
factors, the tap only decides how (fused or composite, with or without a branch) and stores them.

One tap for many layers. A tap keeps no state of its layer (the layer passes its flag and factors in),
so the layers of one conversion whose taps compute alike get one tap Cell (:class:`TapPool`, used by
``convert.convert_net``): compiling expands each Cell's custom ``bprop`` in a pass of its own over the
whole graph, so one tap per layer would cost layers times graph size (a ResNet-50 needs 6 shared taps
for its 54 layers).

The factor formulas (and their normalisation) are in ``factors.py`` and ``kinds.py``; the layers
(``layers.py``) own the factor Parameters and the flag and route their pre-activation through a tap in
training mode.

A step past the end of THOR's per-step ``learning_rate``/``damping`` is refused by the optimizer, which
runs after the backward pass. In GRAPH mode the whole step is one graph and the refusal leaves the
factors untouched; in PYNATIVE mode the backward pass has already run, so ``thor()`` converts with a
:class:`ScheduleGuard` in the settings, which refuses the same step, with the same error, before the tap
writes.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor, context, nn, ops
from mindspore import dtype as mstype

from ms_optim._thor.modes import Convention
from ms_optim._thor.net.blocks import keep_if
from ms_optim._thor.net.factor_kernels import factor_kernels
from ms_optim._thor.net.kinds import KindSpec
from ms_optim.optim._base import check_schedule_length

__all__ = ["FactorTap", "TapSettings", "TapPool", "ScheduleGuard", "DEFAULT_BLOCK_SIZE", "DEFAULT_SETTINGS"]

#: Factor block width of a THOR layer built with the default settings (``thor``'s default ``block_size``).
DEFAULT_BLOCK_SIZE = 128


class _GuardChoices(nn.Cell):
    """What a :class:`ScheduleGuard` reads in Python when its graph is parsed (a property of a base class:
    see :class:`_ParsedChoices`)."""

    @property
    def refusal(self) -> str:
        """The bound optimizer's message when it measures its steps but no training cell runs the extra
        forward pass for it (``ThorOptimizer.probed``), else ``""``."""
        optimizer = self.__dict__.get("optimizer")
        if optimizer is None or not optimizer.measures_loss or optimizer.probed:
            return ""
        return optimizer.unprobed


class ScheduleGuard(_GuardChoices):
    """Refuse, before a tap writes the factors, a step the optimizer would refuse after the backward pass:
    one that ``step`` indexes past the end of a per-step list, or any step of an optimizer that measures its
    steps stepped by a training cell that never runs the extra forward pass.

    Args:
        owner (str): the name the optimizer's message uses (``"thor"``).
        step (Parameter): the optimizer's ``global_step`` (0-based index of the step being run).
        limits (Sequence[Tuple[str, int]]): (argument name, number of values) of each per-step 1-D list.

    Calling it raises ``check_schedule_length``'s ValueError (the optimizer's own message) when the step is
    past the end of one of the lists, or the optimizer's RuntimeError (:attr:`refusal`), and returns ``step``
    (for ``ops.depend``). A Cell of plain MindSpore ops, so it also compiles inside ``ms.jit`` in PYNATIVE
    mode; a tap does not call it in GRAPH mode (there the step's single graph is refused as a whole: see
    ``FactorTap.schedule_guard``). :meth:`bind` gives it the optimizer once that exists.
    """

    def __init__(self, owner: str, step: Parameter, limits: Sequence[Tuple[str, int]]):
        super().__init__()
        self.owner = owner
        self.step = step
        self.limits = tuple((name, int(size)) for name, size in limits)
        self.sizes = tuple(Tensor(int(size), mstype.int32) for _, size in limits)
        self.__dict__["optimizer"] = None  # kept out of the Cell tree (it holds the net)

    def bind(self, optimizer) -> None:
        """Read ``optimizer``'s ``global_step``, and refuse its steps while it is not ``probed``."""
        self.step = optimizer.global_step
        self.__dict__["optimizer"] = optimizer

    def construct(self):
        if self.refusal:
            raise RuntimeError(self.refusal)
        step = self.step
        for i in range(len(self.limits)):
            step = check_schedule_length(self.owner, self.limits[i][0], self.limits[i][1], self.sizes[i],
                                         step)
        return step


class TapSettings(NamedTuple):
    """What a conversion gives every tap (Python side only; the tap copies the numbers it reads in graphs).

    * ``convention``: a concrete ``modes.Convention`` (gpu, ascend or kfc), the factors' normalisation;
    * ``batch_size``: thor()'s ``batch_size``, which the gpu/ascend multipliers read;
    * ``block_size``: the width of the diagonal blocks the factors are stored in (None: whole matrices);
    * ``guard``: the :class:`ScheduleGuard` of thor()'s per-step lists, or None.
    """

    convention: str = Convention.KFC
    batch_size: int = 32
    block_size: Optional[int] = DEFAULT_BLOCK_SIZE
    guard: Optional[ScheduleGuard] = None


#: The settings of a THOR layer made by its constructor or ``ConvertNetUtils``: kfc, 32, blocks of 128,
#: no guard.
DEFAULT_SETTINGS = TapSettings()


def tap_key(spec: KindSpec, geometry: tuple, settings: TapSettings) -> tuple:
    """What a tap's graph depends on besides its inputs: kind, block width, convention, ``batch_size``, guard
    and geometry. Taps with equal keys compute alike, so their layers can share one Cell
    (:class:`TapPool`)."""
    return (spec.kind, settings.block_size, settings.convention, int(settings.batch_size),
            id(settings.guard)) + tuple(geometry)


class TapPool:
    """The taps of one conversion: one :class:`FactorTap` per :func:`tap_key`, handed to every layer that asks
    for it (``FactorTap.shared`` then says so)."""

    def __init__(self):
        self._taps: Dict[tuple, FactorTap] = {}

    def tap(self, spec: KindSpec, geometry: tuple, settings: TapSettings) -> "FactorTap":
        key = tap_key(spec, geometry, settings)
        tap = self._taps.get(key)
        if tap is None:
            tap = self._taps[key] = FactorTap(spec, geometry, settings)
        else:
            tap.shared = True
        return tap


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


class _ParsedChoices(nn.Cell):
    """The choices a tap's bprop reads when its graph is parsed, as properties of a base class.

    MindSpore's parser compiles a property of the object's own class into the graph (it looks only in
    ``type(obj).__dict__``), where ``context`` and the environment cannot be read; a property inherited
    from a base class it reads in Python, at parse time, and puts its value in the graph as a constant.
    :class:`FactorTap` inherits these so that its graph holds one way of computing the factors.
    """

    @property
    def schedule_guard(self):
        """The settings' :class:`ScheduleGuard`, in PYNATIVE mode; None in GRAPH mode, where the graph is
        compiled without it (read when the graph is parsed)."""
        if context.get_context("mode") != context.PYNATIVE_MODE:
            return None
        return self.settings.guard

    @property
    def kernels(self):
        """``(A op, G op)``: the fused factor ops the spec names (``factor_kernels``: CPU, ``MS_OPTIM_FUSED``
        not 0), or None; picked by name here, in Python, when the graph is parsed (like
        ``schedule_guard``)."""
        kernels = factor_kernels()
        if kernels is None:
            return None
        return getattr(kernels, self.spec.a_op), getattr(kernels, self.spec.g_op)

    @property
    def factor_pass(self):
        """The bprop's factor work, chosen when the graph is parsed (like ``kernels``): :meth:`_fused_pass`
        with the fused ops and no guard (GRAPH mode on CPU), else :meth:`_flagged_pass`. Chosen here rather
        than by an ``if`` in the bprop: MindSpore parses and expands every branch of a bprop at each of its
        call sites, even one whose condition is a constant, and the composite branch would make the compile
        slower and the compiled step larger."""
        return self.__dict__["_passes"][0 if self.kernels is not None and self.schedule_guard is None else 1]


class FactorTap(_ParsedChoices):
    """Identity on the layer's pre-activation ``s`` whose backward pass stores the factors.

    Args:
        spec (KindSpec): the layer kind (``kinds.py``), which computes the factors.
        geometry (tuple): the layer's static geometry (``spec.geometry(layer)``).
        settings (TapSettings): convention, ``batch_size``, block width and schedule guard.

    ``tap(s, x, flag, a_cov, g_cov)`` returns ``s``. Its bprop receives the layer input ``x`` and
    ``ds = dL/ds``; while ``flag`` is True it writes ``A(x)`` into ``a_cov`` and ``G(ds)`` into
    ``g_cov`` (a non-finite value is not written) and passes ``ds`` through unchanged. The gradients
    it returns for ``x`` and the state are zeros (``x`` reaches the tap through ``stop_gradient``; its
    real gradient flows through the layer).
    """

    def __init__(self, spec: KindSpec, geometry: tuple = (), settings: TapSettings = DEFAULT_SETTINGS):
        super().__init__()
        # kept out of the Cell tree: the guard holds the optimizer's global_step, which is no Parameter of
        # the net (nor in its checkpoints); the spec is a jit_class shared by every tap of its kind
        self.__dict__["settings"] = settings
        self.__dict__["spec"] = spec
        self.geometry = tuple(geometry)
        self.convention = settings.convention
        self.batch_size = int(settings.batch_size)
        self.block_size = None if settings.block_size is None else int(settings.block_size)
        self.shared = False  # a TapPool gave this tap to several layers
        # factor_pass hands out one of these: bound methods made once and kept (MindSpore caches what it
        # parsed by the object's id, and a bound method made per access can take the id of one it parsed
        # before)
        self.__dict__["_passes"] = (self._fused_pass, self._flagged_pass)

    def sharing_key(self) -> tuple:
        """:func:`tap_key` of this tap."""
        return tap_key(self.spec, self.geometry, self.settings)

    def clone(self) -> "FactorTap":
        """A new tap set up as this one (:meth:`sharing_key` equal), used by one layer only."""
        return FactorTap(self.spec, self.geometry, self.settings)

    def add_flags_recursive(self, **flags):
        """Ignore amp's precision flags (``to_float``): the tap casts to float32 itself, and a float16
        flag would make PYNATIVE mode compute the factors in float16."""
        flags = {key: value for key, value in flags.items() if key not in ("fp16", "fp32", "bf16")}
        return super().add_flags_recursive(**flags)

    def construct(self, s, x, flag, a_cov, g_cov):
        return s

    def _store_fused(self, kernels, x, dout, flag, a_cov, g_cov):
        """The fused ops' stores of both factors; returns ``dout`` ordered after them.

        A waits for dout, so a layer called twice keeps its first call's A (its backward runs last), as it
        keeps its G. (Not ordered through the flag, ops.depend(flag, written_g): a depend on a Parameter
        compiles slower and larger.)"""
        spec = self.spec
        written_a = spec.a_fused(kernels[0], a_cov, _kernel_input(ops.depend(x, dout)), flag, self.geometry,
                                 self.convention, self.batch_size, self.block_size)
        written_g = spec.g_fused(kernels[1], g_cov, _kernel_input(dout), flag, self.geometry, self.convention,
                                 self.batch_size, self.block_size)
        return ops.depend(ops.depend(dout, written_a), written_g)

    def _fused_pass(self, x, dout, flag, a_cov, g_cov):
        """Both factors by the fused ops; without a branch where :func:`_branch_free` allows (decided when the
        graph is compiled: the ops skip their work while the flag is False), else under ``if flag``."""
        kernels = self.kernels
        if _branch_free(x, dout):
            dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
        elif flag:
            dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
        return dout

    def _flagged_pass(self, x, dout, flag, a_cov, g_cov):
        """Both factors under ``if flag``: first the schedule guard (PYNATIVE), then the fused ops or the
        composite ones (stored where finite)."""
        kernels = self.kernels
        guard = self.schedule_guard
        if flag:
            if guard is not None:  # PYNATIVE: the optimizer would refuse the step only after the backward
                dout = ops.depend(dout, guard())
            if kernels is not None:  # one op per factor (each also reads the flag)
                dout = self._store_fused(kernels, x, dout, flag, a_cov, g_cov)
            else:
                spec, geometry, convention = self.spec, self.geometry, self.convention
                a_new = spec.a_value(x, geometry, convention, self.batch_size, self.block_size)
                a_new = keep_if(ops.isfinite(a_new).all(), a_new, a_cov)
                g_new = spec.g_value(dout, geometry, convention, self.batch_size, self.block_size)
                g_new = keep_if(ops.isfinite(g_new).all(), g_new, g_cov)
                dout = ops.depend(dout, ops.assign(a_cov, a_new))
                dout = ops.depend(dout, ops.assign(g_cov, g_new))
        return dout

    def bprop(self, s, x, flag, a_cov, g_cov, out, dout):
        dout = self.factor_pass(x, dout, flag, a_cov, g_cov)
        # under amp the custom bprop sees the un-cast input s: hand its gradient back in s's dtype
        return (ops.cast(dout, s.dtype), ops.zeros_like(x), ops.zeros_like(flag), ops.zeros_like(a_cov),
                ops.zeros_like(g_cov))
