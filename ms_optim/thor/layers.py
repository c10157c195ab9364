"""THOR layers: ``nn.Dense``/``nn.Conv2d``/``nn.Embedding`` that also collect their Kronecker factors.

Every layer here computes exactly the output of the plain MindSpore layer built with the same
arguments (same Parameters: ``weight``/``bias``/``embedding_table``, same ops), and in addition owns
three non-trainable Parameters (see ``ms_optim/thor/__init__.py`` for the package contract):

* ``matrix_a_cov`` (float32): the input factor A of the last THOR step;
* ``matrix_g_cov`` (float32): the output-gradient factor G of the last THOR step;
* ``thor_flag`` (bool scalar): while True *and* the cell is in training mode (``cell.training``,
  True from construction for THOR layers), the backward pass computes A and G. Otherwise no factor
  work is done.

Notation. The loss L is a mean over the samples of a batch. ``a`` are the layer's inputs, ``s`` its
pre-activation outputs, ``d = dL/ds`` the gradient reaching ``s`` in the backward pass.

* Dense (``kind == "dense"``). The input is flattened to ``N`` rows of ``in_channels`` (all leading
  dimensions of an N-D input are rows, as ``nn.Dense`` itself flattens them), and each row counts as
  one sample of the loss mean::

      A = a^T a / N                       (in_channels x in_channels)
      G = N * d^T d                       (out_channels x out_channels)

  For a 2-D input ``N = B``, the batch size. (For an input of shape ``(B, T, in)`` this is the
  "every token is a sample" convention, exact for a loss averaged over all B*T tokens.)
* Conv2d (``kind == "conv"``, group 1, NCHW). ``p`` are the im2col patches of size
  ``C_in*kh*kw`` (ordered like ``weight.reshape(C_out, -1)``: channel, kernel row, kernel column)
  at the ``T = H_out*W_out`` output positions, honouring stride, padding (pad_mode same/valid/pad,
  asymmetric padding of "same" included) and dilation; ``B`` is the batch size::

      A = sum_{b,t} p p^T / (B*T)         (C_in*kh*kw square)
      G = B * sum_{b,t} d d^T             (C_out x C_out)

  This is the KFC normalisation (Grosse & Martens, 2016): A is the patch covariance averaged over
  samples and positions, G the per-sample output-gradient covariance summed over positions
  (``B*d`` is the gradient of one sample's loss), so that ``A (x) G`` approximates the Fisher
  ``E_b[vec(dW_b) vec(dW_b)^T]`` of per-sample weight gradients ``dW_b``. (MindSpore's GPU layer
  averages the output gradients over the batch *before* the outer product, and its Ascend layer
  divides G by T; neither is the Fisher approximation the THOR paper states.)
* Embedding (``kind == "embedding"``). The ``N`` ids (all dimensions flattened, ``N = B*T`` for
  ids of shape ``(B, T)``) each count as one sample, as for Dense::

      A = counts / N                      (vocab_size vector: the diagonal of A; counts[v] = number
                                           of occurrences of id v; ids outside [0, vocab_size) are
                                           not counted; padding_idx is counted like any id)
      G = N * d^T d                       (embedding_size square; d are the N gradient rows)

Factors are always computed and stored in float32, also when the layer runs in float16 (amp
O2/O3). G is stored from the gradient *as it reaches the layer*: under a static loss scale ``S`` it
is ``S**2`` times the formula above, and the optimizer divides it by ``loss_scale**2``. A factor
that comes out non-finite (a loss-scale overflow) is not stored: the previous one is kept.

How: in training mode the layer passes ``s`` through a small "tap" cell, an identity with a custom
``bprop`` that receives the layer input and ``dL/ds`` and, while ``thor_flag`` is True, computes and
assigns both factors. So all factor work happens in the backward pass (a forward pass alone never
computes factors), the forward graph has no control flow, and it works in PYNATIVE and GRAPH mode,
inside ``TrainOneStepCell`` and with ``mindspore.value_and_grad``/``mindspore.grad`` (also under
``ms.jit``), for layers called several times too. The tap ignores amp's precision flags and casts
to float32 itself (in PYNATIVE mode amp would cast the inputs of *every* op of a float16 cell).

Setting ``thor_flag`` (or the factors) from Python after a graph was compiled: use ``ops.assign``
(in place). MindSpore 2.10 graphs do not see ``Parameter.set_data`` made after compilation for
Parameters they write.

Unsupported here (left as plain first-order layers by the converter, see ``convert.py``):
grouped or depthwise convolutions (``group > 1``) and ``data_format='NHWC'`` convolutions.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

import mindspore.common.dtype as mstype
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._validation import describe

__all__ = ["ThorLayer", "DenseThor", "Conv2dThor", "EmbeddingThor", "conv_output_geometry"]

_F32 = mstype.float32


_BRIDGE_PRIMED = False


def _prime_numpy_bridge() -> None:
    """Absorb MindSpore 2.10's one-time failure of its NumPy C-API bridge under NumPy 2.

    With NumPy 2 the first PYNATIVE op that goes through that bridge (e.g. a Tensor op with a Python
    scalar) leaves an ImportError set and raises ``SystemError``; every later call works. Trigger it
    once, harmlessly, when the first THOR layer is built (not at import: running an op initialises
    the device, and the user may not have chosen it yet).
    """
    global _BRIDGE_PRIMED  # pylint: disable=global-statement
    if _BRIDGE_PRIMED:
        return
    _BRIDGE_PRIMED = True
    try:
        _ = Tensor(np.ones(1, np.float32)) * 1.0
    except (SystemError, ImportError):
        pass


def conv_output_geometry(height: int, width: int, kernel_size: Tuple[int, int], stride: Tuple[int, int],
                         dilation: Tuple[int, int], pad_mode: str,
                         padding) -> Tuple[int, int, int, int, int, int]:
    """Output size and explicit paddings of a 2-D convolution, as ``ops.Conv2D`` computes them.

    Returns ``(pad_top, pad_bottom, pad_left, pad_right, out_height, out_width)``. With the
    effective kernel ``e = (k - 1) * dilation + 1``:

    * ``"same"``: ``out = ceil(in / stride)``, total padding ``max((out - 1) * stride + e - in, 0)``,
      split with the smaller half on top/left (the extra row/column goes to bottom/right);
    * ``"valid"``: no padding, ``out = floor((in - e) / stride) + 1``;
    * ``"pad"``: ``padding`` (an int, or a tuple ``(top, bottom, left, right)``),
      ``out = floor((in + pad_before + pad_after - e) / stride) + 1``.
    """
    eff_h = (kernel_size[0] - 1) * dilation[0] + 1
    eff_w = (kernel_size[1] - 1) * dilation[1] + 1
    if pad_mode == "same":
        out_h = (height + stride[0] - 1) // stride[0]
        out_w = (width + stride[1] - 1) // stride[1]
        total_h = max((out_h - 1) * stride[0] + eff_h - height, 0)
        total_w = max((out_w - 1) * stride[1] + eff_w - width, 0)
        pad_top = total_h // 2
        pad_left = total_w // 2
        return pad_top, total_h - pad_top, pad_left, total_w - pad_left, out_h, out_w
    if pad_mode == "pad":
        if isinstance(padding, int):
            pads = (padding, padding, padding, padding)
        else:
            pads = (padding[0], padding[1], padding[2], padding[3])
    else:
        pads = (0, 0, 0, 0)
    out_h = (height + pads[0] + pads[1] - eff_h) // stride[0] + 1
    out_w = (width + pads[2] + pads[3] - eff_w) // stride[1] + 1
    return pads[0], pads[1], pads[2], pads[3], out_h, out_w


# --------------------------------------------------------------------------- factor taps
def _scale(value, factor):
    """``value * factor`` for a Python number ``factor``, through a Tensor (see ``_prime_numpy_bridge``)."""
    return ops.mul(value, ops.scalar_to_tensor(factor, _F32))


class _FactorTap(nn.Cell):
    """Identity on the layer's pre-activation ``s`` whose backward pass stores the factors.

    ``tap(s, x, flag, a_cov, g_cov)`` returns ``s``. Its bprop receives the layer input ``x`` and
    ``ds = dL/ds``; while ``flag`` is True it writes ``A(x)`` into ``a_cov`` and ``G(ds)`` into
    ``g_cov`` (float32; a non-finite value is not written, so a loss-scale overflow keeps the old
    factor) and passes ``ds`` through unchanged. The gradients it returns for ``x`` and the state are
    zeros (``x`` reaches the tap through ``stop_gradient``; its real gradient flows through the layer).

    Doing all factor work in the backward pass keeps the forward graph free of control flow (a
    flag-dependent branch in the forward pass together with a backward hook makes MindSpore 2.10's
    GRAPH mode report a graph cycle for layers called more than once).
    """

    def __init__(self):
        super().__init__()
        self.gram = ops.MatMul(transpose_a=True)

    def add_flags_recursive(self, **flags):
        """Ignore amp's precision flags (``to_float``): the tap casts to float32 itself, and a float16
        flag would make PYNATIVE mode compute the factors in float16."""
        flags = {key: value for key, value in flags.items() if key not in ("fp16", "fp32", "bf16")}
        return super().add_flags_recursive(**flags)

    def _a_value(self, x):
        raise NotImplementedError

    def _g_rows(self, ds):
        """(rows (n, g_dim), factor): G = factor * rows^T rows."""
        raise NotImplementedError

    def _row_gram(self, rows, factor):
        rows = ops.cast(rows, _F32)
        return _scale(self.gram(rows, rows), factor)

    def construct(self, s, x, flag, a_cov, g_cov):
        return s

    def bprop(self, s, x, flag, a_cov, g_cov, out, dout):
        if flag:
            a_new = self._a_value(x)
            a_new = ops.select(ops.isfinite(a_new).all(), a_new, a_cov)
            rows, factor = self._g_rows(dout)
            g_new = self._row_gram(rows, factor)
            g_new = ops.select(ops.isfinite(g_new).all(), g_new, g_cov)
            dout = ops.depend(dout, ops.assign(a_cov, a_new))
            dout = ops.depend(dout, ops.assign(g_cov, g_new))
        # under amp the custom bprop sees the un-cast input s: hand its gradient back in s's dtype
        return (ops.cast(dout, s.dtype), ops.zeros_like(x), ops.zeros_like(flag), ops.zeros_like(a_cov),
                ops.zeros_like(g_cov))


class _DenseTap(_FactorTap):
    """A = a^T a / N for the N input rows; G = N d^T d."""

    def _a_value(self, x):
        return self._row_gram(x, 1.0 / x.shape[0])

    def _g_rows(self, ds):
        return ds, ds.shape[0]


class _ConvTap(_FactorTap):
    """A = sum p p^T / (B*T) over the im2col patches of the NCHW input; G = B * sum d d^T."""

    def __init__(self, kernel_size, stride, dilation, pad_mode, padding):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.dilation = dilation
        self.pad_mode = pad_mode
        self.padding = padding

    def _a_value(self, x):
        x = ops.cast(x, _F32)
        batch, channels, height, width = x.shape
        kh, kw = self.kernel_size
        sh, sw = self.stride
        dh, dw = self.dilation
        top, bottom, left, right, out_h, out_w = conv_output_geometry(
            height, width, self.kernel_size, self.stride, self.dilation, self.pad_mode, self.padding)
        if top + bottom + left + right > 0:
            x = ops.pad(x, (left, right, top, bottom))
        cols = []
        for i in range(kh):
            for j in range(kw):
                r0 = i * dh
                c0 = j * dw
                cols.append(x[:, :, r0:r0 + (out_h - 1) * sh + 1:sh, c0:c0 + (out_w - 1) * sw + 1:sw])
        patches = ops.stack(cols, 2)  # (B, C, kh*kw, Ho, Wo): column index c*kh*kw + i*kw + j
        patches = ops.reshape(patches, (batch, channels * kh * kw, out_h * out_w))
        patches = ops.transpose(patches, (0, 2, 1))
        patches = ops.reshape(patches, (batch * out_h * out_w, channels * kh * kw))
        return self._row_gram(patches, 1.0 / (batch * out_h * out_w))

    def _g_rows(self, ds):
        batch, channels = ds.shape[0], ds.shape[1]
        return ops.reshape(ops.transpose(ds, (0, 2, 3, 1)), (-1, channels)), batch


class _EmbeddingTap(_FactorTap):
    """A = counts / N (vocab_size vector; ids outside [0, vocab_size) not counted); G = N d^T d."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.limit = Tensor(np.array(vocab_size, np.int32))

    def _a_value(self, flat_ids):
        ids = ops.cast(flat_ids, mstype.int32)
        zeros = ops.zeros_like(ids)
        valid = ops.logical_and(ops.ge(ids, zeros), ops.lt(ids, self.limit))
        counts = ops.unsorted_segment_sum(ops.cast(valid, _F32), ops.select(valid, ids, zeros), self.vocab_size)
        return _scale(counts, 1.0 / ids.shape[0])

    def _g_rows(self, ds):
        return ds, ds.shape[0]


