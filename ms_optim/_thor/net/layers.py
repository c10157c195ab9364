"""THOR layers: ``nn.Dense``/``nn.Conv2d``/``nn.Conv1d``/``nn.Embedding`` that also collect their factors.

State and forward only: what THOR knows about each kind is its spec in ``kinds.py``, the backward-pass tap
is ``taps.FactorTap``, the conversion ``convert.py``. The public constructors use the default tap settings
(``"kfc"``, batch size 32, blocks of 128, no schedule guard); ``thor()`` converts with its own.
"""
from __future__ import annotations

import mindspore.common.dtype as mstype
from mindspore import Tensor, nn, ops

from ms_optim._thor.net import kinds, layer_args
from ms_optim._thor.net.layer_base import DEFAULT_SETTINGS, ThorLayer
from ms_optim._thor.net.taps import DEFAULT_BLOCK_SIZE

__all__ = ["ThorLayer", "DenseThor", "Conv2dThor", "Conv1dThor", "EmbeddingThor", "DEFAULT_BLOCK_SIZE"]


@kinds.register
class DenseThor(ThorLayer):
    r"""``nn.Dense`` that also collects THOR's factors.

    :math:`\text{outputs} = \text{activation}(\text{inputs}\, W^{\top} + \text{bias})`, exactly as
    ``nn.Dense`` (inputs of more dimensions as rows of ``in_channels``). With :math:`a_n` the :math:`N` input
    rows and :math:`D_n` the rows of :math:`\partial L / \partial s`, the gradient of the pre-activation
    :math:`s = a W^{\top} + \text{bias}`, the factors are (KFC normalisation; ``thor()``'s
    ``factor_convention`` rescales them, :ref:`thor-conventions`):

    .. math::
        A = \frac{1}{N} \sum_n a_n a_n^{\top} \quad (\text{in} \times \text{in}), \qquad
        G = N \sum_n D_n D_n^{\top} \quad (\text{out} \times \text{out})

    It adds ``matrix_a_cov``, ``matrix_g_cov`` (float32, the last THOR step's factors as diagonal blocks of
    128) and ``thor_flag`` (set by the optimizer: collect them in the next backward pass, in training mode).

    Args:
        in_channels (int): input features.
        out_channels (int): output features.
        weight_init (Union[Tensor, str, Initializer, numbers.Number]): weight initializer. Default: 'normal'.
        bias_init (Union[Tensor, str, Initializer, numbers.Number]): bias initializer. Default: 'zeros'.
        has_bias (bool): add a bias. Default: True.
        activation (Union[str, Cell, Primitive, None]): applied after the bias. Default: None.

    Inputs:
        x (Tensor): of shape :math:`(*, \text{in_channels})`.

    Outputs:
        Tensor: of shape :math:`(*, \text{out_channels})`.

    Raises:
        TypeError: as ``nn.Dense`` for bad arguments.
        ValueError: as ``nn.Dense``; if a channel count does not fit int32, or an initializer is a NaN or
            infinite number.

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim.nn import DenseThor
        >>> layer = DenseThor(3, 2)
        >>> layer(ms.ops.ones((4, 3))).shape, layer.matrix_a_cov.shape, layer.matrix_g_cov.shape
        ((4, 2), (3, 3), (2, 2))
    """

    spec = kinds.DENSE

    def __init__(self, in_channels, out_channels, weight_init='normal', bias_init='zeros', has_bias=True,
                 activation=None):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            layer_args.check_int32("DenseThor", name, value)
        layer_args.check_init_number("DenseThor", "weight_init", weight_init)
        layer_args.check_init_number("DenseThor", "bias_init", bias_init)
        plain = nn.Dense(in_channels, out_channels, weight_init=weight_init, bias_init=bias_init,
                         has_bias=has_bias, activation=activation)
        self._adopt(plain)
        self._init_thor_state("", DEFAULT_SETTINGS, None)

    def _adopt(self, cell: nn.Cell) -> None:
        self.in_channels = cell.in_channels
        self.out_channels = cell.out_channels
        self.has_bias = cell.has_bias
        self._adopt_param("weight", cell.weight)
        self._adopt_param("bias", cell.bias if cell.has_bias else None)
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.BiasAdd()
        self.activation = cell.activation
        self.activation_flag = cell.activation_flag

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


