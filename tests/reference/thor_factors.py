"""NumPy (float64) reference of THOR's layer factors: the specification the THOR layers are tested against.

Pure functions, no MindSpore. Notation: the loss L is a mean over the samples of a batch; ``a`` are a
layer's inputs, ``s`` its pre-activation outputs, ``d = dL/ds``.

* Dense, input rows ``a`` (N, in) (leading dimensions flattened; every row is one sample)::

      A = a^T a / N,      G = N * d^T d

* Conv2d (group 1, NCHW), patches ``p`` (C_in*kh*kw, ordered channel, kernel row, kernel column, i.e.
  like ``weight.reshape(C_out, -1)``) at the T = H_out*W_out output positions of each of the B samples::

      A = sum_{b,t} p p^T / (B*T),      G = B * sum_{b,t} d d^T

* Embedding, N ids (all dimensions flattened), gradient rows ``d`` (N, E)::

      A = counts / N   (vocab_size vector: the diagonal of A),      G = N * d^T d

Storage (``stored_form``): a layer keeps a factor of size n whole when ``n <= block_size`` (or
``block_size`` is None), else only its ``ceil(n / bs)`` diagonal blocks of width ``bs``, the last one
zero-padded to ``bs x bs``.

G is computed from the gradient that reaches the layer; under a static loss scale S that gradient
is S times larger and so G is S**2 times the formula (callers divide by S**2).
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np

__all__ = [
    "pair",
    "conv_geometry",
    "pad_nchw",
    "im2col",
    "conv2d_forward",
    "conv2d_weight_grad",
    "dense_forward",
    "dense_factors",
    "conv_factors",
    "embedding_factors",
    "stored_form",
]

IntPair = Union[int, Sequence[int]]


def pair(value: IntPair) -> Tuple[int, int]:
    """``3 -> (3, 3)``; a 2-sequence is returned as a tuple."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    return int(value[0]), int(value[1])


def conv_geometry(height: int, width: int, kernel_size: IntPair, stride: IntPair = 1, dilation: IntPair = 1,
                  pad_mode: str = "same", padding: Union[int, Sequence[int]] = 0):
    """Paddings and output size of MindSpore's Conv2D.

    Returns ``((top, bottom, left, right), (out_h, out_w))``. With effective kernel
    ``e = (k-1)*dilation + 1``: "same" gives ``out = ceil(in/stride)`` and total padding
    ``max((out-1)*stride + e - in, 0)`` with the smaller half first (top/left); "valid" pads nothing,
    ``out = floor((in - e)/stride) + 1``; "pad" uses ``padding`` (int, or (top, bottom, left, right)).
    """
    kh, kw = pair(kernel_size)
    sh, sw = pair(stride)
    dh, dw = pair(dilation)
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if pad_mode == "same":
        oh, ow = -(-height // sh), -(-width // sw)
        th = max((oh - 1) * sh + eh - height, 0)
        tw = max((ow - 1) * sw + ew - width, 0)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2), (oh, ow)
    if pad_mode == "valid":
        pads = (0, 0, 0, 0)
    elif pad_mode == "pad":
        pads = (padding,) * 4 if isinstance(padding, (int, np.integer)) else tuple(int(p) for p in padding)
    else:
        raise ValueError(f"unknown pad_mode {pad_mode!r}")
    oh = (height + pads[0] + pads[1] - eh) // sh + 1
    ow = (width + pads[2] + pads[3] - ew) // sw + 1
    return pads, (oh, ow)


def pad_nchw(x: np.ndarray, pads: Sequence[int]) -> np.ndarray:
    """Zero-pad an NCHW array by ``(top, bottom, left, right)``."""
    top, bottom, left, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))


def im2col(x: np.ndarray, kernel_size: IntPair, stride: IntPair = 1, dilation: IntPair = 1,
           pad_mode: str = "same", padding: Union[int, Sequence[int]] = 0) -> np.ndarray:
    """Patches of an NCHW input: array (B, T, C*kh*kw), T = out_h*out_w in row-major order.

    Element ``[b, oy*out_w + ox, c*kh*kw + i*kw + j]`` is
    ``x_padded[b, c, oy*sh + i*dh, ox*sw + j*dw]`` (a plain loop, written for clarity).
    """
    x = np.asarray(x, np.float64)
    batch, channels, height, width = x.shape
    kh, kw = pair(kernel_size)
    sh, sw = pair(stride)
    dh, dw = pair(dilation)
    pads, (oh, ow) = conv_geometry(height, width, kernel_size, stride, dilation, pad_mode, padding)
    xp = pad_nchw(x, pads)
    out = np.empty((batch, oh * ow, channels * kh * kw))
    for oy in range(oh):
        for ox in range(ow):
            col = 0
            for c in range(channels):
                for i in range(kh):
                    for j in range(kw):
                        out[:, oy * ow + ox, col] = xp[:, c, oy * sh + i * dh, ox * sw + j * dw]
                        col += 1
    return out


