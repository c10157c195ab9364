r"""Trace-based adaptive inverse updates, the "T" of THOR: ``thor(..., trace_thresholds=...)``.

THOR (Chen et al., AAAI 2021) observes that a layer's block of the Fisher information matrix (FIM)
``F_i = A_{i-1} (x) G_i`` settles during training, and decides per layer, from the change of its
trace, whether its inverse must be recomputed; a stable layer keeps its inverse and the spacing of
its updates grows. MindSpore's ``nn.thor`` implements only the fixed ``frequency``. The rule as
implemented here: the paper's quantity (the relative change of the trace of the layer's FIM block)
against two thresholds ``omega_1 >= omega_2``; how the band between them stretches a layer's interval
is ms_optim's choice. ``trace_thresholds=None`` keeps the fixed schedule exactly (every layer
re-inverted on every THOR step ``t % frequency == 0``).

On every THOR step ``k``, for every THOR layer ``i``, with ``A_{i-1}``, ``G_i`` its factors of this step
(``G`` divided by the loss scale, both mean all-reduced over data-parallel ranks BEFORE the decision,
so every rank decides the same), and ``||F||_tr`` the trace, ``||A (x) G||_tr = ||A||_tr ||G||_tr``
(an embedding's diagonal A: the sum of its entries):

.. code-block:: text

    T_i^k   = ||A_{i-1}^k||_tr * ||G_i^k||_tr                  the trace of the layer's FIM block
    Delta_i = | T_i^k - T_i^last | / T_i^last                  T_i^last: T at the layer's last inversion
    c_i    <- c_i + 1                                          THOR steps since that inversion
    refresh_i = n_inv_i == 0                                   never inverted yet (step 0)
             or not (Delta_i < omega_1)                        large change (also Delta NaN/inf, T^last = 0)
             or (not (Delta_i < omega_2) and c_i >= m_i)       moderate change, and the layer's interval
                                                               is due
    if refresh_i:   (A_{i-1} + lam I)^-1, (G_i + lam I)^-1 recomputed and stored (as the fixed schedule does)
                    T_i^last <- T_i^k;  c_i <- 0;  n_inv_i <- n_inv_i + 1
                    m_i <- 1 if (large change or first inversion) else min(2 m_i, 2**30)
    else:           the stored inverses are kept (no inversion is computed)

``0 <= omega_2 <= omega_1``; ``trace_thresholds=omega`` (one number) means ``omega_1 = omega_2 = omega``:
re-invert exactly where ``Delta_i >= omega`` (the middle band is empty). So: a layer whose trace
moved by ``omega_1`` or more is refreshed at once and its interval resets to one THOR step; one that
moved by at least ``omega_2`` is refreshed when its interval ``m_i`` (in THOR steps) has elapsed, and
the interval then doubles; one that moved by less than ``omega_2`` keeps its inverses. Thresholds 0
re-invert every layer on every THOR step (the fixed schedule, bit for bit); very large thresholds
keep the first inverses for the whole run. An inversion whose result is rejected (non-finite or
inaccurate, see ``ms_optim._thor.inversion.preconditioner``) still counts as performed: the layer keeps its
previous inverse and ``T^last`` moves on.

The decision is tensor arithmetic inside the optimizer's compiled step (no host round trip); the
refresh itself runs under a per-layer ``if`` on that Boolean tensor, so a skipped layer costs two
traces and no inversion. The state is Parameters (saved and loaded with the training cell, so a
resumed run decides as the uninterrupted one): per layer ``i``, ``thor_trace_last_<i>`` (float32,
``T^last``), ``thor_trace_since_<i>`` (int32, ``c``), ``thor_trace_interval_<i>`` (int32, ``m``) and
``thor_inversions_<i>`` (int32, ``n_inv``: the inversions performed, for tests and benchmarks).
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ms_optim._validation import check_finite, check_non_negative, describe

__all__ = ["check_trace_thresholds", "TraceSchedule", "decide", "decide_trace", "factor_trace",
           "MAX_INTERVAL"]

#: Cap of the per-layer interval ``m`` (THOR steps), so its doubling never overflows int32.
MAX_INTERVAL = 2**30

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_one(value, cls_name: str, whole) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"For '{cls_name}', the argument 'trace_thresholds' must be None, a number or a pair "
                        f"(omega_1, omega_2) of numbers, but got {describe(whole)}.")
    value = float(value)
    try:
        check_finite("trace_thresholds", value, cls_name)
        check_non_negative("trace_thresholds", value, cls_name)
    except ValueError:
        raise ValueError(f"For '{cls_name}', the argument 'trace_thresholds' must hold finite numbers >= 0, "
                         f"but got {whole!r}.") from None
    if value > _FLOAT32_MAX:
        raise ValueError(f"For '{cls_name}', the argument 'trace_thresholds' must hold float32 numbers "
                         f"(<= {_FLOAT32_MAX:.6g}), but got {whole!r}.")
    return value


def check_trace_thresholds(value, cls_name: str = "thor") -> Optional[Tuple[float, float]]:
    """None, a number ``omega`` (-> ``(omega, omega)``) or a pair ``(omega_1, omega_2)`` with
    ``omega_1 >= omega_2``, all finite and >= 0; returns None or ``(omega_1, omega_2)`` as floats.

    TypeError for another type (a bool, a string, a pair of non-numbers, ...), ValueError for a NaN,
    infinite, negative or beyond-float32 value, a sequence not of length 2, or ``omega_1 < omega_2``;
    every message names 'trace_thresholds' and the value received.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"For '{cls_name}', the argument 'trace_thresholds' must be a number or a pair "
                             f"(omega_1, omega_2), but got a sequence of length {len(value)}: {value!r}.")
        omega_1, omega_2 = (_check_one(v, cls_name, value) for v in value)
        if omega_1 < omega_2:
            raise ValueError(f"For '{cls_name}', the argument 'trace_thresholds' must be (omega_1, omega_2) "
                             f"with omega_1 >= omega_2, but got {value!r}.")
        return omega_1, omega_2
    omega = _check_one(value, cls_name, value)
    return omega, omega


