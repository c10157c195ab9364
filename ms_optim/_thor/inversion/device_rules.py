r"""MindSpore's device-specific inverse rules for ``factor_convention="gpu"`` and ``"ascend"``.

``ms_optim._thor.net.conventions`` fixes the factors and the damping of a convention; this module holds
what MindSpore's ``ThorGpu``/``ThorAscend`` then do to the *inverses*, as tensor functions of one
layer (a ``LayerSlot`` ``slot``, built with its static rule, :func:`inverse_rules`):

* ``slot.g_rule == GPU_EMBEDDING`` ("gpu", Embedding): MindSpore's "inverse" of the damped G' is
  ``MatMul(X, X)`` with ``X = CholeskyTrsm(G') = L^-1`` (``G' = L L^T``), i.e. ``L^-1 L^-1``, per
  block (:func:`gpu_embedding_g_inverse`). ``L^-1`` is computed without a Cholesky kernel (none on
  Ascend): row k of ``L^-1`` is ``e_k^T M_k^-1 / sqrt((M_k^-1)_kk)``, ``M_k`` the block with rows and
  columns past k replaced by the identity (one batched ``MatrixInverse`` of ``bs`` matrices per block:
  ``bs`` times the work of an inverse, on a THOR step, for embeddings only). It is accepted when
  finite and ``max |X G' X^T - I| <= INVERSE_TOLERANCE`` (the product itself is no inverse of G').
* ``slot.g_rule == IDENTITY`` ("ascend", a Dense layer with 2 outputs): ``Ginv = I``.
* ``slot.max_scale`` ("ascend", Conv and Dense layers of a net with any conv layer): MindSpore
  divides ``Ainv`` by ``a_max = max|Ainv|`` and ``Ginv`` by ``g_max`` and multiplies the product by
  ``g_max^2``, so the update is ``Ginv g Ainv * g_max / a_max``; the maxima are taken on THOR steps and
  kept with the inverses. Here the ratio is folded into the stored G inverse (:func:`finish_inverses`)
  and a layer is refreshed as a whole (both inverses accepted, or both kept).

Data parallel (``averaged.py``, R > 1 ranks): both MindSpore optimizers mean-all-reduce the
*inverses* of each rank's local factors (Ascend its a_max and g_max too), not the factors. Each rank
contributes, per layer, its accepted inverses (zeros if it rejected them) and ``[ok, a_max, g_max]``;
the layer takes the means only if every rank accepted (mean ok == 1), else every rank keeps its stored
inverses (identical on all ranks). ``trace_thresholds`` then decides from the mean-all-reduced traces
``mean_r tr(A_r) * mean_r tr(G_r)`` (= the traces of the mean factors): the same decision on every rank.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import Tensor, ops

from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.modes import Convention, GRule
from ms_optim._thor.net.blocks import keep_if

__all__ = ["INVERSE", "GPU_EMBEDDING", "IDENTITY", "INVERSE_AVERAGING", "InverseRule", "PLAIN_RULE",
           "averages_inverses", "check_distribute_inverses", "inverse_rules", "rule_constants",
           "whitening_blocks", "gpu_embedding_g_inverse", "abs_max", "special_g_inverse", "finish_inverses",
           "contribution", "averaged_inverses"]

INVERSE = GRule.INVERSE
GPU_EMBEDDING = GRule.GPU_EMBEDDING
IDENTITY = GRule.IDENTITY

#: The conventions whose data-parallel runs average inverses (MindSpore's rule), not factors.
INVERSE_AVERAGING = Convention.INVERSE_AVERAGING


class InverseRule(NamedTuple):
    """One layer's static inverse rule under a convention: how its G is inverted (``g_rule``, a
    :class:`~ms_optim._thor.modes.GRule`) and whether Ascend's max-abs scale applies (``max_scale``)."""

    g_rule: str
    max_scale: bool

    @property
    def plain(self) -> bool:
        """Whether the layer is inverted as the formula says, with nothing of MindSpore's device rules."""
        return self.g_rule == GRule.INVERSE and not self.max_scale


