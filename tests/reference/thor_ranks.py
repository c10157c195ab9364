"""NumPy float64 oracle of data-parallel THOR: R ranks, each with its own shard of the global batch.

``ShardedModel(model, ranks, convention, batch_size)`` wraps a ``thor_ref`` test net so that
``ThorReference`` replays a data-parallel run: ``forward_backward`` splits the batch into ``ranks``
equal consecutive shards (rank r takes the r-th), runs the net on each, and returns the mean loss and
the mean gradients (``gradients_mean=True``). ``raw[name]`` is the tuple of the ranks' entries, which
``reference.thor_conventions.inverses`` turns into the mean of the ranks' inverses (MindSpore's rule
for gpu/ascend); the returned factors are the mean of the ranks' effective factors of ``convention``
(what the trace rule of ``reference.thor_trace_ref`` decides from: the trace is linear, so this is
the mean of the ranks' traces).
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from reference.thor_conventions import effective_factors


class ShardedModel:
    """A ``thor_ref`` net run on ``ranks`` shards of every batch (module docstring)."""

    def __init__(self, model, ranks: int, convention: str, batch_size: int):
        self.model = model
        self.ranks = int(ranks)
        self.convention = convention
        self.batch_size = batch_size
        self.layers = model.layers
        self.raw: Dict[str, tuple] = {}

    def forward_backward(self, params, x, y):
        size = x.shape[0] // self.ranks
        losses, grads, raws = [], [], []
        for r in range(self.ranks):
            loss, grad, _ = self.model.forward_backward(params, x[r * size:(r + 1) * size], y[r * size:(r + 1) * size])
            losses.append(loss)
            grads.append(grad)
            raws.append(dict(self.model.raw))
        self.raw = {name: tuple(raw[name] for raw in raws) for name, _ in self.layers}
        mean_grads = {k: np.mean([g[k] for g in grads], axis=0) for k in grads[0]}
        factors = {}
        for name, _ in self.layers:
            each = [effective_factors(self.convention, raw[name], self.batch_size) for raw in raws]
            factors[name] = (np.mean([e[0] for e in each], axis=0), np.mean([e[1] for e in each], axis=0))
        return float(np.mean(losses)), mean_grads, factors
