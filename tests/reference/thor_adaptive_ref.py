"""NumPy float64 oracles of ``thor(..., damping="adaptive")`` (the Levenberg-Marquardt damping rule) and of
``thor(..., learning_rate="adaptive")`` (:class:`AdaptiveLrMixin`: the step from the 2x2 quadratic model).

Written from the formulas of ``ms_optim/_thor/adaptive.py`` and ``ms_optim/_thor/quad_model.py`` (module
docstrings), on top of :class:`reference.thor_ref.ThorReference` (THOR's step). With ``f`` the frequency,
``T = adapt_every``, ``omega = 0.95**T``, ``[lo, hi]`` the bounds:

.. code-block:: text

    first step:  p_l = tr(A_l)/n_A * tr(G_l)/n_G;  d = clip(max(10 * exp(mean log p_l over p_l > 0), 0.03), lo, hi)
    invert if t % f == 0 (this step's factors, which are then stored) or d != d_inv (the stored factors)
    THOR's update
    if (t + 1) % T == 0:
        delta_j = -lr[t] accum_j;  q = sum_j g_j . delta_j + 1/2 sum_j c_j(delta_j),
            c = <Gb delta, delta Ab> for a Dense weight (Ab, Gb: the stored factors' diagonal blocks),
            c = <g^2 / B, delta^2> for LayerNorm gamma/beta, 0 otherwise
        L1 = loss on the same batch after the update;  rho = (L1 - L0) / q  (-100 if not finite)
        d = clip(d / omega) if rho < 1/4;  clip(d * omega) if rho > 3/4;  else d
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from reference.thor_ref import Array, ThorReference


def block_diagonal(factor: Array, block_size: Optional[int]) -> Array:
    """``factor`` with every entry outside its diagonal blocks of ``block_size`` set to 0."""
    n = factor.shape[0]
    bs = n if block_size is None else min(block_size, n)
    out = np.zeros_like(factor)
    for start in range(0, n, bs):
        stop = min(start + bs, n)
        out[start:stop, start:stop] = factor[start:stop, start:stop]
    return out


def initial_damping(factors: Dict[str, Tuple[Array, Array]], bounds: Tuple[float, float]) -> float:
    """``clip(max(10 * geometric mean over the layers of tr(A)/n_A * tr(G)/n_G, 0.03), lo, hi)`` (0.03 if
    none > 0)."""
    logs = []
    for a, g in factors.values():
        a_mean = float(np.sum(a)) / a.shape[0] if a.ndim == 1 else float(np.trace(a)) / a.shape[0]
        product = a_mean * float(np.trace(g)) / g.shape[0]
        if math.isfinite(product) and product > 0:
            logs.append(math.log(product))
    guess = max(10.0 * math.exp(sum(logs) / len(logs)) if logs else 0.03, 0.03)
    return min(max(guess, bounds[0]), bounds[1])


class AdaptiveThorReference(ThorReference):
    """THOR with the adaptive damping rule; records ``dampings`` (after every step), ``ratios``,
    ``changes`` (L1 - L0) and ``predicted`` (q) of every adaptation step, as ``(t, value)``."""

    def __init__(self, model, params, lr, momentum: float, adapt_every: int = 5,
                 bounds: Tuple[float, float] = (1e-8, 1e4), **kwargs):
        super().__init__(model, params, lr, [0.0], momentum, **kwargs)
        self.adapt_every = adapt_every
        self.bounds = bounds
        self.omega = 0.95 ** adapt_every
        self.d: Optional[float] = None
        self.d_inv: Optional[float] = None
        self.stored: Dict[str, Tuple[Array, Array]] = {}
        self.dampings, self.ratios, self.changes, self.predicted = [], [], [], []
        self.inversion_steps = []

    def damping_now(self, factors):
        if self.d is None:
            self.d = initial_damping(factors, self.bounds)
        return self.d

    def refresh_due(self) -> bool:
        return self.t % self.frequency == 0 or self.d != self.d_inv

    def inversion_factors(self, factors):
        if self.t % self.frequency == 0:
            self.stored = factors
        self.d_inv = self.d
        self.inversion_steps.append(self.t)
        return self.stored

    def model_change(self, lr: float) -> float:
        """q of the update just made (module docstring)."""
        q = 0.0
        kinds = dict(self.model.layers)
        for pname, grad in self.grads.items():
            delta = -lr * self.moments[pname]
            q += float(np.sum(grad * delta))
            owner, leaf = pname.rsplit(".", 1)
            if owner in kinds and leaf == "weight":
                a, g = self.stored[owner]
                d2 = delta.reshape(delta.shape[0], -1)
                ab, gb = block_diagonal(a, self.block_size), block_diagonal(g, self.block_size)
                q += 0.5 * float(np.sum((gb @ d2) * (d2 @ ab)))
            elif owner in self.layernorm:
                q += 0.5 * float(np.sum(grad ** 2 / self.batch_size * delta ** 2))
        return q

    def model_lr(self, t: int) -> float:
        """The ``lr`` of ``delta = -lr * accum`` in the quadratic model: the schedule's (the adaptive learning
        rate's oracle: -1, the moments hold the update itself)."""
        return float(self.lr[0] if self.lr.size == 1 else self.lr[t])

    def step(self, x: Array, y: Array) -> Dict[str, Array]:
        t = self.t
        lr = self.model_lr(t)
        super().step(x, y)
        if (t + 1) % self.adapt_every == 0:
            q = self.model_change(lr)
            after, _, _ = self.model.forward_backward(self.params, x, y)
            change = after - self.losses[-1]
            rho = change / q if q != 0 else float("nan")
            rho = rho if math.isfinite(rho) else -100.0
            factor = 1.0 / self.omega if rho < 0.25 else (self.omega if rho > 0.75 else 1.0)
            self.d = min(max(self.d * factor, self.bounds[0]), self.bounds[1])
            self.ratios.append((t, rho))
            self.changes.append((t, change))
            self.predicted.append((t, q))
        self.dampings.append(self.d)
        return self.params