class _ConvThor(ThorLayer):
    """What ``Conv2dThor`` and ``Conv1dThor`` share: the plain layer's attributes (the 2-D ones ``nn.Conv1d``
    keeps too) and the refusal of grouped convolutions."""

    def _check_group(self, plain: nn.Cell, group) -> None:
        if plain.group != 1:
            raise ValueError(f"For '{type(self).__name__}', the argument 'group' must be 1 (grouped and "
                             f"depthwise convolutions are not supported; use {type(plain).__name__}), "
                             f"but got {group!r}.")

    def _adopt(self, cell: nn.Cell) -> None:
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

    def extend_repr(self):
        return (f'input_channels={self.in_channels}, output_channels={self.out_channels}, '
                f'kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, '
                f'padding={self.padding}, dilation={self.dilation}, group={self.group}, '
                f'has_bias={self.has_bias}')


@kinds.register
class Conv2dThor(_ConvThor):
    r"""``nn.Conv2d`` (NCHW, group 1) that also collects THOR's factors.

    The output is exactly ``nn.Conv2d``'s with the same arguments (stride, ``pad_mode``, padding, dilation,
    non-square kernels and bias, in the forward pass and in the factors). With batch :math:`B`,
    :math:`T = H_\text{out} W_\text{out}` output positions, :math:`p_{b,t}` the :math:`C_\text{in} k_h k_w`
    input patches and :math:`D_{b,t}` the gradient of the output at each position, the factors are (KFC
    normalisation; ``thor()``'s ``factor_convention`` rescales them, :ref:`thor-conventions`):

    .. math::
        A = \frac{1}{BT} \sum_{b,t} p_{b,t}\, p_{b,t}^{\top}, \qquad
        G = B \sum_{b,t} D_{b,t}\, D_{b,t}^{\top}

    It adds ``matrix_a_cov``, ``matrix_g_cov`` (float32, the last THOR step's factors as diagonal blocks of
    128) and ``thor_flag`` (set by the optimizer: collect them in the next backward pass, in training mode).

    Args:
        in_channels (int): input channels :math:`C_\text{in}`.
        out_channels (int): output channels :math:`C_\text{out}`.
        kernel_size (Union[int, tuple[int]]): the kernel's height and width.
        stride (Union[int, tuple[int]]): Default: 1.
        pad_mode (str): ``"same"``, ``"valid"`` or ``"pad"``. Default: ``"same"``.
        padding (Union[int, tuple[int]]): for ``"pad"``: an int or ``(top, bottom, left, right)``. Default: 0.
        dilation (Union[int, tuple[int]]): Default: 1.
        group (int): must be 1. Default: 1.
        has_bias (bool): add a bias. Default: False.
        weight_init (Union[Tensor, str, Initializer, numbers.Number]): Default: 'normal'.
        bias_init (Union[Tensor, str, Initializer, numbers.Number]): Default: 'zeros'.

    Inputs:
        x (Tensor): of shape :math:`(B, C_\text{in}, H_\text{in}, W_\text{in})`.

    Outputs:
        Tensor: of shape :math:`(B, C_\text{out}, H_\text{out}, W_\text{out})`.

    Raises:
        TypeError: as ``nn.Conv2d``; if ``kernel_size``/``stride``/``dilation`` is not an int or a tuple.
        ValueError: as ``nn.Conv2d``; if a size does not fit int32, or an initializer is a NaN or infinite
            number; if ``group`` is not 1 (the converter leaves grouped convolutions first-order).

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim.nn import Conv2dThor
        >>> layer = Conv2dThor(2, 4, 3, pad_mode="pad", padding=1)
        >>> layer(ms.ops.ones((1, 2, 8, 8))).shape, layer.matrix_a_cov.shape, layer.matrix_g_cov.shape
        ((1, 4, 8, 8), (18, 18), (4, 4))
    """

    spec = kinds.CONV

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode='same', padding=0,
                 dilation=1, group=1, has_bias=False, weight_init='normal', bias_init='zeros'):
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
        self._check_group(plain, group)
        self._adopt(plain)
        self._init_thor_state("", DEFAULT_SETTINGS, None)

    def construct(self, x):
        s = self.conv2d(x, self.weight)
        if self.has_bias:
            s = self.bias_add(s, self.bias)
        if self.training:
            s = self._tap(s, x)
        return s


