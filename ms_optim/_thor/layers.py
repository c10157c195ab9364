"""THOR layers: ``nn.Dense``/``nn.Conv2d``/``nn.Embedding`` that also collect their Kronecker factors.

State and forward only: the factor math is in ``factors.py``, the tap in ``taps.py``, the conversion in ``convert.py``.

Every layer here computes exactly the output of the plain MindSpore layer built with the same
arguments (same Parameters: ``weight``/``bias``/``embedding_table``, same ops), and in addition owns
three non-trainable Parameters:

* ``matrix_a_cov`` / ``matrix_g_cov`` (float32): the factors A and G of the last THOR step (G carries
  the square of that backward pass's loss scale), whole or as diagonal blocks (``ThorLayer``);
* ``thor_flag`` (bool scalar): while True *and* the cell is in training mode (``cell.training``,
  True from construction for THOR layers), the backward pass computes A and G (see
  ``ms_optim._thor`` for who writes the flag). Otherwise no factor work is done.

After a graph was compiled, write ``thor_flag`` or the factors with ``ops.assign`` (MindSpore 2.10
graphs do not see ``Parameter.set_data`` on Parameters they write). Not converted: grouped or
depthwise convolutions and ``data_format='NHWC'``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._bridge import prime_numpy_bridge
from ms_optim._thor import layer_args
from ms_optim._thor.factors import stored_shape
from ms_optim._thor.taps import ConvTap, DenseTap, EmbeddingTap
from ms_optim._validation import describe

__all__ = ["ThorLayer", "DenseThor", "Conv2dThor", "EmbeddingThor", "DEFAULT_BLOCK_SIZE"]

#: Factor block width of a THOR layer until ``thor()`` sets its own (``thor``'s default ``block_size``).
DEFAULT_BLOCK_SIZE = 128


class ThorLayer(nn.Cell):
    """Base class of the THOR layers: owns the factors ``matrix_a_cov``, ``matrix_g_cov`` and ``thor_flag``.

    What the optimizer may rely on:

    * ``kind``: ``"dense"``, ``"conv"`` or ``"embedding"`` (class attribute); ``a_dim`` / ``g_dim``: the sizes of A, G;
    * ``weight_param()``: the Parameter whose gradient is preconditioned (``weight`` or ``embedding_table``; conv
      weights are ``(C_out, C_in, kh, kw)``, A's index is ``c*kh*kw + i*kw + j``, i.e. ``weight.reshape(C_out, -1)``);
    * ``factor_block_size``: the block width the factors are stored in (None: whole matrices); ``thor()`` sets it
      to its ``block_size`` (None for ``inverse="full"``); default 128;
    * ``matrix_a_cov``: float32 Parameter, ``stored_shape(a_dim, factor_block_size)`` for dense and conv
      (``(a_dim, a_dim)`` if ``a_dim <= factor_block_size``, else the ``(nblocks, bs, bs)`` diagonal blocks, the
      last zero-padded), ``(a_dim,)`` for embedding (the diagonal of A); zeros until the first THOR step;
    * ``matrix_g_cov``: float32 Parameter, ``stored_shape(g_dim, factor_block_size)``; zeros until the first THOR
      step; ``loss_scale**2`` times the formula (see ``ms_optim._thor.factors``; both factors in the normalisation
      of the tap's convention, KFC unless ``thor(..., factor_convention=...)`` set one);
    * ``thor_flag``: bool scalar Parameter, initially True (step 0 is a THOR step).

    Both factors are written during the *backward* pass of a training step whose ``thor_flag`` is
    True (so they are final once the gradients exist, before the optimizer runs); a layer used
    several times in one step keeps the factors of its first call (the last one the backward pass
    reaches). ``supports(cell)`` says whether this class can represent a plain layer (structure only;
    whether a cell IS converted is decided by ``convert.thor_class_for``); ``from_cell(cell)`` builds
    the layer from it, *reusing* its Parameter objects.
    """

    kind: str = ""
    _plain_type: type = nn.Cell

    def _init_thor_state(self, a_shape: Tuple[int, ...], g_dim: int, name_prefix: str, tap: nn.Cell) -> None:
        """Create the factor Parameters (zeros, in blocks of ``DEFAULT_BLOCK_SIZE``), the flag (True), the tap."""
        prime_numpy_bridge()
        self.a_dim = int(a_shape[0])
        self.g_dim = int(g_dim)
        self.a_is_diagonal = len(a_shape) == 1
        self.factor_tap = tap
        self.factor_block_size = DEFAULT_BLOCK_SIZE
        tap.block_size = DEFAULT_BLOCK_SIZE
        self._zero_factors(name_prefix + "matrix_a_cov", name_prefix + "matrix_g_cov")
        self.thor_flag = Parameter(Tensor(np.array(True)), name=name_prefix + "thor_flag", requires_grad=False)
        # THOR layers start in training mode (a plain Cell starts in inference mode), so a bare
        # TrainOneStepCell that never calls set_train() still collects factors instead of silently
        # preconditioning with damping alone; set_train(False) (Model.eval does) turns the tap off.
        self.set_train(True)

    def _zero_factors(self, a_name: str, g_name: str) -> None:
        """New ``matrix_a_cov``/``matrix_g_cov`` Parameters of zeros in the shapes ``factor_block_size`` gives."""
        a_shape = (self.a_dim,) if self.a_is_diagonal else stored_shape(self.a_dim, self.factor_block_size)
        self.matrix_a_cov = Parameter(Tensor(np.zeros(a_shape, np.float32)), name=a_name, requires_grad=False)
        self.matrix_g_cov = Parameter(Tensor(np.zeros(stored_shape(self.g_dim, self.factor_block_size), np.float32)),
                                      name=g_name, requires_grad=False)

    def set_factor_block_size(self, block_size: Optional[int]) -> None:
        """Store (and compute) the factors in diagonal blocks of width ``block_size`` (None: whole).

        ``thor()`` calls it (``inverse="full"``: None) before anything is compiled. A change replaces
        ``matrix_a_cov``/``matrix_g_cov`` by zeros of the new shape, same names.
        """
        block_size = None if block_size is None else int(block_size)
        if block_size == self.factor_block_size:
            return
        self.factor_block_size = block_size
        self.own_factor_tap().block_size = block_size
        self._zero_factors(self.matrix_a_cov.name, self.matrix_g_cov.name)

    def own_factor_tap(self) -> nn.Cell:
        """``factor_tap``, first copied if ``thor()`` shares it with other layers (``taps.share_factor_taps``),
        so that a setting (block width, convention, schedule guard) changes this layer's tap only."""
        if self.factor_tap.shared:
            self.factor_tap = self.factor_tap.clone()
        return self.factor_tap

    def _tap(self, s, x):
        """In training mode, route ``s`` through the factor tap (dtype of ``s`` kept under amp)."""
        return ops.cast(self.factor_tap(s, ops.stop_gradient(x), self.thor_flag, self.matrix_a_cov, self.matrix_g_cov),
                        s.dtype)

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
        """Whether this class can represent ``cell`` (its exact plain type; see the subclasses). Whether a
        cell IS converted also depends on its weight's ``requires_grad``: ``convert.thor_class_for``."""
        return type(cell) is cls._plain_type  # pylint: disable=unidiomatic-typecheck

    @classmethod
    def from_cell(cls, cell: nn.Cell, name_prefix: Optional[str] = None) -> "ThorLayer":
        """Build the THOR layer from a plain layer, reusing its Parameter objects.

        The new Parameters are named ``name_prefix + "matrix_a_cov"`` (and ``matrix_g_cov``,
        ``thor_flag``); by default the prefix is the weight's name up to its last dot
        (``"net.fc1.weight"`` gives ``"net.fc1."``).

        Raises:
            TypeError: if ``cell`` is not a layer ``supports`` accepts.
        """
        if not cls.supports(cell):
            raise TypeError(f"For '{cls.__name__}.from_cell', the argument 'cell' must be a "
                            f"{cls._plain_type.__name__} that {cls.__name__} supports, but got {describe(cell)}.")
        layer = cls.__new__(cls)
        nn.Cell.__init__(layer)
        if name_prefix is None:
            name = cls._plain_weight(cell).name
            name_prefix = name[:name.rfind(".") + 1]
        layer._adopt(cell, name_prefix)  # pylint: disable=protected-access
        return layer

    @staticmethod
    def _plain_weight(cell: nn.Cell) -> Parameter:
        return cell.weight

    def _adopt(self, cell: nn.Cell, name_prefix: str) -> None:
        raise NotImplementedError

    def weight_param(self) -> Parameter:
        """The Parameter whose gradient THOR preconditions."""
        return self.weight


class DenseThor(ThorLayer):
    r"""``nn.Dense`` that also collects THOR's factors.

    ``outputs = activation(inputs @ weight^T + bias)``, exactly as ``nn.Dense`` (inputs with more than
    two dimensions are flattened to rows of ``in_channels`` and the output is reshaped back).

    Factors (N = number of input rows, a the rows, d = dL/ds the gradient of the pre-activation
    ``s = a @ weight^T + bias``): ``A = a^T a / N`` (in x in) and ``G = N * d^T d`` (out x out),
    float32, computed only while ``thor_flag`` is True in training mode. See ``ms_optim._thor.factors``.

    Args:
        in_channels (int): input features.
        out_channels (int): output features.
        weight_init (Union[Tensor, str, Initializer, numbers.Number]): weight initializer. Default: 'normal'.
        bias_init (Union[Tensor, str, Initializer, numbers.Number]): bias initializer. Default: 'zeros'.
        has_bias (bool): add a bias. Default: True.
        activation (Union[str, Cell, Primitive, None]): applied after the bias. Default: None.

    Raises:
        TypeError, ValueError: as ``nn.Dense`` (non-positive channels, non-bool has_bias, initializer
            shape mismatch, unknown activation).
        ValueError: if a channel count does not fit int32, or ``weight_init``/``bias_init`` is a NaN or
            infinite number (``ms_optim._thor.layer_args``).
    """

    kind = "dense"
    _plain_type = nn.Dense

    def __init__(self, in_channels, out_channels, weight_init='normal', bias_init='zeros', has_bias=True,
                 activation=None):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            layer_args.check_int32("DenseThor", name, value)
        layer_args.check_init_number("DenseThor", "weight_init", weight_init)
        layer_args.check_init_number("DenseThor", "bias_init", bias_init)
        plain = nn.Dense(in_channels, out_channels, weight_init=weight_init, bias_init=bias_init,
                         has_bias=has_bias, activation=activation)
        self._adopt(plain, "")

    def _adopt(self, cell: nn.Cell, name_prefix: str) -> None:
        self.in_channels = cell.in_channels
        self.out_channels = cell.out_channels
        self.has_bias = cell.has_bias
        self._adopt_param("weight", cell.weight)
        self._adopt_param("bias", cell.bias if cell.has_bias else None)
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.BiasAdd()
        self.activation = cell.activation
        self.activation_flag = cell.activation_flag
        self._init_thor_state((self.in_channels, self.in_channels), self.out_channels, name_prefix, DenseTap())

    def construct(self, x):
        x_shape = x.shape
        if len(x_shape) != 2:
            x = ops.reshape(x, (-1, x_shape[-1]))
        s = self.matmul(x, self.weight)
        if self.has_bias:
            s = self.bias_add(s, self.bias)
        if self.training:
            s = self._tap(s, x)
        if self.activation_flag:
            s = self.activation(s)
        if len(x_shape) != 2:
            s = ops.reshape(s, x_shape[:-1] + (s.shape[-1],))
        return s

    def extend_repr(self):
        s = f'input_channels={self.in_channels}, output_channels={self.out_channels}'
        if self.has_bias:
            s += f', has_bias={self.has_bias}'
        if self.activation_flag:
            s += f', activation={self.activation}'
        return s


class Conv2dThor(ThorLayer):
    r"""``nn.Conv2d`` (NCHW, group 1) that also collects THOR's factors.

    The output is exactly ``nn.Conv2d``'s with the same arguments: stride, pad_mode ``"same"``/
    ``"valid"``/``"pad"``, padding (int or ``(top, bottom, left, right)``), dilation, non-square kernels
    and bias are all honoured, in the forward pass and in the factors.

    Factors (B = batch, T = H_out*W_out, p the C_in*kh*kw patches, d = dL/ds at each output position):
    ``A = sum p p^T / (B*T)`` and ``G = B * sum d d^T`` (KFC normalisation), float32, computed only
    while ``thor_flag`` is True in training mode. See ``ms_optim._thor.factors``.

    Args: as ``nn.Conv2d`` (``kernel_size``, ``stride``, ``dilation``: int or 2-tuple; ``padding``: int
    or 4-tuple; defaults ``weight_init='normal'``, ``bias_init='zeros'``, ``has_bias=False``).

    Raises:
        TypeError, ValueError: as ``nn.Conv2d`` for bad arguments.
        TypeError: if ``kernel_size``/``stride``/``dilation`` is not an int or a tuple of ints.
        ValueError: if a size does not fit int32, or ``weight_init``/``bias_init`` is a NaN or infinite
            number (``ms_optim._thor.layer_args``).
        ValueError: if ``group`` is not 1 (grouped and depthwise convolutions have no THOR factors
            here; keep them as ``nn.Conv2d``: the converter leaves them first-order).
    """

    kind = "conv"
    _plain_type = nn.Conv2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode='same', padding=0, dilation=1,
                 group=1, has_bias=False, weight_init='normal', bias_init='zeros'):
        super().__init__()
        for name, value in (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)):
            layer_args.check_int_or_tuple("Conv2dThor", name, value)
        layer_args.check_int("Conv2dThor", "in_channels", in_channels)
        layer_args.check_int("Conv2dThor", "out_channels", out_channels)
        for name, value in (("padding", padding), ("group", group)):
            layer_args.check_int32("Conv2dThor", name, value)
        layer_args.check_init_number("Conv2dThor", "weight_init", weight_init)
        layer_args.check_init_number("Conv2dThor", "bias_init", bias_init)
        plain = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, pad_mode=pad_mode,
                          padding=padding, dilation=dilation, group=group, has_bias=has_bias,
                          weight_init=weight_init, bias_init=bias_init)
        if plain.group != 1:
            raise ValueError(f"For '{type(self).__name__}', the argument 'group' must be 1 (grouped and depthwise "
                             f"convolutions are not supported; use nn.Conv2d), but got {group!r}.")
        self._adopt(plain, "")

    @classmethod
    def supports(cls, cell: nn.Cell) -> bool:
        """Exactly ``nn.Conv2d`` with ``group == 1`` and ``data_format == 'NCHW'`` (see ``ThorLayer.supports``)."""
        return (type(cell) is nn.Conv2d and cell.group == 1  # pylint: disable=unidiomatic-typecheck
                and getattr(cell, "data_format", "NCHW") == "NCHW")

    def _adopt(self, cell: nn.Cell, name_prefix: str) -> None:
        self.in_channels = cell.in_channels
        self.out_channels = cell.out_channels
        self.kernel_size = tuple(cell.kernel_size)
        self.stride = tuple(cell.stride)
        self.pad_mode = cell.pad_mode
        self.padding = cell.padding
        self.dilation = tuple(cell.dilation)
        self.group = cell.group
        self.has_bias = cell.has_bias
        self.data_format = "NCHW"
        self.weight_init = getattr(cell, "weight_init", None)
        self.bias_init = getattr(cell, "bias_init", None)
        self._adopt_param("weight", cell.weight)
        self._adopt_param("bias", cell.bias if cell.has_bias else None)
        self.conv2d = cell.conv2d
        self.bias_add = cell.bias_add
        a_dim = self.in_channels * self.kernel_size[0] * self.kernel_size[1]
        tap = ConvTap(self.kernel_size, self.stride, self.dilation, self.pad_mode, self.padding)
        self._init_thor_state((a_dim, a_dim), self.out_channels, name_prefix, tap)

    def construct(self, x):
        s = self.conv2d(x, self.weight)
        if self.has_bias:
            s = self.bias_add(s, self.bias)
        if self.training:
            s = self._tap(s, x)
        return s

    def extend_repr(self):
        return (f'input_channels={self.in_channels}, output_channels={self.out_channels}, '
                f'kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, '
                f'padding={self.padding}, dilation={self.dilation}, group={self.group}, '
                f'has_bias={self.has_bias}')


