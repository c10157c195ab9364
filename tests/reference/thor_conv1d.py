"""NumPy (float64) reference of a 1-D convolution's THOR factors: the specification of ``Conv1dThor``.

Pure functions, no MindSpore, written from ``nn.Conv1d``'s documented semantics (group 1): an input ``x``
of shape (B, C_in, L) is zero-padded along L as ``pad_mode`` says, and with effective kernel
``e = (k - 1) * d + 1``

* ``"same"``: ``L_out = ceil(L / s)``, total padding ``max((L_out - 1) * s + e - L, 0)``, the smaller half on
  the left (an odd extra goes to the right);
* ``"valid"``: no padding, ``L_out = floor((L - e) / s) + 1``;
* ``"pad"``: ``padding`` on both sides, ``L_out = floor((L + 2 * padding - e) / s) + 1``;

``out[b, o, t] = bias[o] + sum_{c, j} w[o, c, j] * x_pad[b, c, t * s + j * d]`` (the weight given as
``(C_out, C_in, k)`` or as MindSpore keeps it, ``(C_out, C_in, 1, k)``). The patch of sample b at output
position t is ``p[c * k + j] = x_pad[b, c, t * s + j * d]`` (ordered like ``w.reshape(C_out, -1)``), and with
``d = dL/ds`` the (B, C_out, L_out) output gradient, T = L_out (KFC, as the 2-D conv of ``thor_factors``)::

    A = sum_{b,t} p p^T / (B*T)        (C_in*k square)
    G = B * sum_{b,t} d d^T            (C_out square)

:class:`Conv1dRef` is a test net for ``reference.thor_ref.ThorReference``: ``conv`` Conv1d (bias) -> ReLU ->
flatten -> ``fc`` Dense(., classes), mean softmax cross-entropy.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from reference import thor_factors as tf
from reference.thor_ref import softmax_xent

__all__ = ["conv1d_geometry", "conv1d_patches", "conv1d_forward", "conv1d_factors", "Conv1dRef"]

Array = np.ndarray


def conv1d_geometry(length: int, kernel: int, stride: int = 1, dilation: int = 1, pad_mode: str = "same",
                    padding: int = 0) -> Tuple[Tuple[int, int], int]:
    """``((left, right), L_out)`` of ``nn.Conv1d`` on an input of ``length`` (the rules above)."""
    effective = (kernel - 1) * dilation + 1
    if pad_mode == "same":
        out = -(-length // stride)
        total = max((out - 1) * stride + effective - length, 0)
        return (total // 2, total - total // 2), out
    if pad_mode == "valid":
        left = right = 0
    elif pad_mode == "pad":
        left = right = int(padding)
    else:
        raise ValueError(f"unknown pad_mode {pad_mode!r}")
    return (left, right), (length + left + right - effective) // stride + 1


def conv1d_patches(x: Array, kernel: int, stride: int = 1, dilation: int = 1, pad_mode: str = "same",
                   padding: int = 0) -> Array:
    """The patches, (B, T, C_in*k): element ``[b, t, c*k + j]`` is ``x_pad[b, c, t*stride + j*dilation]``."""
    x = np.asarray(x, np.float64)
    batch, channels, length = x.shape
    (left, right), out = conv1d_geometry(length, kernel, stride, dilation, pad_mode, padding)
    padded = np.pad(x, ((0, 0), (0, 0), (left, right)))
    patches = np.empty((batch, out, channels * kernel))
    for t in range(out):
        for c in range(channels):
            for j in range(kernel):
                patches[:, t, c * kernel + j] = padded[:, c, t * stride + j * dilation]
    return patches


def conv1d_forward(x: Array, weight: Array, bias=None, stride: int = 1, dilation: int = 1,
                   pad_mode: str = "same", padding: int = 0) -> Array:
    """``nn.Conv1d``'s output (B, C_out, L_out) for a ``(C_out, C_in, k)`` or ``(C_out, C_in, 1, k)``
    weight."""
    weight = np.asarray(weight, np.float64)
    c_out, kernel = weight.shape[0], weight.shape[-1]
    patches = conv1d_patches(x, kernel, stride, dilation, pad_mode, padding)
    out = patches @ weight.reshape(c_out, -1).T                                # (B, T, C_out)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    return out.transpose(0, 2, 1)


def conv1d_factors(x: Array, dout: Array, kernel: int, stride: int = 1, dilation: int = 1,
                   pad_mode: str = "same", padding: int = 0) -> Tuple[Array, Array]:
    """``(A, G)`` of a Conv1d from its input (B, C_in, L) and ``dout = dL/ds`` (B, C_out, L_out)."""
    patches = conv1d_patches(x, kernel, stride, dilation, pad_mode, padding)
    batch, positions, size = patches.shape
    p = patches.reshape(-1, size)
    d = np.asarray(dout, np.float64).transpose(0, 2, 1).reshape(-1, np.shape(dout)[1])
    return p.T @ p / (batch * positions), batch * (d.T @ d)


class Conv1dRef:
    """``conv`` Conv1d(kernel, stride, dilation, pad_mode, padding; bias) -> ReLU -> flatten -> ``fc``
    Dense; mean softmax cross-entropy."""

    layers = (("conv", "conv1d"), ("fc", "dense"))

    def __init__(self, kernel: int, stride: int = 1, dilation: int = 1, pad_mode: str = "same",
                 padding: int = 0):
        self.args = dict(stride=stride, dilation=dilation, pad_mode=pad_mode, padding=padding)
        self.kernel = kernel

    def forward_backward(self, p: Dict[str, Array], x: Array, y: Array):
        w = p["conv.weight"]
        c_out = w.shape[0]
        patches = conv1d_patches(x, self.kernel, **self.args)                 # (B, T, C_in*k)
        s = patches @ w.reshape(c_out, -1).T + p["conv.bias"]               # (B, T, C_out)
        h = np.maximum(s, 0.0)
        batch, positions = s.shape[:2]
        flat = h.transpose(0, 2, 1).reshape(batch, -1)                      # NCL flatten
        logits = flat @ p["fc.weight"].T + p["fc.bias"]
        loss, d_fc = softmax_xent(logits, y)
        d_flat = d_fc @ p["fc.weight"]
        d_s = d_flat.reshape(batch, c_out, positions).transpose(0, 2, 1) * (s > 0)
        grads = {"fc.weight": d_fc.T @ flat, "fc.bias": d_fc.sum(0),
                 "conv.weight": np.einsum("bto,btk->ok", d_s, patches).reshape(w.shape),
                 "conv.bias": d_s.sum((0, 1))}
        factors = {"conv": conv1d_factors(x, d_s.transpose(0, 2, 1), self.kernel, **self.args),
                   "fc": tf.dense_factors(flat, d_fc)}
        return loss, grads, factors