@kinds.register
class Conv1dThor(_ConvThor):
    r"""``nn.Conv1d`` (group 1) that also collects THOR's factors (ms_optim's own: MindSpore's THOR has none).

    The output is exactly ``nn.Conv1d``'s with the same arguments; the weight has the shape
    :math:`(C_\text{out}, C_\text{in}, 1, k)`, as ``nn.Conv1d`` keeps it (a 2-D convolution of the input
    with a height-1 axis, and so are the factors). With :math:`x_\text{pad}` the padded input,
    :math:`T = L_\text{out}`, the patches :math:`p_{b,l}[c k + j] = x_\text{pad}[b, c, l \cdot
    \text{stride} + j \cdot \text{dilation}]` and :math:`D_{b,l}` the gradient of the output at each
    position, the factors are those of :class:`Conv2dThor` with a :math:`(1, k)` kernel:

    .. math::
        A = \frac{1}{BT} \sum_{b,l} p_{b,l}\, p_{b,l}^{\top} \quad (C_\text{in} k \text{ square}), \qquad
        G = B \sum_{b,l} D_{b,l}\, D_{b,l}^{\top} \quad (C_\text{out} \text{ square})

    ``thor()`` and ``ConvertNetUtils`` convert ``nn.Conv1d`` under ``factor_convention="kfc"`` only; placed
    in a net by hand, ``Conv1dThor`` is preconditioned under every convention.

    It adds ``matrix_a_cov``, ``matrix_g_cov`` (float32, the last THOR step's factors as diagonal blocks of
    128) and ``thor_flag`` (set by the optimizer: collect them in the next backward pass, in training mode).

    Args:
        in_channels (int): input channels :math:`C_\text{in}`.
        out_channels (int): output channels :math:`C_\text{out}`.
        kernel_size (int): the kernel's width :math:`k`.
        stride (int): Default: 1.
        pad_mode (str): ``"same"``, ``"valid"`` or ``"pad"``. Default: ``"same"``.
        padding (int): with ``pad_mode="pad"``, on both sides. Default: 0.
        dilation (int): Default: 1.
        group (int): must be 1. Default: 1.
        has_bias (bool): add a bias. Default: False.
        weight_init (Union[Tensor, str, Initializer, numbers.Number]): Default: None (HeUniform).
        bias_init (Union[Tensor, str, Initializer, numbers.Number]): Default: None.
        dtype (mindspore.dtype): the Parameters' dtype. Default: ``mstype.float32``.

    Inputs:
        x (Tensor): of shape :math:`(B, C_\text{in}, L)`.

    Outputs:
        Tensor: of shape :math:`(B, C_\text{out}, L_\text{out})`.

    Raises:
        TypeError: as ``nn.Conv1d``; if ``in_channels`` or ``out_channels`` is not an int.
        ValueError: as ``nn.Conv1d``; if a size does not fit int32, or an initializer is a NaN or infinite
            number; if ``group`` is not 1 (keep grouped convolutions as ``nn.Conv1d``).

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim.nn import Conv1dThor
        >>> layer = Conv1dThor(2, 3, 3, pad_mode="pad", padding=1, has_bias=True)
        >>> layer(ms.ops.ones((4, 2, 8))).shape, layer.weight.shape, layer.matrix_a_cov.shape
        ((4, 3, 8), (3, 2, 1, 3), (6, 6))
    """

    spec = kinds.CONV1D

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode='same', padding=0,
                 dilation=1, group=1, has_bias=False, weight_init=None, bias_init=None, dtype=mstype.float32):
        super().__init__()
        layer_args.check_int("Conv1dThor", "in_channels", in_channels)
        layer_args.check_int("Conv1dThor", "out_channels", out_channels)
        for name, value in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding),
                            ("dilation", dilation), ("group", group)):
            layer_args.check_int32("Conv1dThor", name, value)
        layer_args.check_init_number("Conv1dThor", "weight_init", weight_init)
        layer_args.check_init_number("Conv1dThor", "bias_init", bias_init)
        plain = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, pad_mode=pad_mode,
                          padding=padding, dilation=dilation, group=group, has_bias=has_bias,
                          weight_init=weight_init, bias_init=bias_init, dtype=dtype)
        self._check_group(plain, group)
        self._adopt(plain)
        self._init_thor_state("", DEFAULT_SETTINGS, None)

    def _adopt(self, cell: nn.Cell) -> None:
        super()._adopt(cell)
        self.expand_dims = cell.expand_dims
        self.squeeze = cell.squeeze

    def construct(self, x):
        x = self.expand_dims(x, 2)
        s = self.conv2d(x, self.weight)
        if self.has_bias:
            s = self.bias_add(s, self.bias)
        if self.training:
            s = self._tap(s, x)
        return self.squeeze(s)


