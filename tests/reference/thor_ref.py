"""NumPy float64 oracle of a whole THOR step: the specification the optimizer is tested against.

It is written from the documented algorithm (``ms_optim/_thor/optimizer.py`` module docstring),
not from the implementation. One :class:`ThorReference` step on a batch:

.. code-block:: text

    loss, grads, (A_l, G_l) <- forward/backward of the test net (loss = mean softmax cross-entropy);
                               the factors only matter on THOR steps, the step's own batch
    lam <- sqrt(damping[t])
    if t % f == 0: Ainv_l, Ginv_l <- blockwise (F_k + lam I)^-1 over the 128-wide diagonal blocks
                   (last smaller; whole matrix for inverse="full"); embedding A: 1 / (a + lam)
    Dense/Conv weight g <- Ginv g Ainv (conv as out x (in*kh*kw)); embedding g <- diag(Ainv) g Ginv;
    LayerNorm gamma/beta g <- g / (g^2 / batch_size + lam); others unchanged
    KL clip (kl_clip = c not None; v the preconditioned gradients above, g the raw ones, all parameters):
        q <- lr[t]^2 |sum_p v_p . g_p|;  nu <- min(1, sqrt(c / q)) if q finite and > 0 else 1;  v <- nu v
    g <- g + wd * w (decay_filter), g <- g / max(||g||, 1) (clip), accum <- m accum + g,
    w <- w - lr[t] * accum (Nesterov: w <- w - lr[t] * (g + m accum)); t <- t + 1

Factors (the layers' documented formulas, from ``reference.thor_factors``; N rows, d = dL/ds, B the
batch, T positions): Dense ``A = a^T a / N``, ``G = N d^T d``; Conv2d ``A = sum p p^T / (B T)``,
``G = B sum d d^T``; Embedding ``A = counts / N`` (diagonal), ``G = N d^T d``. The loss scale does not appear: the
oracle is the unscaled trajectory, which every loss scale must reproduce.

The three test nets (``MLPRef``, ``ConvRef``, ``EmbedRef``) mirror the MindSpore nets built in
``tests/thor/test_thor_optimizer.py`` parameter for parameter (same names). Each also keeps, in ``raw``,
the material of every layer's factors of its last pass (``("dense", a, d)``, ``("conv", x, dout,
conv_args)``, ``("embedding", ids, d, vocab)``), for oracles of other factor conventions
(``reference.thor_conventions``), which ``ThorReference(..., inverses=...)`` then uses.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from reference import thor_factors as tf  # the layers' factor formulas and im2col (one specification)

Array = np.ndarray


# ----------------------------------------------------------------------------------- building blocks
def softmax_xent(logits: Array, labels: Array) -> Tuple[float, Array]:
    """Mean sparse softmax cross-entropy and its gradient w.r.t. the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))  # log-softmax: finite however far a logit falls
    n = logits.shape[0]
    loss = -np.mean(log_p[np.arange(n), labels])
    d = np.exp(log_p)
    d[np.arange(n), labels] -= 1.0
    return float(loss), d / n


def layernorm_forward(x: Array, gamma: Array, beta: Array, eps: float):
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * inv
    return gamma * xhat + beta, (xhat, inv)


def layernorm_backward(dy: Array, gamma: Array, cache):
    xhat, inv = cache
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dxhat = dy * gamma
    dx = inv * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def block_inverse(factor: Array, lam: float, block_size: Optional[int]) -> Array:
    """Block-diagonal ``(F_k + lam I)^-1`` as a full matrix (off-diagonal blocks zero)."""
    n = factor.shape[0]
    bs = n if block_size is None else min(block_size, n)
    out = np.zeros_like(factor)
    for start in range(0, n, bs):
        stop = min(start + bs, n)
        blk = factor[start:stop, start:stop] + lam * np.eye(stop - start)
        out[start:stop, start:stop] = np.linalg.inv(blk)
    return out


# ----------------------------------------------------------------------------------- test nets
class MLPRef:
    """``fc1`` Dense(in, hidden, relu) -> ``fc2`` Dense(hidden, classes), biases; CE loss."""

    layers = (("fc1", "dense"), ("fc2", "dense"))

    def forward_backward(self, p: Dict[str, Array], x: Array, y: Array):
        s1 = x @ p["fc1.weight"].T + p["fc1.bias"]
        h1 = np.maximum(s1, 0.0)
        s2 = h1 @ p["fc2.weight"].T + p["fc2.bias"]
        loss, d2 = softmax_xent(s2, y)
        d1 = (d2 @ p["fc2.weight"]) * (s1 > 0)
        grads = {"fc2.weight": d2.T @ h1, "fc2.bias": d2.sum(0), "fc1.weight": d1.T @ x, "fc1.bias": d1.sum(0)}
        factors = {"fc1": tf.dense_factors(x, d1), "fc2": tf.dense_factors(h1, d2)}
        self.raw = {"fc1": ("dense", x, d1), "fc2": ("dense", h1, d2)}
        return loss, grads, factors


