"""NumPy float64 oracles of ``thor(..., damping="adaptive")`` (the Levenberg-Marquardt damping rule) and of
``thor(..., learning_rate="adaptive")`` (:class:`AdaptiveLrMixin`: the step from the 2x2 quadratic model, its
curvature calibrated by the loss at a trial point; the formulas are in its docstring).

Written from the formulas in the module docstrings of ``ms_optim/_thor/step/damping.py``,
``momentum_rule.py``, ``quad_model.py`` and ``quadratic_rule.py``, on top of :class:`reference.thor_ref.ThorReference`
(THOR's step). The damping rule, with ``f`` the frequency,
``T = adapt_every``, ``omega = 0.95**T``, ``[lo, hi]`` the bounds:

.. code-block:: text

    first step:  p_l = tr(A_l)/n_A * tr(G_l)/n_G;  d = clip(max(10 * exp(mean log p_l over p_l > 0), 0.03), lo, hi)
    invert if t % f == 0 (this step's factors, which are then stored) or d != d_inv (the stored factors)
    THOR's update
    after every step (a learning-rate schedule; with learning_rate="adaptive" after the adaptation steps):
        delta_j = -lr[t] accum_j;  q = sum_j g_j . delta_j + 1/2 sum_j c_j(delta_j),
            c = <Gb delta, delta Ab> for a Dense weight (Ab, Gb: the stored factors' diagonal blocks),
            c = <g^2 / B, delta^2> for LayerNorm gamma/beta, 0 otherwise
        L1 = loss on the same batch after the update;  rho = (L1 - L0) / q  (-100 if not finite)
        a learning-rate schedule's step is taken back (parameters as before it, accum = 0, the damping below
            multiplied by at least r) when L1 is not finite, L1 - L0 > 2**-16 max(|L0|, |L1|), or q >= 0
            outside rounding noise (the model says the step overshoots); r = 2 after a kept step, doubled
            after each step taken back
    if (t + 1) % T == 0:
            (with learning_rate="adaptive": the trial's ratio against its calibrated model, AdaptiveLrMixin)
        d = d if L0, L1, q finite and |L1 - L0|, |q| <= 2**-16 max(|L0|, |L1|) (rounding noise);
            else clip(d / omega) if rho < 1/4;  clip(d * omega) if rho > 3/4;  else d
            (clip to [lo, hi]; with learning_rate="adaptive" to [max(d of the first step, lo), hi])
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np

from reference.thor_ref import Array, ThorReference

FAILED_RATIO = -100.0  # the reduction ratio recorded when it is not a finite number
REJECTED_GROWTH = 2.0  # a step taken back after a kept one multiplies the damping by at least this
RESOLUTION = 2.0 ** -16  # changes at most this times the loss are rounding noise of a float32 loss


def unresolved(change: float, predicted: float, before: float, after: float) -> bool:
    """Both losses and ``predicted`` finite, ``|change|`` and ``|predicted|`` at most RESOLUTION times the larger
    loss: the step's measurement is noise."""
    if not all(math.isfinite(v) for v in (before, after, predicted)):
        return False
    scale = RESOLUTION * max(abs(before), abs(after))
    return abs(change) <= scale and abs(predicted) <= scale


