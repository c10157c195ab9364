r"""THOR's factor conventions: how A, G and the damping are normalised (``thor(..., factor_convention=...)``).

MindSpore's THOR normalises its Kronecker factors differently on GPU and on Ascend, and ms_optim's
own default (KFC) differs from both; published hyper-parameters (damping above all) were tuned for
one of them. A convention fixes, per layer kind, the factors A and G and the damping that the
optimizer's one rule then inverts, ``Ainv = (A_e + sqrt(d) I)^-1``, ``Ginv = (G_e + sqrt(d) I)^-1``,
``g <- Ginv g Ainv``. Below, ``A_e``/``G_e`` are those *effective* factors (what the layers store in
``matrix_a_cov``/``matrix_g_cov``, G times the square of the loss scale as always); d is the damping
of the step, ``bs`` thor()'s ``batch_size`` argument, ``S`` the loss scale.

Notation: Dense and Embedding have N rows (``a`` inputs, ``d = dL/ds`` output-gradient rows, ``in``
input features, ``counts[v]`` the occurrences of id v); a Conv2d has batch B, T = Ho*Wo output
positions, patches ``p_{b,t}`` and output gradients ``d_{b,t}`` (rows of ``dL/ds``), ``n = B*T``, and
batch means ``pm_t = mean_b p_{b,t}`` (the patches of ``x.mean(axis=0)``: im2col is linear) and
``dm_t = mean_b d_{b,t}``.

* ``"kfc"`` (ms_optim's formulas, ``ms_optim._thor.net.factors``; the damping ``sqrt(d)`` on both)::

      Dense      A_e = a^T a / N              G_e = N d^T d
      Conv2d     A_e = sum_{b,t} p p^T / n    G_e = B sum_{b,t} d d^T
      Embedding  A_e = counts / N             G_e = N d^T d

* ``"gpu"`` (MindSpore's ``DenseThor``/``Conv2dThor``/``EmbeddingThor`` and ``ThorGpu`` on GPU).
  MindSpore computes, for a conv, ``A = sum_t pm pm^T / T``, ``G = sum_t dm dm^T / T`` (the layer's
  ``construct``/``save_gradient``), then ``Ginv = (G bs^2 / S^2 + sqrt(d / T) I)^-1 sqrt(1 / T)`` and
  ``Ainv = (A + sqrt(d / T) I)^-1 sqrt(1 / T)`` (``ThorGpu._get_ainv_ginv_list``). Since
  ``(F + sqrt(d / c) I)^-1 / sqrt(c) = (sqrt(c) F + sqrt(d) I)^-1``, that is, exactly::

      Dense      A_e = a^T a / in             G_e = bs^2 / N d^T d
      Conv2d     A_e = sqrt(T) sum_t pm pm^T / T     G_e = bs^2 / sqrt(T) sum_t dm dm^T
      Embedding  A_e = counts / bs            G_e = bs^2 / N d^T d

  (MindSpore's GPU Dense layer divides ``a^T a`` by the first dimension of ``a^T a``, i.e. by ``in``,
  not by the batch.)
* ``"ascend"`` (the same on Ascend, ``ThorAscend``): a conv's ``A = sum p p^T / n`` and
  ``G = sum d d^T / n`` over all n rows, damping ``sqrt(d bs / n)`` on both, G times ``bs^2 / S^2``,
  and the product ``Ginv g Ainv`` times ``bs / n``; so, with ``c = n / bs``, exactly::

      Dense      A_e = a^T a / N              G_e = bs^2 / N d^T d
      Conv2d     A_e = sqrt(c) sum p p^T / n  G_e = sqrt(c) bs^2 / n sum d d^T
      Embedding  A_e = counts / bs            G_e = bs^2 / N d^T d

``"auto"`` is MindSpore's convention for ``context.get_context("device_target")``: ``"gpu"`` on GPU,
``"ascend"`` on Ascend, and ``"kfc"`` on CPU, where no MindSpore THOR exists to match: on the
robustness grid of ``benchmarks/bench_thor_robust.py`` no convention dominated, and kfc had the best
mean accuracy on the small ResNet and was within 0.5 point of the best on LeNet5 with KL clipping.
With ``bs`` equal to the real batch, the three agree on Dense G, and gpu/ascend agree on Embedding.
The multipliers that turn ``factors.py``'s formulas into these are each kind's, in ``kinds.py``
(``dense_scales``, ``conv_scales``, ``embedding_scales``). ``nn.Conv1d`` has no MindSpore THOR to
match: the converter turns it into ``Conv1dThor`` under ``"kfc"`` only (a conv with T = L_out), and
leaves it a plain, first-order layer under ``"gpu"``/``"ascend"``, as MindSpore does. LayerNorm
gamma/beta (``g / (g^2 / bs + sqrt(d))``), inverses, blocks, loss scaling and everything else are the
same in every convention.

MindSpore's inverse rules, reproduced under "gpu"/"ascend" (``ms_optim._thor.inversion.device_rules`` and
``ms_optim._thor.inversion.averaged``; checked against the float64 oracle
``tests/reference/thor_conventions.py``):

* GPU Embedding: the G "inverse" is ``L^-1 L^-1`` (``G' = L L^T`` the damped G; MindSpore's
  ``MatMul(X, X)`` of ``X = CholeskyTrsm(G')``), not ``G'^-1``: lower triangular, not symmetric.
* Ascend, in a net with any conv layer: every Conv and Dense product ``Ginv g Ainv`` times
  ``max|Ginv| / max|Ainv|`` (largest |entry| over the real entries, taken on THOR steps and kept
  between them); a Dense layer with 2 outputs gets ``Ginv = I`` (with or without conv layers).
* Data parallel: the inverses of each rank's own factors are mean-all-reduced (Ascend's maxima too),
  not the factors ("kfc" keeps averaging the factors: the factor of the whole batch). Hence
  ``distribute_inverses=True`` is refused with gpu/ascend, and ``trace_thresholds`` decides from the
  mean of the ranks' traces (the same decision on every rank).

Not reproduced, with the reason:

* float16 arithmetic (Ascend's products, fp16 inverses): precision, not formula.
* MindSpore's im2col always uses "same" padding, stride and no dilation, whatever the layer's
  ``pad_mode``/``padding``/``dilation``; here the patches and T follow the layer's real geometry.
* Whole-matrix Embedding G inverses (MindSpore inverts the embedding's G unblocked): ``inverse=``
  decides here (``"full"`` reproduces it; the default blocks of 128 agree up to 128 columns).
* ThorAscend in a conv net leaves Embedding and LayerNorm gradients unpreconditioned (its conv-net
  loop handles Conv and Dense only), and an Embedding or a 2-output Dense there adds inverses but no
  maxima, so every later layer reads another layer's maxima (an index error when it is the last
  layer): here each layer uses its own maxima and Embedding/LayerNorm are preconditioned as without conv.
* ThorAscend writes every non-THOR parameter's product factor into the LAST layer's stored maximum,
  so when the last THOR layer is a conv followed by other parameters its ``bs / n`` is lost between
  THOR steps (ResNet's last THOR layer is a Dense: unaffected).
* ThorAscend's fallback maximum (block counts outside its fused kernel's list 1, 2, 4, 5, 8, 9, 16,
  18, 32, 36, with padding) includes the identity padding; here the padding never counts (ResNet-50's
  factor sizes all fall in the list).
* ``gradients_mean=False``: MindSpore then sums the ranks' inverses (R times the mean); here always the mean.
* Acceptance: MindSpore keeps whatever its kernels return; here a non-finite or inaccurate inverse is
  rejected and the stored one kept (the whole layer under Ascend's scale; under inverse averaging
  unless every rank accepted), so a singular or non-finite factor never puts NaN into the parameters.
"""
from __future__ import annotations

