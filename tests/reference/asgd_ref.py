"""Float64 NumPy reference of ASGD as MindSpore's code computes it, written from the formula.

For each parameter w with gradient g, weight decay wd (0 where excluded), learning rate lr_t of
the step (the optimizer's ``get_lr()`` before the step counter moves), t = the step number after
it is incremented (1 at the first step), state eta (0 before step 1, replaced by lr_1 at step 1)
and mu (1 at start):

    g   = g + wd*w                       (then gradient centralization where asked)
    w   = w*(1 - lambd*eta) - eta*g
    ax  = w                  if mu == 1
        = ax + (w - ax)*mu   otherwise
    eta = lr_t / (1 + lambd*lr_t*t)**alpha
    mu  = 1 / max(1, t - t0)
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from reference.lamb_ref import centralize


class ASGDReference:
    """ASGD state for a list of parameters, all in float64 (same ``step`` interface as the others)."""

    def __init__(self, params: Sequence[np.ndarray], lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 centralize_flags: Optional[Sequence[bool]] = None):
        self.w: List[np.ndarray] = [np.asarray(p, np.float64).copy() for p in params]
        self.ax = [np.zeros_like(w) for w in self.w]
        self.eta = [0.0] * len(self.w)
        self.mu = [1.0] * len(self.w)
        self.lambd, self.alpha, self.t0 = lambd, alpha, t0
        self.centralize_flags = list(centralize_flags) if centralize_flags is not None else [False] * len(self.w)
        self.t = 0

    def step(self, grads: Sequence[np.ndarray], lrs: Sequence[float], wds: Sequence[float]) -> List[np.ndarray]:
        """One step; ``lrs``/``wds``: this step's learning rate and weight decay of every parameter."""
        self.t += 1
        t = self.t
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64) + wds[i] * self.w[i]
            if self.centralize_flags[i]:
                g = centralize(g)
            eta = lrs[i] if t == 1 else self.eta[i]
            self.w[i] = self.w[i] * (1.0 - self.lambd * eta) - eta * g
            if self.mu[i] == 1.0:
                self.ax[i] = self.w[i].copy()
            else:
                self.ax[i] = self.ax[i] + (self.w[i] - self.ax[i]) * self.mu[i]
            self.eta[i] = lrs[i] / (1.0 + self.lambd * lrs[i] * t) ** self.alpha
            self.mu[i] = 1.0 / max(1.0, t - self.t0)
        return self.w