class EmbeddingThor(ThorLayer):
    r"""``nn.Embedding`` that also collects THOR's factors.

    The output is exactly ``nn.Embedding``'s (``gather``, or ``one_hot @ table`` with ``use_one_hot``);
    ``padding_idx`` zeroes that row at initialisation, as ``nn.Embedding`` does.

    Factors (N = number of ids, all dimensions flattened; d = dL/d(output rows)): ``A = counts / N``,
    stored as the vocab_size vector of A's diagonal (ids outside ``[0, vocab_size)`` not counted,
    ``padding_idx`` counted like any id), and ``G = N * d^T d`` (embedding_size square), float32,
    computed only while ``thor_flag`` is True in training mode. See ``ms_optim._thor.factors``.

    Args:
        vocab_size (int), embedding_size (int), use_one_hot (bool), embedding_table (initializer),
        dtype (mindspore dtype of the one-hot values), padding_idx (int or None): as ``nn.Embedding``.

    Raises:
        TypeError, ValueError: as ``nn.Embedding`` for bad arguments.
        ValueError: if a size or ``padding_idx`` does not fit int32, or ``embedding_table`` is a NaN or
            infinite number (``ms_optim._thor.layer_args``).
    """

    kind = "embedding"
    _plain_type = nn.Embedding

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table='normal',
                 dtype=mstype.float32, padding_idx=None):
        super().__init__()
        layer_args.check_positive_int("EmbeddingThor", "vocab_size", vocab_size)
        layer_args.check_positive_int("EmbeddingThor", "embedding_size", embedding_size)
        layer_args.check_int32("EmbeddingThor", "padding_idx", padding_idx)
        layer_args.check_initializer("EmbeddingThor", "embedding_table", embedding_table)
        plain = nn.Embedding(vocab_size, embedding_size, use_one_hot=use_one_hot, embedding_table=embedding_table,
                             dtype=dtype, padding_idx=padding_idx)
        self._adopt(plain, "")

    @staticmethod
    def _plain_weight(cell: nn.Cell) -> Parameter:
        return cell.embedding_table

    def weight_param(self) -> Parameter:
        return self.embedding_table

    def _adopt(self, cell: nn.Cell, name_prefix: str) -> None:
        self.vocab_size = cell.vocab_size
        self.embedding_size = cell.embedding_size
        self.use_one_hot = cell.use_one_hot
        self.dtype = cell.dtype
        self.padding_idx = cell.padding_idx
        self._adopt_param("embedding_table", cell.embedding_table)
        self.on_value = Tensor(1.0, self.dtype)
        self.off_value = Tensor(0.0, self.dtype)
        self.one_hot = ops.OneHot()
        self.gather = ops.Gather()
        self.array_mul = ops.MatMul()
        self._init_thor_state((self.vocab_size,), self.embedding_size, name_prefix, EmbeddingTap(self.vocab_size))

    def construct(self, ids):
        out_shape = ids.shape + (self.embedding_size,)
        flat_ids = ops.reshape(ids, (-1,))
        if self.use_one_hot:
            one_hot_ids = self.one_hot(flat_ids, self.vocab_size, self.on_value, self.off_value)
            rows = self.array_mul(one_hot_ids, self.embedding_table)
        else:
            rows = self.gather(self.embedding_table, flat_ids, 0)
        if self.training:
            rows = self._tap(rows, flat_ids)
        return ops.reshape(rows, out_shape)

    def extend_repr(self):
        return (f'vocab_size={self.vocab_size}, embedding_size={self.embedding_size}, '
                f'use_one_hot={self.use_one_hot}, dtype={self.dtype}, padding_idx={self.padding_idx}')