from typing import Optional

from mindspore import context

from ms_optim._thor.modes import Convention
from ms_optim._validation import describe

__all__ = ["CONVENTIONS", "check_factor_convention", "resolve_factor_convention"]

#: The accepted values of ``thor(..., factor_convention=...)``.
CONVENTIONS = Convention.ALL

_DEVICE_CONVENTION = {"GPU": Convention.GPU, "Ascend": Convention.ASCEND}


def check_factor_convention(value, cls_name: str = "thor") -> str:
    """``value`` if it is one of :data:`CONVENTIONS`; TypeError for a non-str, ValueError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"For '{cls_name}', the argument 'factor_convention' must be a str, "
                        f"but got {describe(value)}.")
    if value not in CONVENTIONS:
        raise ValueError(f"For '{cls_name}', the argument 'factor_convention' must be one of "
                         f"{', '.join(repr(c) for c in CONVENTIONS)}, but got {value!r}.")
    return value


def _device_target() -> str:
    return context.get_context("device_target")


def resolve_factor_convention(value: str, device_target: Optional[str] = None) -> str:
    """The concrete convention (``"gpu"``/``"ascend"``/``"kfc"``) for ``value``.

    ``"auto"`` becomes ``"gpu"`` for device target GPU, ``"ascend"`` for Ascend and ``"kfc"``
    otherwise (CPU); ``device_target`` defaults to MindSpore's context. Other values are returned
    as they are (after :func:`check_factor_convention`).
    """
    check_factor_convention(value)
    if value != Convention.AUTO:
        return value
    target = _device_target() if device_target is None else device_target
    return _DEVICE_CONVENTION.get(target, Convention.KFC)
