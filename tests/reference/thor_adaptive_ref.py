"""NumPy float64 oracle of ``thor(..., damping="adaptive")``: the Levenberg-Marquardt damping rule.

Written from the formulas of ``ms_optim/_thor/adaptive.py`` and ``ms_optim/_thor/quad_model.py`` (module
docstrings), on top of :class:`reference.thor_ref.ThorReference` (THOR's step). With ``f`` the frequency,
``T = adapt_every``, ``omega = 0.95**T``, ``[lo, hi]`` the bounds:

.. code-block:: text

    first step:  p_l = tr(A_l)/n_A * tr(G_l)/n_G;  d = clip(10 * exp(mean log p_l over p_l > 0), lo, hi)
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
    """``clip(10 * geometric mean over the layers of tr(A)/n_A * tr(G)/n_G, lo, hi)`` (0.03 if none > 0)."""
    logs = []
    for a, g in factors.values():
        a_mean = float(np.sum(a)) / a.shape[0] if a.ndim == 1 else float(np.trace(a)) / a.shape[0]
        product = a_mean * float(np.trace(g)) / g.shape[0]
        if math.isfinite(product) and product > 0:
            logs.append(math.log(product))
    guess = 10.0 * math.exp(sum(logs) / len(logs)) if logs else 0.03
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

    def step(self, x: Array, y: Array) -> Dict[str, Array]:
        t = self.t
        lr = float(self.lr[0] if self.lr.size == 1 else self.lr[t])
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