# ----------------------------------------------------------------------------- learning_rate="adaptive"
DEGENERATE = 1e-5  # the 2x2 system is singular when det <= DEGENERATE * M00 * M11


def solve_coefficients(m: Array, b: Array, kl_clip: Optional[float] = None) -> Tuple[float, float]:
    """``(alpha, beta)`` minimising ``1/2 w^T M w + b^T w`` (2-D when regular and not worse than the 1-D step
    ``(-b0 / M00, 0)``; else the 1-D step; else 0), then the trust region ``w^T M w <= kl_clip``."""
    def model(w):
        return 0.5 * curvature_norm(w) + w[0] * b[0] + (w[1] * b[1] if w[1] != 0 else 0.0)

    def curvature_norm(w):  # the terms of y left out when beta = 0
        cross = 2 * w[0] * w[1] * m[0, 1] + w[1] ** 2 * m[1, 1] if w[1] != 0 else 0.0
        return w[0] ** 2 * m[0, 0] + cross

    one_d = np.array([-b[0] / m[0, 0], 0.0]) if m[0, 0] > 0 else None
    if one_d is not None and not (np.all(np.isfinite(one_d)) and math.isfinite(model(one_d))):
        one_d = None
    det = m[0, 0] * m[1, 1] - m[0, 1] ** 2
    w = np.zeros(2) if one_d is None else one_d
    if m[0, 0] > 0 and m[1, 1] > 0 and det > DEGENERATE * m[0, 0] * m[1, 1]:
        two_d = np.array([m[0, 1] * b[1] - m[1, 1] * b[0], m[0, 1] * b[0] - m[0, 0] * b[1]]) / det
        if np.all(np.isfinite(two_d)) and (one_d is None or model(two_d) <= model(one_d)):
            w = two_d
    if kl_clip is not None:
        k = curvature_norm(w)
        if math.isfinite(k) and k > 0:
            w = w * min(1.0, math.sqrt(kl_clip / k))
    return float(w[0]), float(w[1])