# --------------------------------------------------------------------------- the layers
class ThorLayer(nn.Cell):
    """Base class of the THOR layers: owns the factors ``matrix_a_cov``, ``matrix_g_cov`` and ``thor_flag``.

    What the optimizer may rely on:

    * ``kind``: ``"dense"``, ``"conv"`` or ``"embedding"`` (class attribute);
    * ``weight_param()``: the Parameter whose gradient is preconditioned (``weight`` or
      ``embedding_table``; conv weights are ``(C_out, C_in, kh, kw)``, A's index is ``c*kh*kw + i*kw + j``,
      i.e. ``weight.reshape(C_out, -1)``);
    * ``matrix_a_cov``: float32 Parameter, ``(a_dim, a_dim)`` for dense and conv, ``(a_dim,)`` for
      embedding (the diagonal of A); zeros until the first THOR step;
    * ``matrix_g_cov``: float32 Parameter ``(g_dim, g_dim)``; zeros until the first THOR step;
      ``loss_scale**2`` times the formula (see the module docstring);
    * ``thor_flag``: bool scalar Parameter, initially True (step 0 is a THOR step);
    * ``a_dim`` / ``g_dim``: ints, the sizes of A and G.

    Both factors are written during the *backward* pass of a training step whose ``thor_flag`` is
    True (so they are final once the gradients exist, before the optimizer runs); a layer used
    several times in one step keeps the factors of its first call (the last one the backward pass
    reaches). ``supports(cell)`` says whether a plain layer converts; ``from_cell(cell)`` builds the
    layer from it, *reusing* its Parameter objects.
    """

    kind: str = ""
    _plain_type: type = nn.Cell

    def _init_thor_state(self, a_shape: Tuple[int, ...], g_dim: int, name_prefix: str, tap: "_FactorTap") -> None:
        """Create the factor Parameters (zeros), the flag (True) and the factor tap."""
        _prime_numpy_bridge()
        self.a_dim = int(a_shape[0])
        self.g_dim = int(g_dim)
        self.matrix_a_cov = Parameter(Tensor(np.zeros(a_shape, np.float32)), name=name_prefix + "matrix_a_cov",
                                      requires_grad=False)
        self.matrix_g_cov = Parameter(Tensor(np.zeros((g_dim, g_dim), np.float32)),
                                      name=name_prefix + "matrix_g_cov", requires_grad=False)
        self.thor_flag = Parameter(Tensor(np.array(True)), name=name_prefix + "thor_flag", requires_grad=False)
        self.factor_tap = tap
        # THOR layers start in training mode (a plain Cell starts in inference mode), so a bare
        # TrainOneStepCell that never calls set_train() still collects factors instead of silently
        # preconditioning with damping alone; set_train(False) (Model.eval does) turns the tap off.
        self.set_train(True)

    def _tap(self, s, x):
        """In training mode, route ``s`` through the factor tap (dtype of ``s`` kept under amp)."""
        dtype = s.dtype
        s = self.factor_tap(s, ops.stop_gradient(x), self.thor_flag, self.matrix_a_cov, self.matrix_g_cov)
        return ops.cast(s, dtype)

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
        """Whether ``cell`` is a plain layer this class converts (exact type; see the subclasses)."""
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
    float32, computed only while ``thor_flag`` is True in training mode. See the module docstring.

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
    """

    kind = "dense"
    _plain_type = nn.Dense

    def __init__(self, in_channels, out_channels, weight_init='normal', bias_init='zeros', has_bias=True,
                 activation=None):
        super().__init__()
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
        self._init_thor_state((self.in_channels, self.in_channels), self.out_channels, name_prefix, _DenseTap())

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
    while ``thor_flag`` is True in training mode. See the module docstring.

    Args: as ``nn.Conv2d`` (``kernel_size``, ``stride``, ``dilation``: int or 2-tuple; ``padding``: int
    or 4-tuple; defaults ``weight_init='normal'``, ``bias_init='zeros'``, ``has_bias=False``).

    Raises:
        TypeError, ValueError: as ``nn.Conv2d`` for bad arguments.
        ValueError: if ``group`` is not 1 (grouped and depthwise convolutions have no THOR factors
            here; keep them as ``nn.Conv2d``: the converter leaves them first-order).
    """

    kind = "conv"
    _plain_type = nn.Conv2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode='same', padding=0, dilation=1,
                 group=1, has_bias=False, weight_init='normal', bias_init='zeros'):
        super().__init__()
        plain = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, pad_mode=pad_mode,
                          padding=padding, dilation=dilation, group=group, has_bias=has_bias,
                          weight_init=weight_init, bias_init=bias_init)
        if plain.group != 1:
            raise ValueError(f"For 'Conv2dThor', the argument 'group' must be 1 (grouped and depthwise "
                             f"convolutions are not supported; use nn.Conv2d), but got {group!r}.")
        self._adopt(plain, "")

    @classmethod
    def supports(cls, cell: nn.Cell) -> bool:
        """Exactly ``nn.Conv2d`` with ``group == 1`` and ``data_format == 'NCHW'``."""
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
        tap = _ConvTap(self.kernel_size, self.stride, self.dilation, self.pad_mode, self.padding)
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
    computed only while ``thor_flag`` is True in training mode. See the module docstring.

    Args:
        vocab_size (int), embedding_size (int), use_one_hot (bool), embedding_table (initializer),
        dtype (mindspore dtype of the one-hot values), padding_idx (int or None): as ``nn.Embedding``.

    Raises:
        TypeError, ValueError: as ``nn.Embedding`` for bad arguments.
    """

    kind = "embedding"
    _plain_type = nn.Embedding

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table='normal',
                 dtype=mstype.float32, padding_idx=None):
        super().__init__()
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
        self._init_thor_state((self.vocab_size,), self.embedding_size, name_prefix, _EmbeddingTap(self.vocab_size))

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
