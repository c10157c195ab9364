"""Float64 NumPy reference of the Lamb update, written from the formula (not from ms_optim's code).

At step t = 1, 2, ... for each parameter w with gradient g, learning rate lr and weight decay wd:

    m = b1*m + (1-b1)*g
    v = b2*v + (1-b2)*g^2
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd*w
    w = w - lr * ratio * r,   ratio = ||w|| / ||r||, or 1 where either norm is 0 (no clamp)
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


def trust_ratio(w: np.ndarray, u: np.ndarray) -> float:
    """||w|| / ||u||, 1.0 where either norm is 0."""
    w_norm = float(np.linalg.norm(w))
    u_norm = float(np.linalg.norm(u))
    return w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0


def centralize(g: np.ndarray) -> np.ndarray:
    """Gradient centralization as documented for MindSpore's optimizers: for tensors of rank > 1
    whose second dimension is a multiple of 16, subtract the mean over all axes but the first."""
    if g.ndim > 1 and g.shape[1] % 16 == 0:
        return g - g.mean(axis=tuple(range(1, g.ndim)), keepdims=True)
    return g


class LambReference:
    """Lamb state for a list of parameters, all in float64."""

    def __init__(self, params: Sequence[np.ndarray], beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6):
        self.w: List[np.ndarray] = [np.asarray(p, np.float64).copy() for p in params]
        self.m = [np.zeros_like(w) for w in self.w]
        self.v = [np.zeros_like(w) for w in self.w]
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.t = 0

    def step(self, grads: Sequence[np.ndarray], lrs: Sequence[float], wds: Sequence[float]) -> List[np.ndarray]:
        """One step; ``lrs``/``wds``: this step's learning rate and weight decay of every parameter."""
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
            r = (self.m[i] / (1 - b1 ** self.t)) / (np.sqrt(self.v[i] / (1 - b2 ** self.t)) + self.eps)
            r = r + wds[i] * self.w[i]
            self.w[i] = self.w[i] - lrs[i] * trust_ratio(self.w[i], r) * r
        return self.w