#: The rule of a layer inverted as the formula says (every layer under "kfc").
PLAIN_RULE = InverseRule(GRule.INVERSE, False)


def averages_inverses(convention: str) -> bool:
    """Whether ``convention`` mean-all-reduces the inverses (gpu, ascend) rather than the factors (kfc)."""
    return convention in INVERSE_AVERAGING


def check_distribute_inverses(distribute: bool, convention: str, requested: str,
                              cls_name: str = "thor") -> None:
    """ValueError if ``distribute_inverses=True`` meets an inverse-averaging convention (``requested`` is
    the ``factor_convention`` argument, ``convention`` what it resolved to)."""
    if distribute and averages_inverses(convention):
        given = repr(requested) if requested == convention else f"{requested!r} (resolved to {convention!r})"
        raise ValueError(f"For '{cls_name}', the argument 'distribute_inverses' must be False with "
                         f"'factor_convention' {given}: that convention averages the inverses of every "
                         f"rank's own factors, as MindSpore does, so no identical inversion is left to share "
                         f"(use factor_convention='kfc' to share them), but got distribute_inverses=True.")


def inverse_rules(layers: Sequence, convention: str) -> Tuple[InverseRule, ...]:
    """Every THOR layer's :class:`InverseRule` under ``convention``, from its spec's device-rule attributes
    (``convolution``, ``gpu_g_rule``, ``ascend_identity_g_dim``, ``ascend_max_scale``) and its ``g_dim``."""
    has_conv = any(layer.spec.convolution for layer in layers)
    rules = []
    for layer in layers:
        spec = layer.spec
        if convention == Convention.GPU and spec.gpu_g_rule != GRule.INVERSE:
            rules.append(InverseRule(spec.gpu_g_rule, False))
        elif convention == Convention.ASCEND and int(layer.g_dim) == spec.ascend_identity_g_dim:
            rules.append(InverseRule(GRule.IDENTITY, False))
        else:
            max_scale = convention == Convention.ASCEND and has_conv and spec.ascend_max_scale
            rules.append(InverseRule(GRule.INVERSE, max_scale) if max_scale else PLAIN_RULE)
    return tuple(rules)


def rule_constants(rule: InverseRule, a_layout, g_layout) -> dict:
    """The constants a slot under ``rule`` reads: ``lead`` (GPU embedding's whitening) and
    ``a_keep``/``g_keep`` (the masks of Ascend's maxima, which skip the identity padding of the last
    block)."""
    constants = {"lead": (), "a_keep": Tensor(1.0, mstype.float32), "g_keep": Tensor(1.0, mstype.float32)}
    if rule.g_rule == GRule.GPU_EMBEDDING:
        constants["lead"] = _leading_constants(g_layout.bs)
    if rule.max_scale:
        constants["a_keep"] = Tensor(1.0 - a_layout.pad_identity(), mstype.float32)
        constants["g_keep"] = Tensor(1.0 - g_layout.pad_identity(), mstype.float32)
    return constants


def _leading_constants(bs: int):
    """``(mask, eye, pick, lower)`` for :func:`whitening_blocks`: ``mask[k]`` keeps rows/columns <= k,
    ``eye[k]`` is the identity past k, ``pick[k]`` selects row k, ``lower`` the lower triangle."""
    lead = (np.arange(bs)[None, :] <= np.arange(bs)[:, None]).astype(np.float32)      # lead[k, i] = i <= k
    mask = lead[:, :, None] * lead[:, None, :]
    eye = np.eye(bs, dtype=np.float32)[None] * (1.0 - lead)[:, :, None]
    pick = np.eye(bs, dtype=np.float32)[:, :, None]                                   # pick[k, i] = i == k
    return (Tensor(mask), Tensor(eye), Tensor(pick), Tensor(np.tril(np.ones((bs, bs), np.float32))))


