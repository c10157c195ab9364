"""THOR's Kronecker factors per layer kind: the math, apart from the layer classes.

Each kind has two small functions, ``<kind>_a(layer input, ...) -> A`` and ``<kind>_g(dL/ds) -> G``
(float32 results, whatever the input dtype), which its spec (``kinds.py``) calls, with the multipliers
of a factor convention, when the tap (``taps.py``) runs the backward pass. The layers (``layers.py``)
only own the state (the factor Parameters and the flag) and the forward.

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
  asymmetric padding of "same" included) and dilation (:func:`conv_output_geometry`); ``B`` is the
  batch size::

      A = sum_{b,t} p p^T / (B*T)         (C_in*kh*kw square)
      G = B * sum_{b,t} d d^T             (C_out x C_out)

  This is the KFC normalisation (Grosse & Martens, 2016): A is the patch covariance averaged over
  samples and positions, G the per-sample output-gradient covariance summed over positions
  (``B*d`` is the gradient of one sample's loss), so that ``A (x) G`` approximates the Fisher
  ``E_b[vec(dW_b) vec(dW_b)^T]`` of per-sample weight gradients ``dW_b``. (MindSpore's GPU layer
  averages the output gradients over the batch *before* the outer product, and its Ascend layer
  divides G by T; neither is the Fisher approximation the THOR paper states. Both are available as
  ``thor(..., factor_convention="gpu"/"ascend")``: ``ms_optim._thor.net.conventions``.)
* Conv1d (``kind == "conv1d"``, group 1). ``nn.Conv1d`` runs ``Conv2D`` on its input with a height-1
  axis, with a ``(1, k)`` kernel, and so does ``Conv1dThor``: its factors are the Conv2d ones above of
  that 4-D convolution, T = L_out the output length, patches of size ``C_in*k``.
* Embedding (``kind == "embedding"``). The ``N`` ids (all dimensions flattened, ``N = B*T`` for
  ids of shape ``(B, T)``) each count as one sample, as for Dense::

      A = counts / N                      (vocab_size vector: the diagonal of A; counts[v] = number
                                           of occurrences of id v; ids outside [0, vocab_size) are
                                           not counted; padding_idx is counted like any id)
      G = N * d^T d                       (embedding_size square; d are the N gradient rows)

Storage: the diagonal blocks only. Blocked THOR (``inverse="blocked"``, the default) reads only the
diagonal blocks of A and G, so a factor of size ``n`` with a block width ``bs < n`` is computed and
stored as those blocks, ``(nblocks, bs, bs)`` with ``nblocks = ceil(n / bs)`` (the last block
zero-padded past ``n``), never as the ``n x n`` matrix; with ``n <= bs`` (or ``block_size=None``, the
whole matrix: ``inverse="full"``) it is the ``(n, n)`` matrix itself. :func:`factor_blocks` is the one
place this block geometry is computed (:func:`stored_shape`, the fused ops' plans and the optimizer's
``preconditioner.BlockLayout`` take it from there). For a conv this is the difference that matters: a 3x3 conv
with 512 input channels has ``n = 4608`` and its A is 85 MB, its 36 diagonal blocks of 128 are 2.4 MB and cost
36 times fewer flops. The conv factors are formed without a transpose of the patch matrix: with the
patches laid out as ``(B, n, T)`` (channel-major, as the input is), each block is a batched
``p_b p_b^T`` summed over the batch (MindSpore's CPU ``Transpose`` kernel allocates an index table
1.8 times the size of its input when the graph is compiled, which made a ResNet-50 graph's
compilation grow with the batch and the image).

Factors are always computed in float32, also when the layer runs in float16 (amp O2/O3). G is
computed from the gradient *as it reaches the layer*: under a loss scale ``S`` it is ``S**2`` times
the formula above (the optimizer divides it out). A factor that comes out non-finite (a loss-scale
overflow) is not stored: the previous one is kept.

The backward-pass tap that has these functions called is ``taps.FactorTap``.

Shape planning. The helpers that only compute numbers from static shapes
(:func:`conv_output_geometry`, :func:`factor_blocks`, :func:`gram_plan`, :func:`patch_plan`,
:func:`conv_a_plan`) are ``constexpr``: GRAPH_MODE runs them in Python and puts their result in the
graph as one constant. Parsed into the graph, their arithmetic and branches would become graph nodes at
every call site of every layer, and the compiled THOR step larger; called from Python they are plain
functions.
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore.common.dtype as mstype
from mindspore import mint, ops
from mindspore.ops import constexpr

__all__ = [
    "factor_blocks",
    "stored_shape",
    "diagonal_blocks",
    "batch_gram",
    "conv_output_geometry",
    "row_gram",
    "dense_a",
    "dense_g",
    "conv_patches",
    "conv_a",
    "patch_chunk_size",
    "gram_plan",
    "patch_plan",
    "conv_a_plan",
    "conv_g",
    "embedding_a",
    "embedding_g",
    "zero_pad",
]

_F32 = mstype.float32
_GRAM = ops.MatMul(transpose_a=True)
_BATCH_GRAM = ops.BatchMatMul(transpose_b=True)

Pair = Tuple[int, int]


@constexpr
def conv_output_geometry(height: int, width: int, kernel_size: Pair, stride: Pair, dilation: Pair,
                         pad_mode: str, padding) -> Tuple[int, int, int, int, int, int]:
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


@constexpr
def factor_blocks(n: int, block_size: Optional[int]) -> Tuple[int, int]:
    """``(nblocks, bs)`` of a factor of size ``n``: ``bs = min(block_size, n)``, ``nblocks = ceil(n / bs)``;
    ``block_size=None`` is the whole matrix, ``(1, n)``. THE block geometry of THOR's factors (stored
    shapes, plans, inverses); a ``constexpr`` (see "Shape planning"), a plain function from Python."""
    if block_size is None or block_size >= n:
        return 1, int(n)
    return (n + block_size - 1) // block_size, int(block_size)


def stored_shape(n: int, block_size: Optional[int]) -> Tuple[int, ...]:
    """Shape a factor of size ``n`` is stored in: ``(n, n)`` if one block, else ``(nblocks, bs, bs)``."""
    nblocks, bs = factor_blocks(n, block_size)
    return (int(n), int(n)) if nblocks == 1 else (nblocks, bs, bs)


def diagonal_blocks(full, block_size: Optional[int]):
    """The stored form (:func:`stored_shape`) of an ``(n, n)`` matrix: itself, or its diagonal blocks.

    No per-block slicing: the matrix is zero-padded to ``P = nblocks * bs``, flattened and padded by
    ``nblocks * bs`` values, so that row ``k`` of its ``(nblocks, bs * (P + 1))`` view starts at entry
    ``(k bs, k bs)``; the first ``bs`` columns of the first ``bs`` rows of length ``P`` are block ``k``.
    """
    n = full.shape[0]
    nblocks, bs = factor_blocks(n, block_size)
    if nblocks == 1:
        return full
    padded = nblocks * bs
    if padded > n:
        full = zero_pad(full, (0, padded - n, 0, padded - n))
    flat = zero_pad(ops.reshape(full, (-1,)), (0, padded))
    rows = ops.reshape(flat, (nblocks, bs * (padded + 1)))[:, :bs * padded]
    return ops.reshape(rows, (nblocks, bs, padded))[:, :, :bs]


def batch_gram(columns, factor, block_size: Optional[int]):
    """Stored form of ``factor * sum_b c_b c_b^T`` for ``columns`` of shape ``(B, n, T)`` (float32).

    ``n`` is zero-padded to ``nblocks * bs`` and viewed as ``(B * nblocks, bs, T)``: one batched
    ``c c^T`` and a sum over ``B`` give the diagonal blocks (a whole factor: ``B`` products of ``n x n``).
    When the whole ``n x n`` gram takes no more flops than the padded blocks (``n^2 <= nblocks bs^2``,
    e.g. a 7x7 RGB stem: n = 147, two blocks of 128), it is formed instead and cut into blocks: no
    padded copy of the columns. When ``T < bs`` (a ResNet's last stage: T = 49) the ``B * nblocks``
    products would be larger than the columns themselves, so the columns are laid out once as
    ``(nblocks, bs, B * T)`` (``mint.permute``) and each block is one product.
    """
    columns = ops.cast(columns, _F32)
    batch, n, positions = columns.shape
    route, nblocks, bs, pad = gram_plan(batch, n, positions, block_size)
    if route == "whole":
        return diagonal_blocks(_scale(ops.reduce_sum(_BATCH_GRAM(columns, columns), 0), factor), block_size)
    if pad:
        columns = zero_pad(columns, (0, 0, 0, pad))
    if route == "permute":
        columns = ops.reshape(mint.permute(columns, (1, 0, 2)), (nblocks, bs, batch * positions))
        blocks = _BATCH_GRAM(columns, columns)
    else:
        columns = ops.reshape(columns, (batch * nblocks, bs, positions))
        blocks = ops.reduce_sum(ops.reshape(_BATCH_GRAM(columns, columns), (batch, nblocks, bs, bs)), 0)
    if nblocks == 1:
        blocks = ops.reshape(blocks, (n, n))
    return _scale(blocks, factor)


@constexpr
def gram_plan(batch: int, n: int, positions: int, block_size: Optional[int]) -> Tuple[str, int, int, int]:
    """How :func:`batch_gram` forms the blocks of ``(B, n, T)`` columns: ``(route, nblocks, bs, pad)``.

    ``route`` is ``"whole"`` (the ``n x n`` gram, then its blocks: when ``n^2 <= nblocks bs^2``),
    ``"permute"`` (one product per block: when ``B > 1`` and ``T < bs``) or ``"batched"`` (``B * nblocks``
    products summed over ``B``); ``pad = nblocks * bs - n`` zero rows complete the last block.
    """
    nblocks, bs = factor_blocks(n, block_size)
    if 1 < nblocks and n * n <= nblocks * bs * bs:  # the whole gram costs no more than the padded blocks
        route = "whole"
    elif 1 < batch and positions < bs:  # (B nblocks, bs, bs) products would outweigh one copy of the columns
        route = "permute"
    else:
        route = "batched"
    return route, nblocks, bs, nblocks * bs - n


@constexpr
def _pad_pairs(ndim: int, after_last: Tuple[int, ...]) -> Tuple[Tuple[int, int], ...]:
    """``ops.Pad``'s per-dimension ``(before, after)`` pairs from ``ops.pad``-style ``(before, after)`` of the
    last dimensions, last dimension first (a ``constexpr``: see "Shape planning")."""
    pairs = [(0, 0)] * ndim
    for i in range(len(after_last) // 2):
        pairs[ndim - 1 - i] = (int(after_last[2 * i]), int(after_last[2 * i + 1]))
    return tuple(pairs)


def zero_pad(x, pads: Tuple[int, ...]):
    """``ops.pad(x, pads)`` with zeros, as one ``Pad`` primitive with constant paddings.

    Not the functional ``ops.pad`` (``PadV3``, whose argument checks are parsed into the graph at every
    call site, which makes the compiled THOR step larger for the same values).
    """
    return ops.Pad(_pad_pairs(x.ndim, pads))(x)


# --------------------------------------------------------------------------- per-kind math
def _scale(value, factor):
    """``value * factor`` for a Python number ``factor``, through a Tensor (see ``ms_optim._bridge``)."""
    return ops.mul(value, ops.scalar_to_tensor(factor, _F32))


def row_gram(rows, factor):
    """``factor * rows^T rows`` in float32, for ``(n, k)`` rows and a Python number ``factor``."""
    rows = ops.cast(rows, _F32)
    return _scale(_GRAM(rows, rows), factor)


def _rows_blocks(rows, factor, block_size: Optional[int]):
    """Stored form of ``factor * rows^T rows`` for ``(N, n)`` rows: the whole gram when it is one block,
    else only the diagonal blocks, from the rows laid out once as one ``(1, n, N)`` column matrix."""
    n = rows.shape[1]
    if factor_blocks(n, block_size)[0] == 1:
        return row_gram(rows, factor)
    columns = ops.reshape(mint.permute(ops.cast(rows, _F32), (1, 0)), (1, n, rows.shape[0]))
    return batch_gram(columns, factor, block_size)


def dense_a(x, block_size: Optional[int] = None):
    """Dense A from the ``(N, in)`` input rows: ``a^T a / N`` (stored form, :func:`stored_shape`)."""
    return _rows_blocks(x, 1.0 / x.shape[0], block_size)


def dense_g(ds, block_size: Optional[int] = None):
    """Dense (and embedding) G from the ``(N, out)`` rows of dL/ds: ``N d^T d`` (stored form)."""
    return _rows_blocks(ds, ds.shape[0], block_size)


def conv_patches(x, kernel_size: Pair, stride: Pair, dilation: Pair, pad_mode: str, padding):
    """im2col of an NCHW input, channel-major: ``(B, C*kh*kw, Ho*Wo)`` float32, row ``c*kh*kw + i*kw + j``
    (a 1x1 kernel with stride 1 and no padding is the input itself, reshaped).

    One ``Im2Col`` op (CPU, GPU and Ascend kernels; it pads symmetrically, so an asymmetric "same"
    padding is applied by ``Pad`` first). On CPU it is much faster than ``kh*kw`` strided slices and a
    stack, and one op instead of ``kh*kw + 2`` keeps the compiled graph smaller.
    """
    x = ops.cast(x, _F32)
    batch, channels, height, width = x.shape
    pad, im2col_pads, crop, positions = patch_plan(height, width, kernel_size, stride, dilation, pad_mode,
                                                   padding)
    if pad is not None:
        x = zero_pad(x, pad)
    if im2col_pads is None:  # a 1x1 kernel: the (strided) input itself
        if crop is not None:
            x = x[:, :, 0:crop[0]:stride[0], 0:crop[1]:stride[1]]
        return ops.reshape(x, (batch, channels, positions))
    # (B, C, kh*kw, T)
    cols = ops.Im2Col(ksizes=kernel_size, strides=stride, dilations=dilation, pads=im2col_pads)(x)
    return ops.reshape(cols, (batch, channels * kernel_size[0] * kernel_size[1], positions))


@constexpr
def patch_plan(height: int, width: int, kernel_size: Pair, stride: Pair, dilation: Pair, pad_mode: str,
               padding):
    """How :func:`conv_patches` cuts an input of ``height x width``: ``(pad, im2col_pads, crop, positions)``.

    ``pad``: the ``(left, right, top, bottom)`` for :func:`zero_pad` first, or None (a 1x1 kernel's padding;
    an asymmetric padding before ``Im2Col``, which pads symmetrically); ``im2col_pads``: ``Im2Col``'s
    ``(top, left)``, None for a 1x1 kernel; ``crop``: for a 1x1 kernel whose output is not the (padded)
    input, the ends ``(h, w)`` of the strided slice, else None; ``positions = Ho * Wo``.
    """
    top, bottom, left, right, out_h, out_w = conv_output_geometry(height, width, kernel_size, stride,
                                                                  dilation, pad_mode, padding)
    pad = (left, right, top, bottom) if top + bottom + left + right > 0 else None
    crop = None
    if kernel_size[0] * kernel_size[1] == 1:
        im2col_pads = None
        shape = (height + top + bottom, width + left + right)
        if tuple(stride) != (1, 1) or shape != (out_h, out_w):
            crop = ((out_h - 1) * stride[0] + 1, (out_w - 1) * stride[1] + 1)
    elif top != bottom or left != right:
        im2col_pads = (0, 0)
    else:
        im2col_pads, pad = (top, left), None
    return pad, im2col_pads, crop, out_h * out_w


#: Largest patch matrix (bytes) a conv tap builds at once; a larger one is built in batch chunks.
PATCH_CHUNK_BYTES = 64 * 2 ** 20


@constexpr
def patch_chunk_size(batch: int, patch_bytes: int) -> int:
    """Samples per chunk so that each chunk's patches fit ``PATCH_CHUNK_BYTES`` (``batch``: one chunk)."""
    chunks = (patch_bytes + PATCH_CHUNK_BYTES - 1) // PATCH_CHUNK_BYTES
    return (batch + chunks - 1) // chunks


@constexpr
def conv_a_plan(shape, kernel_size: Pair, stride: Pair, dilation: Pair, pad_mode: str,
                padding) -> Tuple[float, int]:
    """``(1 / (B * Ho * Wo), samples per chunk)`` of :func:`conv_a` for an NCHW input of ``shape``."""
    batch, channels, height, width = shape
    positions = patch_plan(height, width, kernel_size, stride, dilation, pad_mode, padding)[3]
    patch_bytes = 4 * batch * channels * kernel_size[0] * kernel_size[1] * positions
    return 1.0 / (batch * positions), patch_chunk_size(batch, patch_bytes)


def conv_a(x, kernel_size: Pair, stride: Pair, dilation: Pair, pad_mode: str, padding,
           block_size: Optional[int] = None):
    """Conv A from the NCHW input and the conv geometry: ``sum p p^T / (B*T)`` over the patches (stored form).

    When the ``(B, n, T)`` float32 patches would exceed ``PATCH_CHUNK_BYTES`` (a ResNet-50 stem or
    first-stage 3x3 conv at batch 32: 231 MB, 257 MB padded to blocks), the batch is cut into chunks of
    ``patch_chunk_size`` samples whose grams are summed; each chunk starts after the previous one's
    gram is added, so only one chunk's patches exist at a time.
    """
    batch = x.shape[0]
    factor, size = conv_a_plan(x.shape, kernel_size, stride, dilation, pad_mode, padding)
    if size >= batch:
        return batch_gram(conv_patches(x, kernel_size, stride, dilation, pad_mode, padding), factor,
                          block_size)
    total = batch_gram(conv_patches(x[0:size], kernel_size, stride, dilation, pad_mode, padding), factor,
                       block_size)
    for start in range(size, batch, size):  # the last chunk may be smaller
        part = ops.depend(x[start:start + size], total)
        patches = conv_patches(part, kernel_size, stride, dilation, pad_mode, padding)
        total = total + batch_gram(patches, factor, block_size)
    return total


def conv_g(ds, block_size: Optional[int] = None):
    """Conv G from the NCHW dL/ds ``(B, C_out, Ho, Wo)``: ``B * sum d d^T`` over batch and positions
    (stored form)."""
    batch, channels = ds.shape[0], ds.shape[1]
    return batch_gram(ops.reshape(ds, (batch, channels, -1)), batch, block_size)


def embedding_a(flat_ids, vocab_size: int, limit):
    """Embedding A's diagonal from the flat ids: ``counts / N`` (ids outside [0, vocab_size) not counted).

    ``limit`` is ``vocab_size`` as an int32 Tensor (a graph constant).
    """
    ids = ops.cast(flat_ids, mstype.int32)
    zeros = ops.zeros_like(ids)
    valid = ops.logical_and(ops.ge(ids, zeros), ops.lt(ids, limit))
    counts = ops.unsorted_segment_sum(ops.cast(valid, _F32), ops.select(valid, ids, zeros), vocab_size)
    return _scale(counts, 1.0 / ids.shape[0])


embedding_g = dense_g
