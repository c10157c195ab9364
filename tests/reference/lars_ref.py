"""Float64 NumPy reference of LARS and of the optimizers it wraps, written from the formulas.

LARS, for a parameter the filter keeps (wd: the wrapped optimizer's weight decay for it, 0 if none):

    c = coefficient * ||w|| / (||g|| + wd*||w|| + epsilon),   1 where ||w|| == 0 or ||g|| == 0
    c = min(c / lr, 1)                                        with use_clip
    g' = c * (g + wd*w)

and the wrapped optimizer then updates w from g' without weight decay. A rejected parameter
passes g through unchanged (and gets no weight decay).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


def lars_gradient(w: np.ndarray, g: np.ndarray, lr: float, wd: float, coefficient: float, epsilon: float,
                  use_clip: bool) -> np.ndarray:
    """The gradient LARS hands to the wrapped optimizer for a parameter it keeps."""
    w = np.asarray(w, np.float64)
    g = np.asarray(g, np.float64)
    w_norm = float(np.linalg.norm(w))
    g_norm = float(np.linalg.norm(g))
    if w_norm > 0 and g_norm > 0:
        c = coefficient * w_norm / (g_norm + wd * w_norm + epsilon)
    else:
        c = 1.0
    if use_clip:
        c = min(c / lr, 1.0)
    return c * (g + wd * w)


class MomentumReference:
    """mindspore.nn.Momentum: g += wd*w; m_new = momentum*m + g; w -= lr*m_new. With Nesterov, as
    MindSpore 2.10's CPU ApplyMomentum kernel runs it (measured, see the test of this reference):
    w -= lr*(g + momentum*m_old), with the accumulation from before the update."""

    def __init__(self, params: Sequence[np.ndarray], momentum: float, use_nesterov: bool = False):
        self.w: List[np.ndarray] = [np.asarray(p, np.float64).copy() for p in params]
        self.m = [np.zeros_like(w) for w in self.w]
        self.momentum, self.nesterov = momentum, use_nesterov

    def step(self, grads: Sequence[np.ndarray], lrs: Sequence[float], wds: Sequence[float]) -> List[np.ndarray]:
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64) + wds[i] * self.w[i]
            m_old = self.m[i]
            self.m[i] = self.momentum * m_old + g
            delta = g + self.momentum * m_old if self.nesterov else self.m[i]
            self.w[i] = self.w[i] - lrs[i] * delta
        return self.w


class SGDReference:
    """mindspore.nn.SGD as documented: g += wd*w; on the first step accum = g, afterwards
    accum = momentum*accum + (1-dampening)*g; w -= lr*accum (Nesterov: w -= lr*(g + momentum*accum))."""

    def __init__(self, params: Sequence[np.ndarray], momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False):
        self.w: List[np.ndarray] = [np.asarray(p, np.float64).copy() for p in params]
        self.accum = [np.zeros_like(w) for w in self.w]
        self.momentum, self.dampening, self.nesterov = momentum, dampening, nesterov
        self.first = True

    def step(self, grads: Sequence[np.ndarray], lrs: Sequence[float], wds: Sequence[float]) -> List[np.ndarray]:
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64) + wds[i] * self.w[i]
            if self.momentum > 0:
                if self.first:
                    self.accum[i] = g
                else:
                    self.accum[i] = self.momentum * self.accum[i] + (1 - self.dampening) * g
                delta = g + self.momentum * self.accum[i] if self.nesterov else self.accum[i]
            else:
                delta = g
            self.w[i] = self.w[i] - lrs[i] * delta
        self.first = False
        return self.w


class LarsReference:
    """LARS around one of the references above (``inner``: its own weight decay is not used)."""

    def __init__(self, inner, keep: Sequence[bool], coefficient: float = 0.001, epsilon: float = 1e-5,
                 use_clip: bool = False):
        self.inner, self.keep = inner, list(keep)
        self.coefficient, self.epsilon, self.use_clip = coefficient, epsilon, use_clip

    @property
    def w(self) -> List[np.ndarray]:
        return self.inner.w

    def step(self, grads: Sequence[np.ndarray], lrs: Sequence[float], wds: Sequence[float]) -> List[np.ndarray]:
        """``wds``: the wrapped optimizer's weight decay of every parameter (0 where it has none)."""
        new_grads = []
        for i, g in enumerate(grads):
            if self.keep[i]:
                new_grads.append(lars_gradient(self.inner.w[i], g, lrs[i], wds[i], self.coefficient,
                                               self.epsilon, self.use_clip))
            else:
                new_grads.append(np.asarray(g, np.float64))
        return self.inner.step(new_grads, lrs, [0.0] * len(new_grads))