def conv2d_forward(x: np.ndarray, weight: np.ndarray, bias=None, stride: IntPair = 1, dilation: IntPair = 1,
                   pad_mode: str = "same", padding: Union[int, Sequence[int]] = 0) -> np.ndarray:
    """Cross-correlation as MindSpore's Conv2D (group 1), NCHW in and out, via ``im2col``."""
    weight = np.asarray(weight, np.float64)
    c_out, _, kh, kw = weight.shape
    batch, _, height, width = np.shape(x)
    _, (oh, ow) = conv_geometry(height, width, (kh, kw), stride, dilation, pad_mode, padding)
    cols = im2col(x, (kh, kw), stride, dilation, pad_mode, padding)       # (B, T, K)
    out = cols @ weight.reshape(c_out, -1).T                              # (B, T, C_out)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    return out.transpose(0, 2, 1).reshape(batch, c_out, oh, ow)


def conv2d_weight_grad(x: np.ndarray, dout: np.ndarray, kernel_size: IntPair, stride: IntPair = 1,
                       dilation: IntPair = 1, pad_mode: str = "same",
                       padding: Union[int, Sequence[int]] = 0) -> np.ndarray:
    """dL/dW (C_out, C_in, kh, kw) of a group-1 conv from its input and ``dout = dL/ds`` (B, C_out, H_out, W_out)."""
    kh, kw = pair(kernel_size)
    cols = im2col(x, kernel_size, stride, dilation, pad_mode, padding)     # (B, T, K)
    batch, c_out = dout.shape[:2]
    d = np.asarray(dout, np.float64).reshape(batch, c_out, -1)             # (B, C_out, T)
    grad = np.einsum("bot,btk->ok", d, cols)
    return grad.reshape(c_out, -1, kh, kw)


def dense_forward(x: np.ndarray, weight: np.ndarray, bias=None) -> np.ndarray:
    """Pre-activation ``s = x @ W^T + b`` of a Dense layer (leading dimensions kept)."""
    s = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    return s if bias is None else s + np.asarray(bias, np.float64)


def dense_factors(a: np.ndarray, d: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Dense factors from inputs ``a`` (..., in) and output gradients ``d = dL/ds`` (..., out).

    Leading dimensions are flattened into N rows, each one sample: ``A = a^T a / N``, ``G = N d^T d``.
    """
    a = np.asarray(a, np.float64).reshape(-1, np.shape(a)[-1])
    d = np.asarray(d, np.float64).reshape(-1, np.shape(d)[-1])
    n = a.shape[0]
    return a.T @ a / n, n * (d.T @ d)


def conv_factors(x: np.ndarray, dout: np.ndarray, kernel_size: IntPair, stride: IntPair = 1,
                 dilation: IntPair = 1, pad_mode: str = "same",
                 padding: Union[int, Sequence[int]] = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Conv2d factors (KFC): ``A = sum p p^T / (B*T)``, ``G = B * sum_{b,t} d d^T``.

    ``x`` is the NCHW input, ``dout = dL/ds`` the (B, C_out, H_out, W_out) output gradient.
    """
    cols = im2col(x, kernel_size, stride, dilation, pad_mode, padding)     # (B, T, K)
    batch, positions, k = cols.shape
    p = cols.reshape(-1, k)
    d = np.asarray(dout, np.float64).transpose(0, 2, 3, 1).reshape(-1, np.shape(dout)[1])
    return p.T @ p / (batch * positions), batch * (d.T @ d)


def embedding_factors(ids: np.ndarray, d: np.ndarray, vocab_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Embedding factors: ``A = counts / N`` (vector, ids outside [0, vocab_size) not counted) and
    ``G = N * d^T d`` for the N flattened ids and the (N, E) gradient rows ``d``."""
    ids = np.asarray(ids).reshape(-1)
    n = ids.size
    valid = ids[(ids >= 0) & (ids < vocab_size)]
    counts = np.bincount(valid, minlength=vocab_size).astype(np.float64)
    d = np.asarray(d, np.float64).reshape(n, -1)
    return counts / n, n * (d.T @ d)


def stored_form(full: np.ndarray, block_size=128) -> np.ndarray:
    """The form a THOR layer stores an ``(n, n)`` factor in: ``full`` itself if ``n <= block_size`` (or
    ``block_size`` is None), else the ``(nblocks, bs, bs)`` diagonal blocks, the last zero-padded."""
    full = np.asarray(full)
    n = full.shape[0]
    if block_size is None or n <= block_size:
        return full
    bs = int(block_size)
    nblocks = -(-n // bs)
    out = np.zeros((nblocks, bs, bs), full.dtype)
    for k in range(nblocks):
        part = full[k * bs:(k + 1) * bs, k * bs:(k + 1) * bs]
        out[k, :part.shape[0], :part.shape[1]] = part
    return out
