"""NumPy float64 oracle of THOR's trace rule (``thor(..., trace_thresholds=...)``), written from the
rule in ``ms_optim/_thor/trace.py``'s docstring, not from the implementation:

.. code-block:: text

    on a THOR step, per layer i:  T = tr(A) tr(G)   (embedding A: sum of its diagonal)
        Delta = |T - T_last| / T_last;  c <- c + 1
        large = n_inv == 0 or not Delta < omega_1;  due = not Delta < omega_2 and c >= m
        if large or due: re-invert;  T_last <- T;  c <- 0;  n_inv += 1;  m <- 1 if large else min(2 m, 2**30)

``decisions`` maps every THOR step t to ``{layer: (Delta, refreshed, band)}`` with ``band`` one of
``"first"``, ``"large"``, ``"due"``, ``"skip-mid"`` (moderate change, interval not due), ``"skip-low"``.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import numpy as np

from reference.thor_ref import ThorReference

MAX_INTERVAL = 2**30


class ThorTraceReference(ThorReference):
    """``ThorReference`` whose THOR steps re-invert only the layers the trace rule selects."""

    def __init__(self, *args, trace_thresholds=(0.0, 0.0), **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(trace_thresholds, (int, float)):
            trace_thresholds = (trace_thresholds, trace_thresholds)
        self.omega_1, self.omega_2 = (float(v) for v in trace_thresholds)
        names = [name for name, _ in self.model.layers]
        self.last_trace = {n: 0.0 for n in names}
        self.since = {n: 0 for n in names}
        self.interval = {n: 1 for n in names}
        self.inversions = {n: 0 for n in names}
        self.decisions: Dict[int, Dict[str, Tuple[float, bool, str]]] = {}

    def refresh_layer(self, name, kind, factors) -> bool:
        a, g = factors
        trace = float(np.sum(a) if kind == "embedding" else np.trace(a)) * float(np.trace(g))
        last = self.last_trace[name]
        delta = abs(trace - last) / last if last != 0 else math.inf
        self.since[name] += 1
        first = self.inversions[name] == 0
        large = first or not delta < self.omega_1
        due = (not delta < self.omega_2) and self.since[name] >= self.interval[name]
        refresh = large or due
        if refresh:
            self.last_trace[name] = trace
            self.since[name] = 0
            self.inversions[name] += 1
            self.interval[name] = 1 if large else min(2 * self.interval[name], MAX_INTERVAL)
        band = ("first" if first else "large" if large else "due" if due
                else "skip-mid" if not delta < self.omega_2 else "skip-low")
        self.decisions.setdefault(self.t, {})[name] = (delta, refresh, band)
        return refresh