class AdaptiveLrMixin:
    """``learning_rate="adaptive"`` over :class:`ThorReference` (or :class:`AdaptiveThorReference`): the update
    of ``ms_optim/_thor/adaptive_lr.py``'s docstring, written from it. Records ``alphas``, ``betas`` and
    ``systems`` (``(M, b)``) of every step; ``moments`` hold the previous update."""

    def model_lr(self, t: int) -> float:
        return -1.0

    def curvature(self, pname: str, a_vec: Array, b_vec: Array, grad: Array) -> float:
        """``c_j(a, b)`` of parameter ``pname`` from the factors of the last THOR step (diagonal blocks)."""
        owner, leaf = pname.rsplit(".", 1)
        kinds = dict(self.model.layers)
        if owner in kinds and leaf == "weight":
            a, g = self.curvature_factors[owner]
            ab, gb = block_diagonal(a, self.block_size), block_diagonal(g, self.block_size)
            a2, b2 = a_vec.reshape(a_vec.shape[0], -1), b_vec.reshape(b_vec.shape[0], -1)
            return float(np.sum((gb @ a2) * (b2 @ ab)))
        if owner in kinds and leaf == "embedding_table":
            a, g = self.curvature_factors[owner]
            return float(np.sum((a[:, None] * a_vec) * (b_vec @ block_diagonal(g, self.block_size))))
        if owner in self.layernorm:
            return float(np.sum(grad ** 2 / self.batch_size * a_vec * b_vec))
        return 0.0

    def update(self, new, grads, damping, factors) -> None:
        if self.t % self.frequency == 0:
            self.curvature_factors = factors
        xs, ys, hs, ridges = {}, {}, {}, {}
        for pname, v in new.items():
            w = self.params[pname]
            decay = self.weight_decay > 0 and self.decay_filter(pname)
            u = v + self.weight_decay * w if decay else v
            if self.enable_clip_grad:
                u = u / max(np.linalg.norm(u), 1.0)
            xs[pname], ys[pname] = -u, self.moments[pname]
            hs[pname] = grads[pname] + self.weight_decay * w if decay else grads[pname]
            ridges[pname] = damping + (self.weight_decay if decay else 0.0)
        m = np.zeros((2, 2))
        b = np.zeros(2)
        for p in new:
            pair = (xs[p], ys[p])
            for i in range(2):
                b[i] += float(np.sum(hs[p] * pair[i]))
                for j in range(2):
                    m[i, j] += self.curvature(p, pair[i], pair[j], grads[p]) + ridges[p] * float(
                        np.sum(pair[i] * pair[j]))
        alpha, beta = solve_coefficients(m, b, self.kl_clip)
        self.systems.append((m, b))
        self.alphas.append(alpha)
        self.betas.append(beta)
        for p in new:
            s = alpha * xs[p] + beta * ys[p]
            self.params[p] = self.params[p] + s
            self.moments[p] = s


class AdaptiveLrThorReference(AdaptiveLrMixin, ThorReference):
    """``learning_rate="adaptive"`` with a damping schedule."""

    def __init__(self, model, params, damping, **kwargs):
        super().__init__(model, params, [0.0], damping, 0.0, **kwargs)
        self.alphas, self.betas, self.systems = [], [], []


class AdaptiveLrDampingReference(AdaptiveLrMixin, AdaptiveThorReference):
    """``learning_rate="adaptive"`` with ``damping="adaptive"`` (kfac-jax's default combination)."""

    def __init__(self, model, params, **kwargs):
        super().__init__(model, params, [0.0], 0.0, **kwargs)
        self.alphas, self.betas, self.systems = [], [], []
