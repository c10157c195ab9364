"""THOR layers: ``nn.Dense``/``nn.Conv2d``/``nn.Conv1d``/``nn.Embedding`` that also collect their factors.

State and forward only: what THOR knows about each kind (sizes, factor math, multipliers, curvature) is
its spec in ``kinds.py``, the backward-pass tap is ``taps.FactorTap``, the conversion ``convert.py``.

Every layer here computes exactly the output of the plain MindSpore layer built with the same
arguments (same Parameters: ``weight``/``bias``/``embedding_table``, same ops), and in addition owns
three non-trainable Parameters:

* ``matrix_a_cov`` / ``matrix_g_cov`` (float32): the factors A and G of the last THOR step (G carries
  the square of that backward pass's loss scale), whole or as diagonal blocks (``ThorLayer``);
* ``thor_flag`` (bool scalar): while True *and* the cell is in training mode (``cell.training``,
  True from construction for THOR layers), the backward pass computes A and G (see
  ``ms_optim._thor`` for who writes the flag). Otherwise no factor work is done.

A layer is complete when it is made: its factor Parameters have the shapes of its block width and its
tap has its settings (``taps.TapSettings``: convention, ``batch_size``, block width, schedule guard).
The public constructors and ``ConvertNetUtils`` use the default settings (``"kfc"``, 32, blocks of
128, no guard); ``thor()`` converts with its own (``convert.convert_net``).

After a graph was compiled, write ``thor_flag`` or the factors with ``ops.assign`` (MindSpore 2.10
graphs do not see ``Parameter.set_data`` on Parameters they write). Not converted: grouped or
depthwise convolutions and ``data_format='NHWC'``.
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

    ``outputs = activation(inputs @ weight^T + bias)``, exactly as ``nn.Dense`` (inputs with more than
    two dimensions are flattened to rows of ``in_channels`` and the output is reshaped back).

    Factors (N = number of input rows, a the rows, d = dL/ds the gradient of the pre-activation
    ``s = a @ weight^T + bias``): ``A = a^T a / N`` (in x in) and ``G = N * d^T d`` (out x out),
    float32, computed only while ``thor_flag`` is True in training mode. See ``ms_optim._thor.net.factors``.

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
            infinite number (``ms_optim._thor.net.layer_args``).
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

    The output is exactly ``nn.Conv2d``'s with the same arguments: stride, pad_mode ``"same"``/
    ``"valid"``/``"pad"``, padding (int or ``(top, bottom, left, right)``), dilation, non-square kernels
    and bias are all honoured, in the forward pass and in the factors.

    Factors (B = batch, T = H_out*W_out, p the C_in*kh*kw patches, d = dL/ds at each output position):
    ``A = sum p p^T / (B*T)`` and ``G = B * sum d d^T`` (KFC normalisation), float32, computed only
    while ``thor_flag`` is True in training mode. See ``ms_optim._thor.net.factors``.

    Args: as ``nn.Conv2d`` (``kernel_size``, ``stride``, ``dilation``: int or 2-tuple; ``padding``: int
    or 4-tuple; defaults ``weight_init='normal'``, ``bias_init='zeros'``, ``has_bias=False``).

    Raises:
        TypeError, ValueError: as ``nn.Conv2d`` for bad arguments.
        TypeError: if ``kernel_size``/``stride``/``dilation`` is not an int or a tuple of ints.
        ValueError: if a size does not fit int32, or ``weight_init``/``bias_init`` is a NaN or infinite
            number (``ms_optim._thor.net.layer_args``).
        ValueError: if ``group`` is not 1 (grouped and depthwise convolutions have no THOR factors
            here; keep them as ``nn.Conv2d``: the converter leaves them first-order).
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
    r"""``nn.Conv1d`` (group 1) that also collects THOR's factors (MindSpore's THOR has no Conv1d).

    The output is exactly ``nn.Conv1d``'s with the same arguments. For an input ``x`` of shape
    ``(B, C_in, L)``, with ``x_pad`` the input padded as ``pad_mode`` says (``"same"``: total padding
    ``max((L_out - 1) * stride + (k - 1) * dilation + 1 - L, 0)``, the smaller half first; ``"valid"``:
    none; ``"pad"``: ``padding`` on both sides) and ``L_out`` the output length::

        out[b, o, l] = bias[o] + sum_{c, j} weight[o, c, 0, j] * x_pad[b, c, l * stride + j * dilation]

    The weight is ``(C_out, C_in, 1, k)``, as ``nn.Conv1d`` keeps it (it runs ``Conv2D`` on the input with a
    height-1 axis, and so does this layer, whose tap sees that 4-D convolution).

    Factors (B = batch, T = L_out, p the ``C_in*k`` patches
    ``p[c*k + j] = x_pad[b, c, l*stride + j*dilation]``, d = dL/ds at each output position)::

        A = sum_{b,l} p p^T / (B*T)       (C_in*k square)
        G = B * sum_{b,l} d d^T           (C_out square)

    those of ``Conv2dThor`` with a ``(1, k)`` kernel (KFC normalisation), float32, computed only while
    ``thor_flag`` is True in training mode. The optimizer preconditions the weight's gradient as the
    ``(C_out, C_in*k)`` matrix ``dW``: ``G^-1 dW A^-1`` (then weight decay, clipping and momentum, as every
    THOR layer). ``ConvertNetUtils`` and ``thor()`` convert ``nn.Conv1d`` under ``factor_convention="kfc"``
    (the default on CPU) and leave it a plain, first-order layer under ``"gpu"``/``"ascend"``, whose
    MindSpore THOR has no Conv1d to match; a ``Conv1dThor`` placed in a net by hand is preconditioned under
    every convention, with that convention's conv multipliers (``kinds.conv_scales``, T = L_out).

    Args: as ``nn.Conv1d`` (``kernel_size``, ``stride``, ``padding``, ``dilation``: int; defaults
    ``weight_init=None`` (HeUniform), ``bias_init=None``, ``has_bias=False``, ``dtype=mstype.float32``).

    Raises:
        TypeError, ValueError: as ``nn.Conv1d`` for bad arguments.
        TypeError: if ``in_channels`` or ``out_channels`` is not an int.
        ValueError: if a size does not fit int32, or ``weight_init``/``bias_init`` is a NaN or infinite
            number (``ms_optim._thor.net.layer_args``).
        ValueError: if ``group`` is not 1 (keep grouped convolutions as ``nn.Conv1d``).

    Examples:
        >>> import numpy as np
        >>> from mindspore import Tensor
        >>> from ms_optim.nn import Conv1dThor
        >>> layer = Conv1dThor(2, 3, 3, pad_mode="pad", padding=1, has_bias=True)
        >>> layer(Tensor(np.ones((4, 2, 8), np.float32))).shape
        (4, 3, 8)
        >>> layer.weight.shape, layer.matrix_a_cov.shape, layer.matrix_g_cov.shape
        ((3, 2, 1, 3), (6, 6), (3, 3))
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

    The output is exactly ``nn.Embedding``'s (``gather``, or ``one_hot @ table`` with ``use_one_hot``);
    ``padding_idx`` zeroes that row at initialisation, as ``nn.Embedding`` does.

    Factors (N = number of ids, all dimensions flattened; d = dL/d(output rows)): ``A = counts / N``,
    stored as the vocab_size vector of A's diagonal (ids outside ``[0, vocab_size)`` not counted,
    ``padding_idx`` counted like any id), and ``G = N * d^T d`` (embedding_size square), float32,
    computed only while ``thor_flag`` is True in training mode. See ``ms_optim._thor.net.factors``.

    Args:
        vocab_size (int), embedding_size (int), use_one_hot (bool), embedding_table (initializer),
        dtype (mindspore dtype of the one-hot values), padding_idx (int or None): as ``nn.Embedding``.

    Raises:
        TypeError, ValueError: as ``nn.Embedding`` for bad arguments.
        ValueError: if a size or ``padding_idx`` does not fit int32, or ``embedding_table`` is a NaN or
            infinite number (``ms_optim._thor.net.layer_args``).
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