def factor_trace(factor, diagonal: bool):
    """``||F||_tr`` as a float32 scalar: the sum of the diagonal (of the entries of a diagonal factor; of
    every block's diagonal for a factor stored as ``(nblocks, bs, bs)`` diagonal blocks, whose zero
    padding adds nothing)."""
    factor = ops.cast(factor, mstype.float32)
    if diagonal:
        return ops.reduce_sum(factor)
    if factor.ndim == 2:
        return ops.trace(factor)
    nblocks, bs = factor.shape[0], factor.shape[1]
    return ops.reduce_sum(ops.reshape(factor, (nblocks, bs * bs))[:, ::bs + 1])


class TraceSchedule(nn.Cell):
    """The per-layer state and decision of the trace rule (module docstring), for ``num_layers`` layers.

    :func:`decide` ``(schedule, i, a_factor, g_factor, a_diagonal)`` returns ``(refresh, done)``: the Boolean
    scalar tensor ``refresh_i`` and the ``ops.assign`` results of the bookkeeping (``T^last``, ``c``, ``m``,
    ``n_inv``), to order the step on. ``inversions`` (ParameterTuple, ``thor_inversions_<i>``) counts the
    inversions performed per layer.
    """

    def __init__(self, num_layers: int, thresholds: Sequence[float]):
        super().__init__(auto_prefix=False)  # the Parameters keep their names in checkpoints
        self.num_layers = int(num_layers)
        self.thresholds = (float(thresholds[0]), float(thresholds[1]))
        self.omega_1 = Tensor(self.thresholds[0], mstype.float32)
        self.omega_2 = Tensor(self.thresholds[1], mstype.float32)
        n = range(self.num_layers)
        self.last_trace = ParameterTuple([Parameter(Tensor(0.0, mstype.float32), name=f"thor_trace_last_{i}",
                                                    requires_grad=False) for i in n])
        self.since = ParameterTuple([Parameter(Tensor(0, mstype.int32), name=f"thor_trace_since_{i}",
                                               requires_grad=False) for i in n])
        self.interval = ParameterTuple([Parameter(Tensor(1, mstype.int32), name=f"thor_trace_interval_{i}",
                                                  requires_grad=False) for i in n])
        self.inversions = ParameterTuple([Parameter(Tensor(0, mstype.int32), name=f"thor_inversions_{i}",
                                                    requires_grad=False) for i in n])
        self.one = Tensor(1, mstype.int32)
        self.zero = Tensor(0, mstype.int32)
        self.max_interval = Tensor(MAX_INTERVAL, mstype.int32)

    def inversion_counts(self) -> np.ndarray:
        """The inversions performed so far per layer (host side), int64 array of length ``num_layers``."""
        return np.array([int(p.asnumpy()) for p in self.inversions], np.int64)


def decide(schedule: TraceSchedule, i: int, a_factor, g_factor, a_diagonal: bool):
    """The rule for layer ``i`` of ``schedule`` on a THOR step: ``(refresh, done)``, see
    :class:`TraceSchedule`.

    A module function, not a method: GRAPH_MODE resolves it once, whatever the number of optimizers.
    """
    return decide_trace(schedule, i, factor_trace(a_factor, a_diagonal) * factor_trace(g_factor, False))


def decide_trace(schedule: TraceSchedule, i: int, trace_now):
    """:func:`decide` from the layer's FIM-block trace ``trace_now`` (``||A||_tr * ||G||_tr``) itself."""
    last = schedule.last_trace[i]
    delta = ops.abs(trace_now - last) / last
    since = schedule.since[i] + schedule.one
    interval = schedule.interval[i]
    first = ops.equal(schedule.inversions[i], schedule.zero)
    large = ops.logical_or(ops.logical_not(ops.less(delta, schedule.omega_1)), first)
    due = ops.logical_and(ops.logical_not(ops.less(delta, schedule.omega_2)),
                          ops.greater_equal(since, interval))
    refresh = ops.logical_or(large, due)
    grown = ops.minimum(interval * 2, schedule.max_interval)
    new_interval = ops.select(refresh, ops.select(large, schedule.one, grown), interval)
    done = (ops.assign(schedule.last_trace[i], ops.select(refresh, trace_now, last)),
            ops.assign(schedule.since[i], ops.select(refresh, schedule.zero, since)),
            ops.assign(schedule.interval[i], new_interval),
            ops.assign(schedule.inversions[i], schedule.inversions[i] + ops.cast(refresh, mstype.int32)))
    return refresh, done