def damping_factor(rho: float, omega: float) -> float:
    """The Levenberg-Marquardt factor of the damping for a reduction ratio: ``1 / omega`` below 1/4, ``omega``
    above 3/4, else 1."""
    return 1.0 / omega if rho < 0.25 else (omega if rho > 0.75 else 1.0)


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
        self.start: Optional[float] = None  # the first step's damping
        self.floor_at_start = False  # learning_rate="adaptive": the damping never falls below ``start``
        self.d_inv: Optional[float] = None
        self.stored: Dict[str, Tuple[Array, Array]] = {}
        self.dampings, self.ratios, self.changes, self.predicted = [], [], [], []
        self.rejections = []  # the steps taken back
        self.growth = REJECTED_GROWTH  # r: doubled by each step taken back, reset by a kept one
        self.inversion_steps = []

    def damping_now(self, factors):
        if self.d is None:
            self.d = self.start = initial_damping(factors, self.bounds)
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

    def reduction(self, x: Array, y: Array, lr: float) -> Tuple[float, float, float, bool]:
        """``(rho, L1 - L0, q, noise)`` of the adaptation step just taken at learning rate ``lr`` (the adaptive
        learning rate's oracle overrides it with its trial's measurement)."""
        q = self.model_change(lr)
        after, _, _ = self.model.forward_backward(self.params, x, y)
        change = after - self.losses[-1]
        rho = change / q if q != 0 else float("nan")
        noise = unresolved(change, q, self.losses[-1], after)
        return (rho if math.isfinite(rho) else FAILED_RATIO), change, q, noise

    def step(self, x: Array, y: Array) -> Dict[str, Array]:
        t = self.t
        lr = self._at(self.lr)
        before = {name: value.copy() for name, value in self.params.items()}
        super().step(x, y)
        adapting = (t + 1) % self.adapt_every == 0
        factor = 1.0
        if self.floor_at_start:  # the adaptive learning rate measures its own trial (AdaptiveLrMixin)
            if adapting:
                rho, change, q, noise = self.reduction(x, y, lr)
                factor = 1.0 if noise else damping_factor(rho, self.omega)
                self._record(t, rho, change, q)
        else:  # a learning-rate schedule: every step is measured, and taken back when it failed
            rho, change, q, noise = self.reduction(x, y, lr)
            if adapting:
                factor = 1.0 if noise else damping_factor(rho, self.omega)
                self._record(t, rho, change, q)
            after = self.losses[-1] + change
            raised = not math.isfinite(after) or change > RESOLUTION * max(abs(self.losses[-1]), abs(after))
            if raised or not (noise or q < 0):
                self.params = before
                self.moments = {name: np.zeros_like(m) for name, m in self.moments.items()}
                self.rejections.append(t)
                factor = max(factor, self.growth)
                self.growth *= 2.0
            else:
                self.growth = REJECTED_GROWTH
        low = max(self.start, self.bounds[0]) if self.floor_at_start else self.bounds[0]
        self.d = min(max(self.d * factor, low), self.bounds[1])
        self.dampings.append(self.d)
        return self.params

    def _record(self, t: int, rho: float, change: float, q: float) -> None:
        self.ratios.append((t, rho))
        self.changes.append((t, change))
        self.predicted.append((t, q))


# ----------------------------------------------------------------------------- learning_rate="adaptive"
DEGENERATE = 1e-5  # the 2x2 system is singular when det <= DEGENERATE * M00 * M11
KAPPA_MIN, KAPPA_MAX = 1e-4, 1e8  # the calibration's range
MAX_FALL = 0.5  # the calibration falls at most by this factor a step
FAILED_GROWTH = 10.0  # a rejected trial multiplies the calibration by (at least) this


def quadratic_form(m: Array, w) -> float:
    """``w^T M w``, the terms of y left out when ``w[1] = 0`` (a non-finite y entry does not spoil a 1-D step)."""
    cross = 2 * w[0] * w[1] * m[0, 1] + w[1] ** 2 * m[1, 1] if w[1] != 0 else 0.0
    return float(w[0] ** 2 * m[0, 0] + cross)


def solve_coefficients(m: Array, b: Array, kl_clip: Optional[float] = None) -> Tuple[float, float]:
    """``(alpha, beta)`` minimising ``1/2 w^T M w + b^T w`` (2-D when regular and not worse than the 1-D step
    ``(-b0 / M00, 0)``; else the 1-D step; else 0), then the trust region ``w^T M w <= kl_clip``."""
    def model(w):
        return 0.5 * quadratic_form(m, w) + w[0] * b[0] + (w[1] * b[1] if w[1] != 0 else 0.0)

    one_d = np.array([-b[0] / m[0, 0], 0.0]) if m[0, 0] > 0 else None
    if one_d is not None and not (np.all(np.isfinite(one_d)) and math.isfinite(model(one_d))):
        one_d = None
    det = m[0, 0] * m[1, 1] - m[0, 1] ** 2
    w = np.zeros(2) if one_d is None else one_d
    if m[0, 0] > 0 and m[1, 1] > 0 and det > DEGENERATE * m[0, 0] * m[1, 1]:
        two_d = np.array([m[0, 1] * b[1] - m[1, 1] * b[0], m[0, 1] * b[0] - m[0, 0] * b[1]]) / det
        if np.all(np.isfinite(two_d)) and math.isfinite(model(two_d)) and (
                one_d is None or model(two_d) <= model(one_d)):
            w = two_d
    if kl_clip is not None:
        k = quadratic_form(m, w)
        if math.isfinite(k) and k > 0:
            w = w * min(1.0, math.sqrt(kl_clip / k))
    return float(w[0]), float(w[1])


