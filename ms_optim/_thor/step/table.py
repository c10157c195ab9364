"""The optimizer's table of its trainable parameters: for each, what the step's ``hyper_map`` s read.

Built once with the optimizer, in the order of ``net.trainable_params()``; every entry is a constant of the
compiled graph (or a Parameter the step reads and writes).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

import numpy as np

from ms_optim._thor.net.curvature import form_index

__all__ = ["ParameterTable", "parameter_table", "weight_positions"]


class ParameterTable(NamedTuple):
    """Per trainable parameter, in order:

    * ``specs``: its spec (``net/kinds.py``: its layer's, ``LAYERNORM`` or ``PLAIN``) and ``forms``, the
      index of the spec's ``apply`` (``net/curvature.py``: ``form_index``, ``apply_form``);
    * ``slots``: what ``apply`` reads of its layer (``LayerSlot.curvature``), ``()`` for no layer;
    * ``owners``: its layer's index (-1 for none); ``grad_index`` per layer: its weight's position;
    * ``decay_flags``: whether ``decay_filter`` keeps it; ``curved``: whether its curvature can be non-zero
      (``spec.has_curvature``); ``sizes``: its number of entries.
    """

    specs: Tuple
    forms: Tuple[int, ...]
    slots: Tuple
    owners: Tuple[int, ...]
    grad_index: Tuple[int, ...]
    decay_flags: Tuple[bool, ...]
    curved: Tuple[bool, ...]
    sizes: Tuple[int, ...]


def weight_positions(roles: Sequence, num_layers: int) -> Tuple[int, ...]:
    """Each layer's weight's position among the parameters, from ``roles`` (``kinds.parameter_specs``)."""
    positions = [0] * num_layers
    for j, (_, owner) in enumerate(roles):
        if owner >= 0:
            positions[owner] = j
    return tuple(positions)


def parameter_table(params: Sequence, roles: Sequence, layers: Sequence, slots: Sequence,
                    decay_filter) -> ParameterTable:
    """The table of ``params`` (the optimizer's Parameters) from their ``roles`` (``kinds.parameter_specs``),
    the THOR ``layers`` and their ``slots``."""
    specs = tuple(spec for spec, _ in roles)
    return ParameterTable(
        specs=specs,
        forms=tuple(form_index(spec.apply) for spec in specs),
        slots=tuple(slots[owner].curvature(layers[owner]) if owner >= 0 else () for _, owner in roles),
        owners=tuple(owner for _, owner in roles),
        grad_index=weight_positions(roles, len(layers)),
        decay_flags=tuple(bool(decay_filter(p)) for p in params),
        curved=tuple(bool(spec.has_curvature) for spec in specs),
        sizes=tuple(int(np.prod(p.shape)) for p in params))
