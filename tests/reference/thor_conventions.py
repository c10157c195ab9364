"""NumPy float64 oracle of THOR's factor conventions, written from MindSpore 2.10's own THOR source.

Independent of ms_optim: it follows ``mindspore/nn/layer/thor_layer.py`` (what each layer stores)
and ``mindspore/nn/optim/thor.py`` (what ``ThorGpu``/``ThorAscend`` make of it), statement by
statement; the line numbers below are those of the installed MindSpore 2.10 files. ``"kfc"`` is
ms_optim's own normalisation (``reference.thor_factors``).

Loss scale: MindSpore's layers see gradients times the loss scale S and its optimizers multiply G
by ``1 / S^2`` (thor.py 371, 522, 688, 1006); the two cancel, so the oracle is the S = 1 trajectory.
``bs`` is the optimizer's ``batch_size`` argument (thor.py 370-372, 687-689), not the real batch.

Layers (x NCHW input with patches p, ``dout`` (B, C_out, Ho, Wo), T = Ho*Wo, n = B*T; Dense/Embedding
rows a, d, N rows):

* GPU Conv2dThor (thor_layer.py 500-512, 470-480): ``ThorIm2Col`` gives (C, kh, kw, B, Ho, Wo),
  reshaped to (C*kh*kw, B, T) and averaged over B; ``A = M M^T / T`` with ``a_normalizer = T``;
  ``dout`` averaged over B, reshaped (C_out, T); ``G = D D^T / T`` with ``g_normalizer = T``.
* Ascend Conv2dThor (thor_layer.py 485-496, 459-469): all n patch rows, ``A = P^T P / n``,
  ``a_normalizer = n``; dout rows (n, C_out), ``G = D^T D / n``, ``g_normalizer = n``.
* DenseThor: GPU (181-186, 166-170) ``A = a^T a / in`` (the first dimension of ``a^T a``),
  ``G = d^T d / N``; Ascend (175-180, 158-164) ``A = a^T a / N``, ``G = d^T d / N``.
* EmbeddingThor (both, 646-649, 630-634): ``A = counts`` (one-hot sum), ``G = d^T d / N``.

Optimizers (d the step's damping, ``binv(F, lam)`` the 128-wide block-diagonal ``(F + lam I)^-1``):

* ThorGpu._get_ainv_ginv_list (thor.py 493-543): G <- G bs^2; conv: damping ``d / a_normalizer``
  on A and ``d / g_normalizer`` on G, both inverses times ``feature_map = sqrt(1 / a_normalizer)``;
  Dense: damping d, feature_map 1; ``Ainv = binv(A, sqrt(damping_a)) * feature_map``, ``Ginv`` alike;
  Embedding: ``Ainv = 1 / (A / bs + sqrt(d))``, ``Ginv = (G + sqrt(d) I)^-1`` (whole matrix).
* ThorAscend (thor.py 979-1013 conv, 892-935 Dense, 1043-1061 Embedding): G <- G bs^2; conv damping
  ``d bs / a_normalizer`` on A and ``d bs / g_normalizer`` on G, and the product ``Ginv g Ainv``
  multiplied by ``bs / a_normalizer`` (1185); Dense and Embedding as on GPU. The oracle returns that
  product factor split evenly over the two inverses (``sqrt(bs / n)`` each): the update is the same,
  and ms_optim's stored inverses are compared in that form. (Not modelled, as ms_optim does not
  reproduce them: Ascend's float16 casts and its ``max|Ginv| / max|Ainv|`` rescale of conv-net
  products (1251-1260), the Dense-with-2-outputs ``Ginv = I`` case; and the im2col of both devices,
  which always uses "same" padding: here the patches follow the layer's own geometry.)
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import numpy as np

from reference import thor_factors as tf
from reference.thor_ref import block_inverse

Array = np.ndarray

CONVENTIONS = ("gpu", "ascend", "kfc")


def layer_factors(convention: str, raw) -> Tuple[Array, Array, float, float]:
    """MindSpore's per-layer ``(A, G, a_normalizer, g_normalizer)`` (normalisers 1 outside conv) for a
    ``thor_ref`` ``raw`` entry; for ``"kfc"`` ms_optim's factors (``reference.thor_factors``)."""
    kind = raw[0]
    if convention == "kfc":
        if kind == "dense":
            return (*tf.dense_factors(raw[1], raw[2]), 1.0, 1.0)
        if kind == "conv":
            return (*tf.conv_factors(raw[1], raw[2], **raw[3]), 1.0, 1.0)
        return (*tf.embedding_factors(raw[1], raw[2], raw[3]), 1.0, 1.0)
    if kind == "dense":
        a = np.asarray(raw[1], np.float64)
        d = np.asarray(raw[2], np.float64)
        gram = a.T @ a
        a_cov = gram / gram.shape[0] if convention == "gpu" else gram / a.shape[0]
        return a_cov, d.T @ d / d.shape[0], 1.0, 1.0
    if kind == "conv":
        x, dout, args = raw[1], np.asarray(raw[2], np.float64), raw[3]
        cols = tf.im2col(x, **args)                                   # (B, T, K)
        batch, positions, k = cols.shape
        c_out = dout.shape[1]
        if convention == "gpu":
            m = cols.transpose(2, 0, 1).mean(axis=1)                    # (K, T)
            dm = dout.mean(axis=0).reshape(c_out, -1)                   # (C_out, T)
            return m @ m.T / positions, dm @ dm.T / positions, float(positions), float(positions)
        p = cols.reshape(-1, k)
        rows = dout.transpose(0, 2, 3, 1).reshape(-1, c_out)
        n = float(batch * positions)
        return p.T @ p / n, rows.T @ rows / n, n, n
    ids, d, vocab = np.asarray(raw[1]).reshape(-1), np.asarray(raw[2], np.float64), raw[3]
    counts = np.zeros(vocab)
    for i in ids:
        if 0 <= i < vocab:
            counts[i] += 1.0
    d = d.reshape(ids.size, -1)
    return counts, d.T @ d / ids.size, 1.0, 1.0


