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
  multiplied by ``bs / a_normalizer`` (1185); Dense and Embedding as on GPU. In a net with any conv
  layer every Conv and Dense product is also multiplied by ``g_max / a_max`` (the largest |entry| of
  Ginv and Ainv: thor.py 1236-1260 divide each inverse by its maximum and multiply by ``g_max^2``);
  a Dense layer with 2 outputs gets ``Ginv = I``. The oracle returns the product factor split evenly
  over the two inverses (``sqrt(bs / n)`` each) and the max ratio in Ginv: the update is the same,
  and ms_optim's stored inverses are compared in that form.
* GPU Embedding (thor.py 520-529): ``Ginv = X X`` with ``X = CholeskyTrsm(G') = L^-1``.
* Data parallel (thor.py 575-577, 1227-1232): both all-reduce (mean) the inverses of each rank's
  factors, Ascend its maxima too (``inverses`` of a tuple of per-rank ``raw`` entries).

Not modelled, as ms_optim does not reproduce them: Ascend's float16 casts; the im2col of both devices,
which always uses "same" padding (here the patches follow the layer's own geometry).
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


def device_inverses(convention: str, raw, damping: float, batch_size: int, block_size=128) -> Dict[str, object]:
    """What the device's optimizer computes for one layer on one rank, before any all-reduce:
    ``a``/``g`` the inverses as it all-reduces them (gpu conv: times ``feature_map``), ``a_max``/``g_max``
    their largest |entry| (Ascend's maxima), ``factor`` the remaining product factor (Ascend conv:
    ``bs / a_normalizer``, 1 elsewhere).

    GPU Embedding: ``X = CholeskyTrsm(G') = L^-1`` (``G' = L L^T``; cuSOLVER's upper factor solved in a
    row-major buffer) and the "inverse" is ``MatMul(X, X) = L^-1 L^-1`` (thor.py 528-529), not ``G'^-1``.
    Ascend Dense with 2 outputs: ``Ginv = I`` (thor.py 904-906)."""
    kind = raw[0]
    a, g, a_norm, g_norm = layer_factors(convention, raw)
    out = dict(factor=1.0)
    if convention == "kfc":
        lam = math.sqrt(damping)
        out["a"] = 1.0 / (a + lam) if kind == "embedding" else block_inverse(a, lam, block_size)
        out["g"] = block_inverse(g, lam, block_size)
    elif kind == "embedding":
        bs = float(batch_size)
        lam = math.sqrt(damping)
        damped = g * bs * bs + lam * np.eye(g.shape[0])
        out["a"] = 1.0 / (a / bs + lam)
        if convention == "gpu":
            whitening = np.linalg.inv(np.linalg.cholesky(damped))
            out["g"] = whitening @ whitening
        else:
            out["g"] = np.linalg.inv(damped)
    else:
        bs = float(batch_size)
        damping_a = damping_g = damping
        scale = 1.0
        if kind == "conv" and convention == "gpu":
            damping_a, damping_g = damping / a_norm, damping / g_norm
            scale = math.sqrt(1.0 / a_norm)
        elif kind == "conv":
            damping_a, damping_g = damping * bs / a_norm, damping * bs / g_norm
            out["factor"] = bs / a_norm
        out["a"] = block_inverse(a, math.sqrt(damping_a), block_size) * scale
        if convention == "ascend" and kind == "dense" and g.shape[0] == 2:
            out["g"] = np.eye(2)
        else:
            out["g"] = block_inverse(g * bs * bs, math.sqrt(damping_g), block_size) * scale
    out["a_max"] = float(np.abs(out["a"]).max())
    out["g_max"] = float(np.abs(out["g"]).max())
    return out


def max_scaled(convention: str, kind: str, g_dim: int, has_conv: bool) -> bool:
    """Whether ThorAscend scales this layer's product by ``g_max / a_max``: Conv and Dense layers (not
    the 2-output Dense, whose ``Ginv = I``) of a net with any conv layer (thor.py 919-925, 1003-1013,
    1236-1260)."""
    return convention == "ascend" and has_conv and kind in ("conv", "dense") and not (kind == "dense" and g_dim == 2)


def inverses(convention: str, raw, damping: float, batch_size: int, block_size=128,
             has_conv: bool = False) -> Tuple[Array, Array]:
    """The damped inverses ``(Ainv, Ginv)`` the device's optimizer applies as ``Ginv g Ainv`` (embedding:
    ``diag(Ainv) g Ginv``). ``raw`` is one layer's ``thor_ref`` entry, or a tuple of them (one per
    data-parallel rank): the device all-reduces (mean) the inverses and Ascend's maxima (thor.py
    575-577, 1227-1232). Ascend's max-abs scale ``mean g_max / mean a_max`` is folded into ``Ginv``
    and its conv product factor split evenly over the two (``sqrt`` each): the update is the same, and
    ms_optim's stored inverses are compared in that form."""
    ranks = [raw] if isinstance(raw[0], str) else list(raw)
    parts = [device_inverses(convention, one, damping, batch_size, block_size) for one in ranks]
    a = np.mean([p["a"] for p in parts], axis=0)
    g = np.mean([p["g"] for p in parts], axis=0)
    root = math.sqrt(parts[0]["factor"])
    ratio = 1.0
    if max_scaled(convention, ranks[0][0], g.shape[0], has_conv):
        ratio = np.mean([p["g_max"] for p in parts]) / np.mean([p["a_max"] for p in parts])
    return a * root, g * root * ratio


def effective_factors(convention: str, raw, batch_size: int) -> Tuple[Array, Array]:
    """The factors ms_optim's layers store for ``convention`` (``ms_optim._thor.net.conventions``'s
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


def reference_inverses(convention: str, batch_size: int, has_conv: bool = False):
    """The ``inverses`` hook of ``ThorReference`` for ``convention`` (``has_conv``: the net has a conv layer)."""
    def hook(raw, damping: float) -> Tuple[Array, Array]:
        return inverses(convention, raw, damping, batch_size, has_conv=has_conv)
    return hook


def all_effective(convention: str, raw: Dict[str, tuple], batch_size: int) -> Dict[str, Tuple[Array, Array]]:
    """``effective_factors`` of every layer of a ``thor_ref`` model's ``raw``."""
    return {name: effective_factors(convention, entry, batch_size) for name, entry in raw.items()}