def whitening_blocks(blocks, lead):
    """``X = L^-1`` per block of the SPD ``blocks`` ``(nblocks, bs, bs)`` (``F = L L^T``, L lower).

    Row k of ``L^-1`` is ``e_k^T F_k^-1 / sqrt((F_k^-1)_kk)``, ``F_k`` the leading k+1 square of F
    (``(F_k^-1) e_k = L^-T e_k / l_kk``): one batched inverse of F with the identity past k, per k.
    """
    mask, eye, pick, lower = lead
    nblocks, bs = blocks.shape[0], blocks.shape[1]
    nested = ops.expand_dims(blocks, 1) * mask + eye                                 # (nblocks, bs, bs, bs)
    inverse = pc.invert_blocks(ops.reshape(nested, (nblocks * bs, bs, bs)))
    rows = ops.sum(ops.reshape(inverse, (nblocks, bs, bs, bs)) * pick, 2)     # rows[b, k] = inv_k[k]
    diagonal = ops.sum(rows * ops.eye(bs, bs, mstype.float32), 2, keepdim=True)
    return rows * ops.rsqrt(diagonal) * lower


def gpu_embedding_g_inverse(blocks, slot):
    """MindSpore GPU's embedding G "inverse" ``L^-1 L^-1`` of the damped ``blocks`` and its acceptance
    (finite, and ``L^-1`` whitens the blocks: ``max |X F X^T - I| <= INVERSE_TOLERANCE``)."""
    whitening = whitening_blocks(blocks, slot.lead)
    residual = ops.abs(ops.bmm(ops.bmm(whitening, blocks), ops.transpose(whitening, (0, 2, 1))) - slot.g_eye)
    return ops.bmm(whitening, whitening), pc.residual_accepted(residual)


def special_g_inverse(slot, blocks):
    """``(Ginv, ok)`` of a slot whose ``g_rule`` is not ``INVERSE``."""
    if slot.g_rule == GPU_EMBEDDING:
        return gpu_embedding_g_inverse(blocks, slot)
    return slot.g_eye * 1, ops.ones((), mstype.bool_)


def abs_max(inverse, keep):
    """``max |inverse|`` over the real entries (``keep`` zeroes the identity padding)."""
    return ops.reduce_max(ops.abs(inverse) * keep)


def finish_inverses(slot, new_a, ok_a, new_g, ok_g):
    """The inverses to store: per factor the new one if accepted, else the stored one; with
    ``slot.max_scale`` both or neither, G times ``max|Ginv| / max|Ainv|``."""
    if not slot.max_scale:
        return keep_if(ok_a, new_a, slot.a_inv), keep_if(ok_g, new_g, slot.g_inv)
    ok = ops.logical_and(ok_a, ok_g)
    scaled = new_g * (abs_max(new_g, slot.g_keep) / abs_max(new_a, slot.a_keep))
    return keep_if(ok, new_a, slot.a_inv), keep_if(ok, scaled, slot.g_inv)


def contribution(slot, new_a, ok_a, new_g, ok_g):
    """One rank's share of a layer for :class:`InverseAveraging`: ``(Ainv, Ginv, [ok, a_max, g_max])``,
    zeros where the rank rejected its inverses (a select: no NaN passes)."""
    ok = ops.logical_and(ok_a, ok_g)
    a_part = keep_if(ok, new_a, ops.zeros_like(new_a))
    g_part = keep_if(ok, new_g, ops.zeros_like(new_g))
    a_max = g_max = ops.ones((), mstype.float32)
    if slot.max_scale:
        a_max, g_max = abs_max(a_part, slot.a_keep), abs_max(g_part, slot.g_keep)
    return a_part, g_part, ops.stack((ops.cast(ok, mstype.float32), a_max, g_max))


def averaged_inverses(slot, mean_a, mean_g, mean_stats):
    """The inverses to store from the rank means of :func:`contribution`: the means (G times mean g_max /
    mean a_max with ``max_scale``) if every rank accepted (mean ok == 1), else the stored ones."""
    ok = mean_stats[0] >= 1.0
    if slot.max_scale:
        mean_g = mean_g * (mean_stats[2] / mean_stats[1])
    return keep_if(ok, mean_a, slot.a_inv), keep_if(ok, mean_g, slot.g_inv)