class ConvRef:
    """``conv`` Conv2d (pad mode 'pad' unless given, bias) -> ReLU -> flatten -> ``fc`` Dense(., classes); CE loss."""

    layers = (("conv", "conv"), ("fc", "dense"))

    def __init__(self, kernel, stride, dilation, padding, pad_mode="pad"):
        self.conv_args = dict(kernel_size=kernel, stride=stride, dilation=dilation, pad_mode=pad_mode, padding=padding)

    def forward_backward(self, p: Dict[str, Array], x: Array, y: Array):
        w = p["conv.weight"]
        out_c = w.shape[0]
        _, (ho, wo) = tf.conv_geometry(x.shape[2], x.shape[3], **self.conv_args)
        patches = tf.im2col(x, **self.conv_args)                         # (B, T, C*kh*kw)
        s = patches @ w.reshape(out_c, -1).T + p["conv.bias"]          # (B, T, out)
        h = np.maximum(s, 0.0)
        b = x.shape[0]
        flat = h.transpose(0, 2, 1).reshape(b, -1)                      # NCHW flatten
        logits = flat @ p["fc.weight"].T + p["fc.bias"]
        loss, d_fc = softmax_xent(logits, y)
        d_flat = d_fc @ p["fc.weight"]
        d_s = d_flat.reshape(b, out_c, ho * wo).transpose(0, 2, 1) * (s > 0)
        grads = {"fc.weight": d_fc.T @ flat, "fc.bias": d_fc.sum(0),
                 "conv.weight": np.einsum("bto,btk->ok", d_s, patches).reshape(w.shape),
                 "conv.bias": d_s.sum((0, 1))}
        d_nchw = d_s.transpose(0, 2, 1).reshape(b, out_c, ho, wo)
        factors = {"conv": tf.conv_factors(x, d_nchw, **self.conv_args), "fc": tf.dense_factors(flat, d_fc)}
        self.raw = {"conv": ("conv", x, d_nchw, self.conv_args), "fc": ("dense", flat, d_fc)}
        return loss, grads, factors


class EmbedRef:
    """``emb`` Embedding -> flatten tokens -> ``fc1`` Dense -> ``ln`` LayerNorm -> ReLU -> ``fc2``; CE."""

    layers = (("emb", "embedding"), ("fc1", "dense"), ("fc2", "dense"))

    def __init__(self, eps: float = 1e-7):
        self.eps = eps

    def forward_backward(self, p: Dict[str, Array], ids: Array, y: Array):
        table = p["emb.embedding_table"]
        vocab, dim = table.shape
        b, t = ids.shape
        e = table[ids]                                                  # (B, T, E)
        x = e.reshape(b, t * dim)
        s1 = x @ p["fc1.weight"].T + p["fc1.bias"]
        z, cache = layernorm_forward(s1, p["ln.gamma"], p["ln.beta"], self.eps)
        h = np.maximum(z, 0.0)
        s2 = h @ p["fc2.weight"].T + p["fc2.bias"]
        loss, d2 = softmax_xent(s2, y)
        dh = (d2 @ p["fc2.weight"]) * (z > 0)
        d1, dgamma, dbeta = layernorm_backward(dh, p["ln.gamma"], cache)
        dx = d1 @ p["fc1.weight"]
        de = dx.reshape(b * t, dim)
        dtable = np.zeros_like(table)
        np.add.at(dtable, ids.reshape(-1), de)
        grads = {"fc2.weight": d2.T @ h, "fc2.bias": d2.sum(0), "ln.gamma": dgamma, "ln.beta": dbeta,
                 "fc1.weight": d1.T @ x, "fc1.bias": d1.sum(0), "emb.embedding_table": dtable}
        factors = {"emb": tf.embedding_factors(ids, de, vocab), "fc1": tf.dense_factors(x, d1),
                   "fc2": tf.dense_factors(h, d2)}
        self.raw = {"emb": ("embedding", ids, de, vocab), "fc1": ("dense", x, d1), "fc2": ("dense", h, d2)}
        return loss, grads, factors


