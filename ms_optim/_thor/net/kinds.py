r"""THOR's layer kinds: one spec per kind holds everything THOR knows about it.

A spec (a :class:`KindSpec`) gives, for one kind of layer:

* Python side, read when a net is converted and when the optimizer is built: ``kind`` (a ``modes.Kind``), the
  plain MindSpore type and ``supports(cell)`` (the structure rule), the weight Parameter (``weight``), the
  factor sizes (``dims``: ``(a_dim, g_dim)``), whether A is kept as its diagonal (``a_diagonal``), the
  conventions under which a plain layer converts (``conventions``), the tap's static geometry (``geometry``),
  how MindSpore's device rules treat it (``convolution``, ``gpu_g_rule``, ``ascend_identity_g_dim``,
  ``ascend_max_scale``: ``inversion/device_rules.py`` reads these, never a kind's name) and, once registered,
  its THOR layer class (``thor_class``);
* graph side, how its factors are collected, called by the tap's backward pass (``taps.FactorTap``): A and G
  by composite ops (``a_value``/``g_value``) or by the fused CPU ops (``a_fused``/``g_fused``, with the op the
  spec names in ``a_op``/``g_op``), each in the normalisation of a factor convention: the formulas of
  ``factors.py`` times the kind's convention multipliers (``dense_scales``, ``conv_scales``,
  ``embedding_scales`` below; the conventions themselves are documented in ``conventions.py``);
* graph side, how its curvature is applied, ``apply(slot, vector, power, step)`` (``curvature.py``: the
  preconditioning with ``power=-1``, the product ``K v`` with ``power=+1``), the one way the optimizer, the
  quadratic model and the damping rule use it.

The specs are ``mindspore.jit_class`` instances without state of a layer: a tap passes its constants in
(geometry, convention name, ``batch_size``, block width), so GRAPH_MODE parses one spec method for all the
layers of a kind, and the constant arguments are folded where the graph is specialised.

A kind is added by a spec here and one line of registration, the ``@register`` decorator of its THOR layer
class (``layers.py``), which links the two and lists the spec for the converter (:func:`registered`).
``Conv1dSpec`` is the example: a 1-D convolution is ``nn.Conv1d``'s own ``Conv2D`` of the input with a
height-1 axis, so its factors are those of a conv with a ``(1, k)`` kernel and its spec differs from
``ConvSpec`` in its type and conventions.

Parameters of no THOR layer have a spec too, without factors: :data:`LAYERNORM` (``nn.LayerNorm``'s gamma and
beta: the elementwise curvature ``g^2 / batch_size`` of their own gradient) and :data:`PLAIN` (everything
else: no curvature; the gradient passes unchanged).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import mindspore.common.dtype as mstype
from mindspore import Parameter, jit_class, nn, ops
from mindspore.ops import constexpr

from ms_optim._thor.modes import Convention, GRule, Kind
from ms_optim._thor.net import factors as fm
from ms_optim._thor.net.curvature import (
    GradientSquareCurvature,
    KroneckerCurvature,
    NoCurvature,
    RowDiagonalCurvature,
)
from ms_optim._thor.net.factor_kernels import count_plan_tensor, patch_plan_tensor, row_plan_tensor

__all__ = ["KindSpec", "DenseSpec", "ConvSpec", "Conv1dSpec", "EmbeddingSpec", "LayerNormSpec", "PlainSpec",
           "DENSE", "CONV", "CONV1D", "EMBEDDING", "LAYERNORM", "PLAIN", "register", "registered",
           "parameter_specs", "dense_scales", "conv_scales", "embedding_scales"]


# ----------------------------------------------------------------------------- convention multipliers
@constexpr
def dense_scales(convention: str, bs: int, rows: int, width: int) -> Tuple[float, float]:
    """``(A multiplier, G multiplier)`` of a Dense layer with ``rows`` input rows of ``width`` features,
    applied to ``factors.dense_a`` (``a^T a / N``) and ``dense_g`` (``N d^T d``); ``bs`` is thor()'s
    ``batch_size`` (a ``constexpr``: GRAPH_MODE gets one constant)."""
    g_scale = 1.0 if convention == Convention.KFC else bs * bs / (rows * rows)
    return (rows / width if convention == Convention.GPU else 1.0), g_scale


@constexpr
def conv_scales(convention: str, bs: int, batch: int, positions: int) -> Tuple[float, float]:
    """``(A multiplier, G multiplier)`` of a conv with batch ``batch`` and ``positions`` = Ho*Wo, applied to
    ``factors.conv_a``/``conv_g`` of the input and dL/ds (their batch means for gpu: :func:`conv_input`)."""
    if convention == Convention.GPU:  # conv_a(mean x) = sum pm pm^T / T; conv_g(mean ds) = sum dm dm^T
        return positions ** 0.5, bs * bs / positions ** 0.5
    if convention == Convention.ASCEND:  # conv_a(x) = sum p p^T / n; conv_g(ds) = B sum d d^T
        rows = batch * positions
        root = (rows / bs) ** 0.5
        return root, root * bs * bs / (rows * batch)
    return 1.0, 1.0


@constexpr
def embedding_scales(convention: str, bs: int, rows: int) -> Tuple[float, float]:
    """``(A multiplier, G multiplier)`` of an Embedding with ``rows`` ids, applied to
    ``factors.embedding_a`` (``counts / N``) and ``embedding_g`` (``N d^T d``)."""
    if convention == Convention.KFC:
        return 1.0, 1.0
    return rows / bs, bs * bs / (rows * rows)


@constexpr
def _conv_positions(shape, geometry) -> int:
    """Ho * Wo of a conv of ``geometry`` on an NCHW input of ``shape``."""
    out = fm.conv_output_geometry(shape[2], shape[3], *geometry)
    return out[4] * out[5]


def scaled(value, factor: float):
    """``value * factor`` (float32); ``value`` itself when ``factor == 1.0`` (so "kfc" adds no op)."""
    if factor == 1.0:
        return value
    return ops.mul(value, ops.scalar_to_tensor(factor, mstype.float32))


def conv_input(convention: str, x):
    """The conv input (or dL/ds) whose patches make A (or G): for gpu its batch mean, keeping a batch of 1."""
    if convention == Convention.GPU:
        return ops.mean(ops.cast(x, mstype.float32), 0, True)
    return x


# ----------------------------------------------------------------------------- the specs
@jit_class
class KindSpec:
    """What THOR knows about one layer kind (the module docstring lists it). Subclasses set the class
    attributes and the methods that differ; instances hold nothing but the THOR class ``register`` sets.

    The graph-side methods take the tap's constants: ``geometry`` (from :meth:`geometry`), ``convention``
    (a concrete ``modes.Convention``), ``bs`` (thor()'s ``batch_size``) and ``block_size`` (the factors'
    block width, None for whole matrices). They return the factor in its stored form
    (``factors.stored_shape``), or, fused, what the op returns (written in place).
    """

    kind: str = ""
    plain_type: type = nn.Cell
    weight_name: str = "weight"
    a_diagonal: bool = False
    #: MindSpore's device rules (``inversion/device_rules.py``): a convolution (Ascend scales every Dense and
    #: conv of a net with one), the G rule on GPU, the output count whose G Ascend replaces by the identity
    #: (0: none), and whether Ascend's max-abs scale applies to it
    convolution: bool = False
    gpu_g_rule: str = GRule.INVERSE
    ascend_identity_g_dim: int = 0
    ascend_max_scale: bool = True
    conventions: Tuple[str, ...] = Convention.CONCRETE
    a_op: str = "row_gram"
    g_op: str = "row_gram"

    def __init__(self):
        self.thor_class: Optional[type] = None

    def supports(self, cell: nn.Cell) -> bool:
        """Whether a THOR layer of this kind can represent ``cell`` (its exact plain type: a subclass's
        forward may differ). Whether it IS converted: ``convert.thor_class_for``."""
        return type(cell) is self.plain_type  # pylint: disable=unidiomatic-typecheck

    def weight(self, cell: nn.Cell) -> Parameter:
        """The Parameter whose gradient THOR preconditions (of the plain layer or its THOR twin)."""
        return getattr(cell, self.weight_name)

    def dims(self, cell: nn.Cell) -> Tuple[int, int]:
        """``(a_dim, g_dim)``: the sizes of A and G (of the plain layer or its THOR twin)."""
        raise NotImplementedError

    def geometry(self, cell: nn.Cell) -> tuple:
        """The static constants the factor computation needs besides the tensors' shapes."""
        return ()

    def a_shape(self, a_dim: int, block_size: Optional[int]) -> Tuple[int, ...]:
        """The stored shape of A: its diagonal ``(a_dim,)``, or ``factors.stored_shape``."""
        return (int(a_dim),) if self.a_diagonal else fm.stored_shape(a_dim, block_size)

    def a_value(self, x, geometry, convention, bs, block_size):
        raise NotImplementedError

    def g_value(self, ds, geometry, convention, bs, block_size):
        raise NotImplementedError

    def a_fused(self, op, a_cov, x, flag, geometry, convention, bs, block_size):
        raise NotImplementedError

    def g_fused(self, op, g_cov, ds, flag, geometry, convention, bs, block_size):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r})"


