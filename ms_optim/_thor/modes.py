"""THOR's modes and named constants, in one place.

Every setting that selects a behaviour is one of the values below; modules compare against these
names, never against literals of their own. They are plain ``str``/``int`` class attributes, not
``enum.Enum`` members, because GRAPH_MODE reads them as constants inside compiled code (a kind travels
through the graph as a ``str``).
"""
from __future__ import annotations

__all__ = ["Mode", "Convention", "Inverse", "Kind", "GRule", "Strategy"]


class Mode:
    """Where a step's learning rate, damping or momentum comes from: the user's schedule (or number), or a
    rule of THOR's own that adapts it (``thor(..., learning_rate="adaptive")`` and so on)."""

    SCHEDULED = "scheduled"
    ADAPTIVE = "adaptive"


class Convention:
    """``thor(..., factor_convention=...)``: how A, G and the damping are normalised
    (``net/conventions.py``)."""

    AUTO = "auto"
    GPU = "gpu"
    ASCEND = "ascend"
    KFC = "kfc"
    #: the accepted argument values, in the order error messages list them
    ALL = (AUTO, GPU, ASCEND, KFC)
    #: the concrete conventions a layer computes with (``AUTO`` resolves to one of them)
    CONCRETE = (GPU, ASCEND, KFC)
    #: MindSpore's device conventions: their data-parallel runs average the inverses, not the factors
    INVERSE_AVERAGING = (GPU, ASCEND)


class Inverse:
    """``thor(..., inverse=...)``: diagonal blocks of ``block_size`` or whole-matrix inverses."""

    BLOCKED = "blocked"
    FULL = "full"
    ALL = (BLOCKED, FULL)


class Kind:
    """The layer kinds THOR preconditions (``net/kinds.py`` holds one spec per kind; nothing else compares
    these names)."""

    DENSE = "dense"
    CONV = "conv"
    CONV1D = "conv1d"
    EMBEDDING = "embedding"


class GRule:
    """How a layer's G "inverse" is formed (``inversion/device_rules.py``): the damped inverse, MindSpore
    GPU's embedding product ``L^-1 L^-1``, or Ascend's identity for a 2-output Dense layer."""

    INVERSE = "inverse"
    GPU_EMBEDDING = "gpu_embedding"
    IDENTITY = "identity"


class Strategy:
    """How a THOR step refreshes the inverses (``inversion/strategy.py``), chosen once when the optimizer is
    built."""

    BATCHED = "batched"        # every layer at once: fused ops per factor (CPU) or batched per block width
    PER_LAYER = "per_layer"    # layer by layer (MindSpore's device rules, the trace rule)
    SHARED = "shared"          # distribute_inverses on R > 1 ranks: each layer inverted by one owner,
                               # then shared
    AVERAGED = "averaged"      # gpu/ascend on R > 1 ranks: every rank inverts its own factors,
                               # inverses averaged
