"""``ThorLayer``: the base class of the THOR layers (``layers.py``): the factor Parameters, the flag, the tap.

Generic over the layer kinds: each subclass has a ``spec`` (``kinds.py``) that gives its sizes, weight,
geometry and factor math, and is listed by ``kinds.register``; the subclass itself holds only the
plain layer's attributes and its forward pass. The contract with the optimizer is in the class docstring.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._bridge import prime_numpy_bridge
from ms_optim._thor.net import kinds
from ms_optim._thor.net.factors import stored_shape
from ms_optim._thor.net.taps import DEFAULT_SETTINGS, FactorTap, TapPool, TapSettings
from ms_optim._validation import describe

__all__ = ["ThorLayer", "DEFAULT_SETTINGS"]


class ThorLayer(nn.Cell):
    """Base class of the THOR layers: owns the factors ``matrix_a_cov``, ``matrix_g_cov`` and ``thor_flag``.

    What the optimizer may rely on:

    * ``spec``: the layer kind's spec (``kinds.KindSpec``: ``a_diagonal``, ``apply``, ...); ``kind``:
      its ``modes.Kind`` (``"dense"``, ``"conv"``, ``"conv1d"`` or ``"embedding"``); ``a_dim`` / ``g_dim``:
      the sizes of A, G;
    * ``weight_param()``: the Parameter whose gradient is preconditioned (``weight`` or ``embedding_table``;
      conv weights are ``(C_out, C_in, kh, kw)``, A's index is ``c*kh*kw + i*kw + j``, i.e.
      ``weight.reshape(C_out, -1)``);
    * ``factor_block_size``: the block width the factors are stored in (None: whole matrices), the
      settings' ``block_size`` (``thor()``: its ``block_size``, None for ``inverse="full"``); default 128;
    * ``matrix_a_cov``: float32 Parameter, ``stored_shape(a_dim, factor_block_size)`` (``(a_dim, a_dim)``
      if ``a_dim <= factor_block_size``, else the ``(nblocks, bs, bs)`` diagonal blocks, the last
      zero-padded), or ``(a_dim,)`` (the diagonal of A) when ``spec.a_diagonal``; zeros until the first
      THOR step;
    * ``matrix_g_cov``: float32 Parameter, ``stored_shape(g_dim, factor_block_size)``; zeros until the
      first THOR step; ``loss_scale**2`` times the formula (see ``ms_optim._thor.net.factors``; both factors
      in the normalisation of the tap's convention);
    * ``thor_flag``: bool scalar Parameter, initially True (step 0 is a THOR step);
    * ``factor_tap``: its ``taps.FactorTap`` (possibly shared with layers of the same geometry).

    Both factors are written during the *backward* pass of a training step whose ``thor_flag`` is
    True (so they are final once the gradients exist, before the optimizer runs); a layer used
    several times in one step keeps the factors of its first call (the last one the backward pass
    reaches). ``supports(cell)`` says whether this class can represent a plain layer (structure only;
    whether a cell IS converted is decided by ``convert.thor_class_for``); ``from_cell(cell)`` builds
    the layer from it, *reusing* its Parameter objects.
    """

    spec: kinds.KindSpec = None  # each registered class's (kinds.register)
    kind: str = ""  # spec.kind, set by kinds.register

    def _init_thor_state(self, name_prefix: str, settings: TapSettings, taps: Optional[TapPool]) -> None:
        """Create the factor Parameters (zeros, in the settings' blocks), the flag (True) and the tap."""
        prime_numpy_bridge()
        self.a_dim, self.g_dim = self.spec.dims(self)
        self.factor_block_size = None if settings.block_size is None else int(settings.block_size)
        self._zero_factors(name_prefix + "matrix_a_cov", name_prefix + "matrix_g_cov")
        self.thor_flag = Parameter(Tensor(np.array(True)), name=name_prefix + "thor_flag",
                                   requires_grad=False)
        self.factor_tap = self._make_tap(settings, taps)
        # THOR layers start in training mode (a plain Cell starts in inference mode), so a bare
        # TrainOneStepCell that never calls set_train() still collects factors instead of silently
        # preconditioning with damping alone; set_train(False) (Model.eval does) turns the tap off.
        self.set_train(True)

    def _make_tap(self, settings: TapSettings, taps: Optional[TapPool]) -> FactorTap:
        """The tap for ``settings``: from ``taps`` (shared with layers of equal geometry), else its own."""
        geometry = self.spec.geometry(self)
        if taps is None:
            return FactorTap(self.spec, geometry, settings)
        return taps.tap(self.spec, geometry, settings)

    def _zero_factors(self, a_name: str, g_name: str) -> None:
        """New ``matrix_a_cov``/``matrix_g_cov`` Parameters: zeros in the shapes of ``factor_block_size``."""
        a_shape = self.spec.a_shape(self.a_dim, self.factor_block_size)
        g_shape = stored_shape(self.g_dim, self.factor_block_size)
        self.matrix_a_cov = Parameter(Tensor(np.zeros(a_shape, np.float32)), name=a_name, requires_grad=False)
        self.matrix_g_cov = Parameter(Tensor(np.zeros(g_shape, np.float32)), name=g_name, requires_grad=False)

    def _settle(self, settings: TapSettings, taps: Optional[TapPool] = None) -> None:
        """Give a THOR layer made earlier the settings of a new conversion (``convert.convert_net``): a tap
        for them and, if the block width changes, zero factors of the new shape (same names)."""
        block_size = None if settings.block_size is None else int(settings.block_size)
        if block_size != self.factor_block_size:
            self.factor_block_size = block_size
            self._zero_factors(self.matrix_a_cov.name, self.matrix_g_cov.name)
        self.factor_tap = self._make_tap(settings, taps)

    def set_factor_block_size(self, block_size: Optional[int]) -> None:
        """Store (and compute) the factors in diagonal blocks of width ``block_size`` (None: whole).

        For a layer used on its own; ``thor()`` builds its layers with its width. A change gives the layer
        a tap of its own with that width (the other settings kept) and replaces ``matrix_a_cov``/
        ``matrix_g_cov`` by zeros of the new shape, same names.
        """
        block_size = None if block_size is None else int(block_size)
        if block_size != self.factor_block_size:
            self._settle(self.factor_tap.settings._replace(block_size=block_size))

    def _tap(self, s, x):
        """In training mode, route ``s`` through the factor tap (dtype of ``s`` kept under amp)."""
        s_tapped = self.factor_tap(s, ops.stop_gradient(x), self.thor_flag, self.matrix_a_cov,
                                   self.matrix_g_cov)
        return ops.cast(s_tapped, s.dtype)

    def _adopt_param(self, attr: str, param: Optional[Parameter]) -> None:
        """Put the plain layer's Parameter object itself (name, value, dtype kept) under ``attr``."""
        if attr in self._params:
            del self._params[attr]
        self.__dict__.pop(attr, None)
        if param is None:
            object.__setattr__(self, attr, None)  # as nn.Dense/nn.Conv2d hold "no bias"
        else:
            self.insert_param_to_cell(attr, param)

    @classmethod
    def supports(cls, cell: nn.Cell) -> bool:
        """Whether this class can represent ``cell`` (``spec.supports``: its exact plain type, and for
        convolutions group 1 and NCHW). Whether a cell IS converted also depends on its weight's
        ``requires_grad`` and the convention: ``convert.thor_class_for``."""
        return cls.spec.supports(cell)

    @classmethod
    def from_cell(cls, cell: nn.Cell, name_prefix: Optional[str] = None,
                  settings: TapSettings = DEFAULT_SETTINGS, taps: Optional[TapPool] = None) -> "ThorLayer":
        """Build the THOR layer from a plain layer, reusing its Parameter objects.

        The new Parameters are named ``name_prefix + "matrix_a_cov"`` (and ``matrix_g_cov``,
        ``thor_flag``); by default the prefix is the weight's name up to its last dot
        (``"net.fc1.weight"`` gives ``"net.fc1."``). ``settings`` (default: kfc, 32, blocks of 128, no
        guard) are final; ``taps`` (a ``TapPool``) shares the tap with the other layers of a conversion.

        Raises:
            TypeError: if ``cell`` is not a layer ``supports`` accepts.
        """
        if not cls.supports(cell):
            raise TypeError(f"For '{cls.__name__}.from_cell', the argument 'cell' must be a "
                            f"{cls.spec.plain_type.__name__} that {cls.__name__} supports, "
                            f"but got {describe(cell)}.")
        layer = cls.__new__(cls)
        nn.Cell.__init__(layer)
        if name_prefix is None:
            name = cls.spec.weight(cell).name
            name_prefix = name[:name.rfind(".") + 1]
        layer._adopt(cell)  # pylint: disable=protected-access
        layer._init_thor_state(name_prefix, settings, taps)  # pylint: disable=protected-access
        return layer

    def _adopt(self, cell: nn.Cell) -> None:
        """Take over the plain layer's attributes, Parameters and ops."""
        raise NotImplementedError

    def weight_param(self) -> Parameter:
        """The Parameter whose gradient THOR preconditions."""
        return self.spec.weight(self)