# ----------------------------------------------------------------------------------- the optimizer
class ThorReference:
    """THOR in float64. ``params``: name -> array (the MindSpore net's initial values).

    ``layer_params`` maps a layer name to its weight name is implicit: ``<layer>.weight`` or
    ``<layer>.embedding_table``; ``layernorm`` lists the LayerNorm cell names.
    """

    def __init__(self, model, params: Dict[str, Array], lr: Sequence[float], damping: Sequence[float],
                 momentum: float, weight_decay: float = 0.0, batch_size: int = 32, use_nesterov: bool = False,
                 decay_filter: Callable[[str], bool] = lambda name: True, enable_clip_grad: bool = False,
                 frequency: int = 100, block_size: Optional[int] = 128, layernorm: Sequence[str] = (),
                 kl_clip: Optional[float] = None, inverses: Optional[Callable] = None):
        """``inverses``: None (the factors above), or ``inverses(raw, damping) -> (Ainv, Ginv)`` computing a
        layer's inverses from its ``model.raw`` entry and the step's damping (another factor convention)."""
        self.model = model
        self.inverses = inverses
        self.params = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
        self.moments = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr = np.atleast_1d(np.asarray(lr, np.float64))
        self.damping = np.atleast_1d(np.asarray(damping, np.float64))
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.use_nesterov = use_nesterov
        self.decay_filter = decay_filter
        self.enable_clip_grad = enable_clip_grad
        self.frequency = frequency
        self.block_size = block_size
        self.layernorm = tuple(layernorm)
        self.kl_clip = kl_clip
        self.kl_nu = []  # the KL-clip factor of every step (tests check whether clipping was active)
        self.t = 0
        self.a_inv: Dict[str, Array] = {}
        self.g_inv: Dict[str, Array] = {}
        self.losses = []
        self.clipped = 0  # how many tensors the clip changed (tests check that the feature was exercised)

    def refresh_layer(self, name: str, kind: str, factors: Tuple[Array, Array]) -> bool:
        """Whether a THOR step re-inverts layer ``name``: always (the fixed schedule); the trace rule's
        oracle (``reference.thor_trace_ref``) overrides it."""
        return True

    def _at(self, schedule: Array) -> float:
        return float(schedule[0] if schedule.size == 1 else schedule[self.t])

    def damping_now(self, factors: Dict[str, Tuple[Array, Array]]) -> float:
        """The damping of step ``t``: ``damping[t]`` (the adaptive rule's oracle overrides it)."""
        return self._at(self.damping)

    def refresh_due(self) -> bool:
        """Whether step ``t`` inverts: a THOR step (the adaptive rule's oracle overrides it)."""
        return self.t % self.frequency == 0

    def inversion_factors(self, factors: Dict[str, Tuple[Array, Array]]) -> Dict[str, Tuple[Array, Array]]:
        """The factors a refresh inverts: this step's (the adaptive rule's oracle overrides it)."""
        return factors

    def step(self, x: Array, y: Array) -> Dict[str, Array]:
        loss, grads, factors = self.model.forward_backward(self.params, x, y)
        self.losses.append(loss)
        self.grads = grads
        damping = self.damping_now(factors)
        lam = math.sqrt(damping)
        if self.refresh_due():
            factors = self.inversion_factors(factors)
            for name, kind in self.model.layers:
                if not self.refresh_layer(name, kind, factors[name]):
                    continue
                if self.inverses is not None:
                    self.a_inv[name], self.g_inv[name] = self.inverses(self.model.raw[name], damping)
                    continue
                a, g = factors[name]
                self.a_inv[name] = 1.0 / (a + lam) if kind == "embedding" else block_inverse(a, lam, self.block_size)
                self.g_inv[name] = block_inverse(g, lam, self.block_size)
        new = {}
        for pname, grad in grads.items():
            owner, leaf = pname.rsplit(".", 1)
            kinds = dict(self.model.layers)
            if owner in kinds and leaf == "weight":
                shape = grad.shape
                g2 = self.g_inv[owner] @ grad.reshape(shape[0], -1) @ self.a_inv[owner]
                grad = g2.reshape(shape)
            elif owner in kinds and leaf == "embedding_table":
                grad = (self.a_inv[owner][:, None] * grad) @ self.g_inv[owner]
            elif owner in self.layernorm:
                grad = grad / (grad ** 2 / self.batch_size + lam)
            new[pname] = grad
        self.update(new, grads, damping, factors)
        self.t += 1
        return self.params

    def update(self, new: Dict[str, Array], grads: Dict[str, Array], damping: float,
               factors: Dict[str, Tuple[Array, Array]]) -> None:
        """From the preconditioned gradients ``new`` on: KL clip, decay, clip, momentum (the adaptive learning
        rate's oracle, ``reference.thor_adaptive_ref``, overrides it)."""
        lr = self._at(self.lr)
        if self.kl_clip is not None:
            q = lr * lr * abs(sum(float(np.sum(new[p] * grads[p])) for p in new))
            nu = min(1.0, math.sqrt(self.kl_clip / q)) if (math.isfinite(q) and q > 0) else 1.0
            self.kl_nu.append(nu)
            new = {p: nu * v for p, v in new.items()}
        for pname, grad in new.items():
            w = self.params[pname]
            if self.weight_decay > 0 and self.decay_filter(pname):
                grad = grad + self.weight_decay * w
            if self.enable_clip_grad:
                norm = np.linalg.norm(grad)
                self.clipped += int(norm > 1.0)
                grad = grad / max(norm, 1.0)
            acc = self.momentum * self.moments[pname] + grad
            self.moments[pname] = acc
            if self.use_nesterov:
                self.params[pname] = w - lr * (grad + self.momentum * acc)
            else:
                self.params[pname] = w - lr * acc
