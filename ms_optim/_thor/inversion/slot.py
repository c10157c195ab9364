"""The optimizer's per-layer record, ``LayerSlot``, and the one inversion of a layer's factors.

``ThorOptimizer`` keeps one :class:`LayerSlot` per THOR layer (its static block geometry and its
stored inverses); :func:`invert_layer` is what a THOR step does to one layer once it has decided to
refresh it: damp and invert A and G (blocked, or the diagonal for an embedding's A) and accept each
inverse only if finite and accurate (``preconditioner.accept_inverse``), keeping the previous inverse
where it is rejected.
"""
from __future__ import annotations

from typing import Optional

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._thor.inversion import device_rules as rules
from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.net.factors import stored_shape
from ms_optim._thor.net.layers import ThorLayer

__all__ = ["LayerSlot", "layer_inverses", "invert_layer"]


class LayerSlot(nn.Cell):
    """Everything the optimizer keeps about THOR layer ``index``, complete when built, read by GRAPH_MODE as
    constants.

    * ``a_diagonal``: A is kept as its diagonal (the spec's ``a_diagonal``: an embedding's id frequencies);
    * ``grad_index``: position of the layer's weight among the optimizer's parameters (the gradient
      the factor read waits for: the backward pass has stored the factors by then);
    * ``a_layout`` / ``g_layout``: the ``BlockLayout`` of A (None for an embedding's diagonal A)
      and of G; ``a_geom`` / ``g_geom``: their ``(n, nblocks, bs)``;
    * ``rule`` (``device_rules.InverseRule``) and its parts ``g_rule``, ``max_scale``, with their constants
      ``lead``, ``a_keep``, ``g_keep`` (``device_rules.rule_constants``);
    * with ``layerwise`` (the strategy inverts layer by layer, :func:`invert_layer`): ``inverse_kernel``
      (``()`` or the fused CPU op), ``a_plan``, ``g_plan``, ``g_fused`` (G inverted by it), or the identity
      blocks and pad masks ``a_eye``, ``a_pad_eye``, ``g_eye``, ``g_pad_eye`` of the composite inversion;
      the batched inversion needs none of them (each is the size of the factor);
    * ``a_inv`` / ``g_inv``: the stored inverses, Parameters ``matrix_a_inv_blocks_<index>`` /
      ``matrix_g_inv_blocks_<index>`` (initially the identity).
    """

    def __init__(self, index: int, layer: ThorLayer, grad_index: int, block_size: Optional[int],
                 rule: rules.InverseRule = rules.PLAIN_RULE, kernel: Optional[object] = None,
                 layerwise: bool = False):
        super().__init__(auto_prefix=False)  # keep the inverses' names as they are (checkpoints)
        self.a_diagonal = bool(layer.spec.a_diagonal)
        self.grad_index = int(grad_index)
        self.g_layout = pc.BlockLayout(int(layer.g_dim), block_size)
        self.g_geom = self.g_layout.geom
        self.g_inv = Parameter(Tensor(pc.identity_blocks(self.g_layout)), name=f"matrix_g_inv_blocks_{index}",
                               requires_grad=False)
        if self.a_diagonal:
            self.a_layout = None
            self.a_geom = (0, 0, 0)
            a_inv = np.ones((int(layer.a_dim),), np.float32)
        else:
            self.a_layout = pc.BlockLayout(int(layer.a_dim), block_size)
            self.a_geom = self.a_layout.geom
            a_inv = pc.identity_blocks(self.a_layout)
        self.a_inv = Parameter(Tensor(a_inv), name=f"matrix_a_inv_blocks_{index}", requires_grad=False)
        want = ((int(layer.a_dim),) if self.a_diagonal else stored_shape(layer.a_dim, block_size),
                stored_shape(layer.g_dim, block_size))
        if (tuple(layer.matrix_a_cov.shape), tuple(layer.matrix_g_cov.shape)) != want:
            raise ValueError(f"THOR layer {index} stores its factors as {tuple(layer.matrix_a_cov.shape)} "
                             f"and {tuple(layer.matrix_g_cov.shape)}, but the optimizer inverts blocks of "
                             f"{block_size}: convert the net with that block size (thor() does).")
        self.rule = rule
        self.g_rule, self.max_scale = rule
        for name, value in rules.rule_constants(rule, self.a_layout, self.g_layout).items():
            setattr(self, name, value)
        if layerwise:
            self._layerwise_constants(kernel)

    def curvature(self, layer: ThorLayer) -> tuple:
        """``(g_geom, a_geom, g_inv, a_inv, g_cov, a_cov)``: the slot its layer's spec's ``apply`` reads
        (``net/curvature.py``), with ``layer``'s stored factors."""
        return (self.g_geom, self.a_geom, self.g_inv, self.a_inv, layer.matrix_g_cov, layer.matrix_a_cov)

    def _layerwise_constants(self, kernel: Optional[object]) -> None:
        """What :func:`invert_layer` reads: with the fused CPU ``kernel`` (``MsOptimBlockInverseOut``) its
        plans, else the identity blocks and pad masks the composite inversion adds (a G under a special rule
        of ``device_rules`` always takes the composite path)."""
        self.inverse_kernel = () if kernel is None else (kernel,)
        self.one = Tensor(1.0, mstype.float32)
        unused = Tensor(np.zeros((1,), np.float32))
        fused_a = kernel is not None and not self.a_diagonal
        self.g_fused = kernel is not None and self.g_rule == rules.INVERSE
        self.a_plan = self.a_layout.inverse_plan if fused_a else unused
        self.g_plan = self.g_layout.inverse_plan if self.g_fused else unused
        composite_a = kernel is None and not self.a_diagonal
        self.a_eye, self.a_pad_eye = ((self.a_layout.eye, self.a_layout.pad_eye) if composite_a
                                      else (unused, unused))
        self.g_eye, self.g_pad_eye = ((unused, unused) if self.g_fused
                                      else (self.g_layout.eye, self.g_layout.pad_eye))