@jit_class
class DenseSpec(KroneckerCurvature, KindSpec):
    """``nn.Dense``: rows ``(N, in)`` (leading dimensions flattened), ``A = a^T a / N``, ``G = N d^T d``."""

    kind = Kind.DENSE
    plain_type = nn.Dense
    ascend_identity_g_dim = 2

    def dims(self, cell):
        return int(cell.in_channels), int(cell.out_channels)

    def a_value(self, x, geometry, convention, bs, block_size):
        return scaled(fm.dense_a(x, block_size), dense_scales(convention, bs, x.shape[0], x.shape[1])[0])

    def g_value(self, ds, geometry, convention, bs, block_size):
        return scaled(fm.dense_g(ds, block_size), dense_scales(convention, bs, ds.shape[0], ds.shape[1])[1])

    def a_fused(self, op, a_cov, x, flag, geometry, convention, bs, block_size):
        scale = dense_scales(convention, bs, x.shape[0], x.shape[1])[0]
        return op(a_cov, x, flag, row_plan_tensor(x.shape, block_size, scale, True))

    def g_fused(self, op, g_cov, ds, flag, geometry, convention, bs, block_size):
        scale = dense_scales(convention, bs, ds.shape[0], ds.shape[1])[1]
        return op(g_cov, ds, flag, row_plan_tensor(ds.shape, block_size, scale, False))