@kinds.register
class EmbeddingThor(ThorLayer):
    r"""``nn.Embedding`` that also collects THOR's factors.

    The output is exactly ``nn.Embedding``'s (a gather of the table's rows, or ``one_hot @ table`` with
    ``use_one_hot``); ``padding_idx`` zeroes that row at initialisation, as ``nn.Embedding`` does. With
    :math:`N` ids (all dimensions flattened), :math:`\mathrm{counts}_v` the occurrences of id :math:`v`
    (ids outside ``[0, vocab_size)`` not counted, ``padding_idx`` counted like any id) and :math:`D_n` the
    gradient of the :math:`n`-th output row, the factors are (KFC normalisation; ``thor()``'s
    ``factor_convention`` rescales them, :ref:`thor-conventions`):

    .. math::
        A = \frac{1}{N} \operatorname{diag}(\mathrm{counts}) \quad (\text{kept as its diagonal, a
            vector of vocab_size}), \qquad G = N \sum_n D_n D_n^{\top}

    It adds ``matrix_a_cov``, ``matrix_g_cov`` (float32, the last THOR step's factors as diagonal blocks of
    128) and ``thor_flag`` (set by the optimizer: collect them in the next backward pass, in training mode).

    Args:
        vocab_size (int): the number of ids.
        embedding_size (int): the width of a row.
        use_one_hot (bool): compute the rows as ``one_hot(ids) @ table``. Default: False.
        embedding_table (Union[Tensor, str, Initializer, numbers.Number]): the table's initializer.
            Default: 'normal'.
        dtype (mindspore.dtype): the dtype of the one-hot values. Default: ``mstype.float32``.
        padding_idx (int): the id whose row starts at zero, or None. Default: None.

    Inputs:
        ids (Tensor): int32 ids of any shape.

    Outputs:
        Tensor: of shape ``ids.shape + (embedding_size,)``.

    Raises:
        TypeError: as ``nn.Embedding`` for bad arguments.
        ValueError: as ``nn.Embedding``; if a size or ``padding_idx`` does not fit int32, or
            ``embedding_table`` is a NaN or infinite number.

    Examples:
        >>> import mindspore as ms
        >>> from ms_optim.nn import EmbeddingThor
        >>> layer = EmbeddingThor(10, 4)
        >>> layer(ms.Tensor([[1, 2, 3]], ms.int32)).shape, layer.matrix_a_cov.shape, layer.matrix_g_cov.shape
        ((1, 3, 4), (10,), (4, 4))
    """

    spec = kinds.EMBEDDING

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table='normal',
                 dtype=mstype.float32, padding_idx=None):
        super().__init__()
        layer_args.check_positive_int("EmbeddingThor", "vocab_size", vocab_size)
        layer_args.check_positive_int("EmbeddingThor", "embedding_size", embedding_size)
        layer_args.check_int32("EmbeddingThor", "padding_idx", padding_idx)
        layer_args.check_initializer("EmbeddingThor", "embedding_table", embedding_table)
        plain = nn.Embedding(vocab_size, embedding_size, use_one_hot=use_one_hot,
                             embedding_table=embedding_table, dtype=dtype, padding_idx=padding_idx)
        self._adopt(plain)
        self._init_thor_state("", DEFAULT_SETTINGS, None)

    def _adopt(self, cell: nn.Cell) -> None:
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
