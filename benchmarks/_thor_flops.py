"""THOR's extra work per training step, in FLOPs, against the step's own (conv and dense layers).

Counted per THOR layer from its sizes (``n_a`` = A's size, ``C_in*kh*kw`` for a conv; ``n_g`` = G's size,
the output channels), the rows it sees per step (``B*Ho*Wo`` for a conv, the ``N`` input rows of a Dense
or the ``N`` ids of an Embedding) and the factor block widths ``b_a = min(block, n_a)``,
``b_g = min(block, n_g)`` (the whole factor for ``inverse="full"``):

* the layer's training step (forward and the two backward products): ``3 * 2 * rows * n_a * n_g``
  (an Embedding's lookup and its scatter-add count ``2 * rows * n_g``);
* preconditioning, every step: ``G^-1 g A^-1`` with block-diagonal inverses, ``2 n_g n_a (b_g + b_a)``
  (an Embedding, whose A is diagonal: ``2 n_g n_a b_g + n_g n_a``);
* the factors, THOR steps only: the diagonal blocks of A and G, ``2 rows (n_a b_a + n_g b_g)``
  (an Embedding's A is a count: ``rows``);
* the inversions, THOR steps only: about ``4 b^3`` per ``b x b`` block (an LU inverse ``2 b^3`` and
  the residual ``F F^-1 - I`` that accepts it ``2 b^3``).

Layers that are not THOR layers (batch norm, activations, pooling, attention's own products) are not
counted, so the step's FLOPs are a lower bound and the ratios an upper bound.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["layer_flops", "step_flops", "layer_rows"]


def _width(n: int, block: Optional[int]) -> Tuple[int, int]:
    """``(nblocks, b)`` of a factor of size ``n`` in blocks of ``block`` (None: whole)."""
    if block is None or block >= n:
        return 1, n
    return -(-n // block), block


def layer_flops(kind: str, n_a: int, n_g: int, rows: int, block: Optional[int]) -> Dict[str, float]:
    """FLOPs of one THOR layer per step: ``train``, ``precondition``, ``factors``, ``inversion``."""
    blocks_a, b_a = _width(n_a, block)
    blocks_g, b_g = _width(n_g, block)
    if kind == "embedding":
        return {"train": 2.0 * rows * n_g,
                "precondition": 2.0 * n_g * n_a * b_g + n_g * n_a,
                "factors": float(rows) + 2.0 * rows * n_g * b_g,
                "inversion": 4.0 * blocks_g * b_g ** 3}
    return {"train": 6.0 * rows * n_a * n_g,
            "precondition": 2.0 * n_g * n_a * (b_g + b_a),
            "factors": 2.0 * rows * (n_a * b_a + n_g * b_g),
            "inversion": 4.0 * (blocks_a * b_a ** 3 + blocks_g * b_g ** 3)}


def step_flops(layers: Sequence[Tuple[str, int, int, int]], block: Optional[int]) -> Dict[str, float]:
    """Totals over ``(kind, n_a, n_g, rows)`` layers and the ratios a THOR user sees.

    ``non_thor_extra``: preconditioning over the step's training FLOPs (THOR's other steps);
    ``thor_extra``: preconditioning, factors and inversions over it (a THOR step).
    """
    totals = {"train": 0.0, "precondition": 0.0, "factors": 0.0, "inversion": 0.0}
    for kind, n_a, n_g, rows in layers:
        for key, value in layer_flops(kind, n_a, n_g, rows, block).items():
            totals[key] += value
    totals["non_thor_extra"] = totals["precondition"] / totals["train"]
    totals["thor_extra"] = (totals["precondition"] + totals["factors"] + totals["inversion"]) / totals["train"]
    return totals


def layer_rows(optimizer, run_forward) -> List[Tuple[str, int, int, int]]:
    """``(kind, n_a, n_g, rows)`` of every THOR layer of ``optimizer`` (an ``ms_optim`` thor optimizer).

    ``run_forward()`` runs one forward pass of the net in PYNATIVE mode; forward hooks on the THOR layers
    record the rows each sees (a conv's output ``B*Ho*Wo``, a Dense's input rows, an Embedding's ids).
    """
    seen: Dict[int, int] = {}

    def hook(index: int, kind: str):
        def record(cell, inputs, output):
            if index in seen:
                return
            if kind == "conv":
                shape = output.shape
                seen[index] = int(shape[0] * shape[2] * shape[3])
            else:
                shape = inputs[0].shape
                count = 1
                for size in (shape[:-1] if kind == "dense" else shape):
                    count *= int(size)
                seen[index] = count
        return record

    handles = [layer.register_forward_hook(hook(i, layer.kind)) for i, layer in enumerate(optimizer.thor_cells)]
    try:
        run_forward()
    finally:
        for handle in handles:
            handle.remove()
    return [(layer.kind, int(layer.a_dim), int(layer.g_dim), seen.get(i, 0))
            for i, layer in enumerate(optimizer.thor_cells)]