@jit_class
class ConvSpec(KroneckerCurvature, KindSpec):
    """``nn.Conv2d`` (group 1, NCHW): the im2col patches p, ``A = sum p p^T / (B*T)``, ``G = B sum d d^T``.

    ``geometry`` is ``(kernel_size, stride, dilation, pad_mode, padding)``, as ``factors.conv_a`` takes it.
    """

    kind = Kind.CONV
    plain_type = nn.Conv2d
    convolution = True
    a_op = "patch_gram"
    g_op = "patch_gram"

    def supports(self, cell):
        """Exactly the plain type, ``group == 1`` and ``data_format == 'NCHW'``."""
        return (type(cell) is self.plain_type and cell.group == 1  # pylint: disable=unidiomatic-typecheck
                and getattr(cell, "data_format", "NCHW") == "NCHW")

    def dims(self, cell):
        return int(cell.in_channels * cell.kernel_size[0] * cell.kernel_size[1]), int(cell.out_channels)

    def geometry(self, cell):
        padding = tuple(cell.padding) if isinstance(cell.padding, (list, tuple)) else cell.padding
        return (tuple(cell.kernel_size), tuple(cell.stride), tuple(cell.dilation), cell.pad_mode, padding)

    def a_value(self, x, geometry, convention, bs, block_size):
        scale = conv_scales(convention, bs, x.shape[0], _conv_positions(x.shape, geometry))[0]
        return scaled(fm.conv_a(conv_input(convention, x), *geometry, block_size), scale)

    def g_value(self, ds, geometry, convention, bs, block_size):
        scale = conv_scales(convention, bs, ds.shape[0], ds.shape[2] * ds.shape[3])[1]
        return scaled(fm.conv_g(conv_input(convention, ds), block_size), scale)

    def a_fused(self, op, a_cov, x, flag, geometry, convention, bs, block_size):
        scale = conv_scales(convention, bs, x.shape[0], _conv_positions(x.shape, geometry))[0]
        x = conv_input(convention, x)
        return op(a_cov, x, flag, patch_plan_tensor(x.shape, *geometry, block_size, scale, True))

    def g_fused(self, op, g_cov, ds, flag, geometry, convention, bs, block_size):
        scale = conv_scales(convention, bs, ds.shape[0], ds.shape[2] * ds.shape[3])[1]
        ds = conv_input(convention, ds)
        plan = patch_plan_tensor(ds.shape, (1, 1), (1, 1), (1, 1), "valid", 0, block_size, scale, False)
        return op(g_cov, ds, flag, plan)


