"""Data-parallel reduction of THOR factors (placeholder: identity until the distributed work lands).

Interface used by the optimizer: ``FactorAllReduce(num_layers, split_indices)`` is a Cell whose
``construct(factors)`` takes a tuple of per-layer factor tensors and returns a tuple of the same
shapes, averaged over data-parallel ranks (identity on a single device).
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn


class FactorAllReduce(nn.Cell):
    """Mean all-reduce of a tuple of factor tensors, fused in groups split at ``split_indices``."""

    def __init__(self, num_layers: int, split_indices: Optional[Sequence[int]] = None):
        super().__init__()
        self.num_layers = num_layers
        self.split_indices = list(split_indices) if split_indices is not None else None

    def construct(self, factors):
        return factors