def _fused_inverse(slot: LayerSlot, factor, lam, plan, geom):
    """``(inverse, ok)`` of one factor by the fused CPU op (the same numbers as ``batched.py``'s)."""
    blocks = ops.reshape(ops.cast(factor, mstype.float32), (geom[1], geom[2], geom[2]))
    inverse, ok = slot.inverse_kernel[0](blocks, lam, slot.one, plan)
    return inverse, ops.reshape(ok, ()) > 0.5


def layer_inverses(slot: LayerSlot, a_factor, g_factor, lam):
    """The new damped inverses of one layer and their acceptance, ``(Ainv, ok_a, Ginv, ok_g)``:
    ``(A + lam I)^-1`` and ``(G + lam I)^-1`` (blocked; an embedding's A: ``1 / (a + lam)``), each ok if
    finite and accurate (``preconditioner.accept_inverse``); G by the convention's rule where it has one
    (``device_rules.special_g_inverse``: MindSpore GPU's embedding product, Ascend's identity)."""
    if slot.a_diagonal:
        new_a = pc.damped_diagonal_inverse(a_factor, lam)
        ok_a = ops.all(ops.isfinite(new_a))
    elif slot.inverse_kernel:
        new_a, ok_a = _fused_inverse(slot, a_factor, lam, slot.a_plan, slot.a_geom)
    else:
        geom = slot.a_geom
        blocks = pc.damped_blocks(a_factor, lam, geom[0], geom[1], geom[2], slot.a_eye, slot.a_pad_eye)
        new_a = pc.invert_blocks(blocks)
        ok_a = pc.accept_inverse(blocks, new_a, slot.a_eye)
    geom = slot.g_geom
    if slot.g_fused:
        new_g, ok_g = _fused_inverse(slot, g_factor, lam, slot.g_plan, geom)
        return new_a, ok_a, new_g, ok_g
    blocks = pc.damped_blocks(g_factor, lam, geom[0], geom[1], geom[2], slot.g_eye, slot.g_pad_eye)
    if slot.g_rule == rules.INVERSE:
        new_g = pc.invert_blocks(blocks)
        ok_g = pc.accept_inverse(blocks, new_g, slot.g_eye)
    else:
        new_g, ok_g = rules.special_g_inverse(slot, blocks)
    return new_a, ok_a, new_g, ok_g


def invert_layer(slot: LayerSlot, a_factor, g_factor, lam):
    """The inverses ``(Ainv, Ginv)`` to store for one layer: :func:`layer_inverses`, each the new inverse
    if accepted, else ``slot``'s stored one (``device_rules.finish_inverses``: Ascend's max-abs scale)."""
    return rules.finish_inverses(slot, *layer_inverses(slot, a_factor, g_factor, lam))