@jit_class
class Conv1dSpec(ConvSpec):
    """``nn.Conv1d`` (group 1): MindSpore's layer keeps ``(1, k)`` kernel, stride and dilation, the padding
    ``(0, 0, p, p)`` and a ``(C_out, C_in, 1, k)`` weight, and runs ``Conv2D`` on the input with a
    height-1 axis; its THOR layer taps that 4-D convolution, so its factors are ``ConvSpec``'s with
    T = L_out. Converted under ``"kfc"`` only: MindSpore's GPU and Ascend THOR have no Conv1d to match."""

    kind = Kind.CONV1D
    plain_type = nn.Conv1d
    conventions = (Convention.KFC,)


@jit_class
class EmbeddingSpec(RowDiagonalCurvature, KindSpec):
    """``nn.Embedding``: N ids, ``A = counts / N`` (kept as the diagonal), ``G = N d^T d``.

    ``geometry`` is ``(vocab_size,)``.
    """

    kind = Kind.EMBEDDING
    plain_type = nn.Embedding
    weight_name = "embedding_table"
    a_diagonal = True
    gpu_g_rule = GRule.GPU_EMBEDDING
    ascend_max_scale = False
    a_op = "id_counts"

    def dims(self, cell):
        return int(cell.vocab_size), int(cell.embedding_size)

    def geometry(self, cell):
        return (int(cell.vocab_size),)

    def a_value(self, x, geometry, convention, bs, block_size):
        limit = ops.scalar_to_tensor(geometry[0], mstype.int32)
        return scaled(fm.embedding_a(x, geometry[0], limit), embedding_scales(convention, bs, x.shape[0])[0])

    def g_value(self, ds, geometry, convention, bs, block_size):
        return scaled(fm.embedding_g(ds, block_size), embedding_scales(convention, bs, ds.shape[0])[1])

    def a_fused(self, op, a_cov, x, flag, geometry, convention, bs, block_size):
        scale = embedding_scales(convention, bs, x.shape[0])[0]
        return op(a_cov, x, flag, count_plan_tensor(x.shape[0], scale))

    def g_fused(self, op, g_cov, ds, flag, geometry, convention, bs, block_size):
        scale = embedding_scales(convention, bs, ds.shape[0])[1]
        return op(g_cov, ds, flag, row_plan_tensor(ds.shape, block_size, scale, False))


@jit_class
class LayerNormSpec(GradientSquareCurvature):
    """``nn.LayerNorm`` (and subclasses): no factors; its ``gamma`` and ``beta`` get the elementwise curvature
    ``g^2 / batch_size`` of their own gradient, in every convention."""

    kind = "layernorm"
    plain_type = nn.LayerNorm

    def supports(self, cell: nn.Cell) -> bool:
        return isinstance(cell, self.plain_type)

    def params(self, cell: nn.Cell) -> Tuple[Parameter, Parameter]:
        return cell.gamma, cell.beta

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r})"


@jit_class
class PlainSpec(NoCurvature):
    """Every trainable parameter of no THOR layer and no LayerNorm (biases, BatchNorm, ...): no curvature."""

    kind = "plain"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r})"


DENSE = DenseSpec()
CONV = ConvSpec()
CONV1D = Conv1dSpec()
EMBEDDING = EmbeddingSpec()
LAYERNORM = LayerNormSpec()
PLAIN = PlainSpec()

_REGISTERED: List[KindSpec] = []


def register(thor_class: type) -> type:
    """Class decorator of a THOR layer class with a ``spec``: the one line that adds a kind. Links the spec
    and the class (``spec.thor_class``, ``thor_class.kind``) and lists the spec for the converter."""
    spec = thor_class.spec
    if spec.thor_class is not None:
        raise ValueError(f"{spec!r} is registered already, for {spec.thor_class.__name__}.")
    spec.thor_class = thor_class
    thor_class.kind = spec.kind
    _REGISTERED.append(spec)
    return thor_class


def registered() -> Tuple[KindSpec, ...]:
    """The registered specs, in registration order (the order ``convert.thor_class_for`` tries them)."""
    return tuple(_REGISTERED)


def parameter_specs(params, layers, cells) -> Tuple[Tuple[object, int], ...]:
    """``(spec, layer index)`` of every Parameter of ``params``, in order: its THOR layer's spec and index
    (``layers``: the converted layers), else :data:`LAYERNORM` for a gamma or beta of a LayerNorm among
    ``cells``, else :data:`PLAIN` (index -1 for both)."""
    role = {id(layer.weight_param()): (layer.spec, i) for i, layer in enumerate(layers)}
    for cell in cells:
        if LAYERNORM.supports(cell):
            for param in LAYERNORM.params(cell):
                role.setdefault(id(param), (LAYERNORM, -1))
    return tuple(role.get(id(param), (PLAIN, -1)) for param in params)