def inverses(convention: str, raw, damping: float, batch_size: int, block_size=128) -> Tuple[Array, Array]:
    """The damped inverses ``(Ainv, Ginv)`` the device's optimizer applies as ``Ginv g Ainv`` (embedding:
    ``diag(Ainv) g Ginv``), any product factor folded in evenly (module docstring)."""
    kind = raw[0]
    a, g, a_norm, g_norm = layer_factors(convention, raw)
    if convention == "kfc":
        lam = math.sqrt(damping)
        a_inv = 1.0 / (a + lam) if kind == "embedding" else block_inverse(a, lam, block_size)
        return a_inv, block_inverse(g, lam, block_size)
    bs = float(batch_size)
    g = g * bs * bs
    if kind == "embedding":
        lam = math.sqrt(damping)
        return 1.0 / (a / bs + lam), np.linalg.inv(g + lam * np.eye(g.shape[0]))
    damping_a = damping_g = damping
    scale_a = scale_g = 1.0
    if kind == "conv" and convention == "gpu":
        damping_a, damping_g = damping / a_norm, damping / g_norm
        scale_a = scale_g = math.sqrt(1.0 / a_norm)
    elif kind == "conv":
        damping_a, damping_g = damping * bs / a_norm, damping * bs / g_norm
        scale_a = scale_g = math.sqrt(bs / a_norm)
    a_inv = block_inverse(a, math.sqrt(damping_a), block_size) * scale_a
    g_inv = block_inverse(g, math.sqrt(damping_g), block_size) * scale_g
    return a_inv, g_inv


def effective_factors(convention: str, raw, batch_size: int) -> Tuple[Array, Array]:
    """The factors ms_optim's layers store for ``convention`` (``ms_optim._thor.conventions``'s
    contract): MindSpore's factors as its optimizer damps them (G times bs^2, embedding A over bs),
    times ``k``, where ``k = sqrt(T)`` (gpu conv), ``sqrt(n / bs)`` (ascend conv), else 1 -- so that
    ``(A_e + sqrt(d) I)^-1`` is exactly the inverse above."""
    a, g, a_norm, _ = layer_factors(convention, raw)
    if convention == "kfc":
        return a, g
    bs = float(batch_size)
    g = g * bs * bs
    if raw[0] == "embedding":
        a = a / bs
    k = 1.0
    if raw[0] == "conv":
        k = math.sqrt(a_norm) if convention == "gpu" else math.sqrt(a_norm / bs)
    return k * a, k * g


def reference_inverses(convention: str, batch_size: int):
    """The ``inverses`` hook of ``ThorReference`` for ``convention``."""
    def hook(raw, damping: float) -> Tuple[Array, Array]:
        return inverses(convention, raw, damping, batch_size)
    return hook


def all_effective(convention: str, raw: Dict[str, tuple], batch_size: int) -> Dict[str, Tuple[Array, Array]]:
    """``effective_factors`` of every layer of a ``thor_ref`` model's ``raw``."""
    return {name: effective_factors(convention, entry, batch_size) for name, entry in raw.items()}