def averaged_coefficients(m: Array, b: Array, momentum: float,
                          kl_clip: Optional[float] = None) -> Tuple[float, float]:
    """``((1 - momentum) (-b0 / M00), momentum)`` when ``M00 > 0`` and that step and its model value are finite,
    else ``(0, 0)``; then the trust region ``w^T M w <= kl_clip``."""
    w = np.zeros(2)
    if m[0, 0] > 0:
        alpha = -b[0] / m[0, 0]
        if math.isfinite(alpha) and math.isfinite(0.5 * alpha ** 2 * m[0, 0] + alpha * b[0]):
            w = np.array([(1.0 - momentum) * alpha, momentum])
    if kl_clip is not None:
        k = quadratic_form(m, w)
        if math.isfinite(k) and k > 0:
            w = w * min(1.0, math.sqrt(kl_clip / k))
    return float(w[0]), float(w[1])


class AdaptiveLrMixin:
    """``learning_rate="adaptive"`` over :class:`ThorReference` (or :class:`AdaptiveThorReference`), written from
    the formulas of ``ms_optim/_thor/adaptive_lr.py``'s docstring. On step t, with ``x = -u`` (the preconditioned
    gradient after decay and clip), ``y`` the previous update, ``h = g + wd w`` (decayed parameters), ``d`` the
    step's damping and ``kappa`` the calibration (1 at first):

    .. code-block:: text

        K(a, b) = sum_j c_j(a_j, b_j)  (the stored factors of the last THOR step);  N = <a, b>;  W = N on decayed
        M(k) = k (K + d N) + wd W;  b = [<h,x>, <h,y>];  e = [<g,x>, <g,y>]
        step(M, b) = solve(M, b) with momentum="adaptive", else ((1 - mu) (-b0 / M00), mu) (0 when no finite
            1-D step), then the trust region
        trial   (a0, b0) = step(M(kappa), b);  p = a0 x + b0 y;  L_p = loss(w + p) on the step's batch
        c = 2 (L_p - L0 - (a0 e0 + b0 e1));  k_d = [a0 b0](K + d N)[a0 b0]^T;  m = c / k_d
        kappa' = clip(m, max(0.5 kappa, 1e-4), 1e8) if k_d > 0 else kappa
        noise (L_p, c finite, |L_p - L0| and |a0 e0 + b0 e1 + k_d / 2| <= 2**-16 max(|L0|, |L_p|)):
            kappa' = max(0.5 kappa, 1e-4), not rejected, no damping update
        rejected (else, L_p > L0, or L_p / c not finite): kappa' = max(min(10 kappa, 1e8), kappa' if c finite);
            (0, 0)
        else (alpha, beta) = step(M(kappa'), b);  w <- w + alpha x + beta y;  y <- alpha x + beta y
        damping="adaptive", adaptation step: q := a0 e0 + b0 e1 + kappa k_d / 2 (kappa: the trial's),
            rho = (L_p - L0) / q (-100 if L_p, c or rho not finite, k_d <= 0 or q >= 0), L1 - L0 := L_p - L0,
            no damping update on a noise step; the damping never falls below the first step's

    Records per step: ``alphas``, ``betas`` (the final step), ``trials`` ((a0, b0)), ``kappas`` (kappa after the
    step), ``measured`` (m, NaN where k_d <= 0), ``rejected``, ``trial_losses`` (L_p), ``curvatures`` ((c, k_d))
    and ``systems`` (``dict(K, N, W, b, e, d, M)``, 2x2 matrices and 2-vectors; ``M`` the trial's M(kappa));
    ``moments`` hold the previous update."""

    def _init_adaptive_lr(self, momentum) -> None:
        self.momentum_rule = momentum  # "adaptive" or mu
        self.floor_at_start = True
        self.kappa = 1.0
        self.alphas, self.betas, self.trials, self.kappas, self.measured = [], [], [], [], []
        self.rejected, self.trial_losses, self.curvatures, self.systems = [], [], [], []

    def step(self, x: Array, y: Array) -> Dict[str, Array]:
        self.batch = (x, y)  # the trial's loss is measured on the step's own batch
        return super().step(x, y)

    def reduction(self, x: Array, y: Array, lr: float) -> Tuple[float, float, float, bool]:
        return self.measurement

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

    def _system(self, new, grads, damping) -> Tuple[dict, Dict[str, Array], Dict[str, Array]]:
        """The 2x2 terms (K, N, W, b, e) and the directions x, y of this step."""
        xs, ys = {}, {}
        k, n, w_m = np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2))
        b, e = np.zeros(2), np.zeros(2)
        for pname, v in new.items():
            w = self.params[pname]
            decay = self.weight_decay > 0 and self.decay_filter(pname)
            u = v + self.weight_decay * w if decay else v
            if self.enable_clip_grad:
                u = u / max(np.linalg.norm(u), 1.0)
            pair = (-u, self.moments[pname])
            xs[pname], ys[pname] = pair
            h = grads[pname] + self.weight_decay * w if decay else grads[pname]
            for i in range(2):
                b[i] += float(np.sum(h * pair[i]))
                e[i] += float(np.sum(grads[pname] * pair[i]))
                for j in range(2):
                    dot = float(np.sum(pair[i] * pair[j]))
                    k[i, j] += self.curvature(pname, pair[i], pair[j], grads[pname])
                    n[i, j] += dot
                    w_m[i, j] += dot if self.decay_filter(pname) else 0.0  # (times wd in M: 0 without decay)
        return dict(K=k, N=n, W=w_m, b=b, e=e, d=damping), xs, ys

    def coefficients(self, m: Array, b: Array) -> Tuple[float, float]:
        """``step(M, b)``: the 2x2 solve with momentum="adaptive", else the averaged step."""
        if self.momentum_rule == "adaptive":
            return solve_coefficients(m, b, self.kl_clip)
        return averaged_coefficients(m, b, self.momentum_rule, self.kl_clip)

    def model_matrix(self, system: dict, kappa: float) -> Array:
        """``M(kappa) = kappa (K + d N) + wd W``."""
        return kappa * (system["K"] + system["d"] * system["N"]) + self.weight_decay * system["W"]

    def update(self, new, grads, damping, factors) -> None:
        if self.t % self.frequency == 0:
            self.curvature_factors = factors
        system, xs, ys = self._system(new, grads, damping)
        kappa = self.kappa
        system["M"] = self.model_matrix(system, kappa)
        a0, b0 = self.coefficients(system["M"], system["b"])
        trial = {p: self.params[p] + a0 * xs[p] + b0 * ys[p] for p in new}
        loss_trial, _, _ = self.model.forward_backward(trial, *self.batch)
        change = loss_trial - self.losses[-1]
        linear = a0 * system["e"][0] + (b0 * system["e"][1] if b0 != 0 else 0.0)
        c = 2.0 * (change - linear)
        k_d = quadratic_form(system["K"] + damping * system["N"], (a0, b0))
        m = c / k_d if k_d > 0 else float("nan")
        new_kappa = min(max(m, max(MAX_FALL * kappa, KAPPA_MIN)), KAPPA_MAX) if k_d > 0 else kappa
        finite = math.isfinite(loss_trial) and math.isfinite(c)
        noise = finite and unresolved(change, linear + 0.5 * k_d, self.losses[-1], loss_trial)
        rejected = (not finite or change > 0) and not noise
        if noise:
            new_kappa = max(MAX_FALL * kappa, KAPPA_MIN)
        if rejected:
            grown = min(FAILED_GROWTH * kappa, KAPPA_MAX)
            new_kappa = max(grown, new_kappa) if finite else grown
            alpha, beta = 0.0, 0.0
        else:
            alpha, beta = self.coefficients(self.model_matrix(system, new_kappa), system["b"])
        for p in new:
            s = alpha * xs[p] + beta * ys[p]
            self.params[p] = self.params[p] + s
            self.moments[p] = s
        calibrated = linear + 0.5 * kappa * k_d  # the change the trial's own (calibrated) model predicted
        rho = change / calibrated if calibrated != 0 else float("nan")
        usable = finite and k_d > 0 and calibrated < 0 and math.isfinite(rho)
        self.measurement = (rho if usable else FAILED_RATIO, change, calibrated, noise)
        self.kappa = new_kappa
        self.systems.append(system)
        self.trials.append((a0, b0))
        self.alphas.append(alpha)
        self.betas.append(beta)
        self.kappas.append(new_kappa)
        self.measured.append(m)
        self.rejected.append(rejected)
        self.trial_losses.append(loss_trial)
        self.curvatures.append((c, k_d))


class AdaptiveLrThorReference(AdaptiveLrMixin, ThorReference):
    """``learning_rate="adaptive"`` with a damping schedule."""

    def __init__(self, model, params, damping, momentum="adaptive", **kwargs):
        super().__init__(model, params, [0.0], damping, 0.0, **kwargs)
        self._init_adaptive_lr(momentum)


class AdaptiveLrDampingReference(AdaptiveLrMixin, AdaptiveThorReference):
    """``learning_rate="adaptive"`` with ``damping="adaptive"`` (kfac-jax's default combination)."""

    def __init__(self, model, params, momentum="adaptive", **kwargs):
        super().__init__(model, params, [0.0], 0.0, **kwargs)
        self._init_adaptive_lr(momentum)
