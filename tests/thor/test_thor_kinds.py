"""THOR's layer kinds (``ms_optim._thor.net.kinds``): one spec per kind, one tap class, layers complete when made.

* The registered specs and what the optimizer reads from every THOR layer (``kind``, ``spec``, ``a_dim``,
  ``g_dim``, ``weight_param()``, the factor Parameters, ``thor_flag``, ``factor_block_size``).
* ``convert.convert_net``: every layer built with the final settings (factor shapes of the block width, the
  tap's convention, ``batch_size``, block width and schedule guard), equal taps shared at build time, the
  layers returned in ``thor_candidates`` order; a second conversion gives the THOR layers already there its
  settings (factors kept unless the width changes).
* ``factors.factor_blocks`` is the one block geometry (``stored_shape`` and the optimizer's ``BlockLayout``
  agree with it); the kinds' convention multipliers; the LayerNorm rule's facts.
"""
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_optim._thor.inversion.preconditioner import BlockLayout
from ms_optim._thor.modes import Convention, Kind
from ms_optim._thor.net import kinds
from ms_optim._thor.net.convert import convert_net, thor_candidates
from ms_optim._thor.net.curvature import (
    GradientSquareCurvature,
    KroneckerCurvature,
    NoCurvature,
    RowDiagonalCurvature,
)
from ms_optim._thor.net.factors import factor_blocks, stored_shape
from ms_optim._thor.net.layers import Conv1dThor, Conv2dThor, DenseThor, EmbeddingThor
from ms_optim._thor.net.taps import FactorTap, ScheduleGuard, TapSettings


def test_registered_specs():
    specs = kinds.registered()
    assert specs == (kinds.DENSE, kinds.CONV, kinds.CONV1D, kinds.EMBEDDING)
    classes = (DenseThor, Conv2dThor, Conv1dThor, EmbeddingThor)
    plain = (nn.Dense, nn.Conv2d, nn.Conv1d, nn.Embedding)
    for spec, cls, plain_type in zip(specs, classes, plain):
        assert spec.thor_class is cls and cls.spec is spec and cls.kind == spec.kind
        assert spec.plain_type is plain_type
    assert [s.kind for s in specs] == [Kind.DENSE, Kind.CONV, Kind.CONV1D, Kind.EMBEDDING]
    assert [type(s).__mro__[1] for s in specs[:2]] == [KroneckerCurvature] * 2  # their curvature forms
    assert isinstance(kinds.CONV1D, KroneckerCurvature) and isinstance(kinds.EMBEDDING, RowDiagonalCurvature)
    assert [s.a_diagonal for s in specs] == [False, False, False, True]
    assert kinds.CONV1D.conventions == (Convention.KFC,)
    assert all(s.conventions == Convention.CONCRETE for s in specs if s is not kinds.CONV1D)
    with pytest.raises(ValueError, match="registered"):
        kinds.register(DenseThor)


@pytest.mark.parametrize("layer,weight,dims,a_shape,g_shape", [
    (lambda: DenseThor(150, 10), "weight", (150, 10), (2, 128, 128), (10, 10)),
    (lambda: Conv2dThor(3, 200, (2, 3)), "weight", (18, 200), (18, 18), (2, 128, 128)),
    (lambda: Conv1dThor(50, 4, 3), "weight", (150, 4), (2, 128, 128), (4, 4)),
    (lambda: EmbeddingThor(300, 7), "embedding_table", (300, 7), (300,), (7, 7)),
])
def test_layer_interface(layer, weight, dims, a_shape, g_shape):
    """What the optimizer reads from every THOR layer, with the default settings (blocks of 128)."""
    layer = layer()
    assert layer.kind == layer.spec.kind and isinstance(layer.factor_tap, FactorTap)
    assert layer.weight_param() is getattr(layer, weight) and layer.spec.weight(layer) is layer.weight_param()
    assert (layer.a_dim, layer.g_dim) == dims == layer.spec.dims(layer)
    assert layer.matrix_a_cov.shape == a_shape and layer.matrix_g_cov.shape == g_shape
    assert not layer.matrix_a_cov.asnumpy().any() and bool(layer.thor_flag.asnumpy())
    assert layer.factor_block_size == 128 and layer.factor_tap.settings == TapSettings()
    assert TapSettings() == (Convention.KFC, 32, 128, None)


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 3)
        self.first = nn.Conv2d(3, 3, 3)
        self.second = nn.Conv2d(3, 3, 3)
        self.wide = nn.Conv2d(3, 3, 3, stride=2)
        self.seq = nn.Conv1d(6, 6, 3)
        self.fc = nn.Dense(9, 9)
        self.out = nn.Dense(9, 2)

    def construct(self, x, ids):
        h = self.wide(self.second(self.first(x)))
        s = ops.reshape(self.seq(ops.reshape(self.emb(ids), (-1, 6, 3))), (-1, 18))
        return self.out(self.fc(ops.reshape(h, (h.shape[0], -1))[:, :9] + s[:, :9]))


def _guard(limit):
    return ScheduleGuard("thor", Parameter(Tensor(np.zeros((1,), np.int32)), name="global_step"),
                         [("learning_rate", limit)])


def test_convert_net_builds_complete_layers_and_shares_taps():
    net = _Net()
    guard = _guard(3)
    settings = TapSettings(convention=Convention.ASCEND, batch_size=8, block_size=4, guard=guard)
    layers = convert_net(net, settings)
    names = ["emb", "first", "second", "wide", "fc", "out"]  # no Conv1d under "ascend"
    candidates = [c for _, c in thor_candidates(net, Convention.ASCEND)]
    assert layers == [getattr(net, n) for n in names] == candidates
    assert type(net.seq) is nn.Conv1d and layers[0].factor_tap.convention == Convention.ASCEND
    settings = settings._replace(convention=Convention.KFC)
    net = _Net()
    layers = convert_net(net, settings)
    assert [type(c) for c in layers] == [EmbeddingThor] + [Conv2dThor] * 3 + [Conv1dThor] + [DenseThor] * 2
    for layer in layers:
        tap = layer.factor_tap
        assert tap.settings.guard is guard and tap.block_size == layer.factor_block_size == 4
        assert (tap.convention, tap.batch_size) == (Convention.KFC, 8)
        assert layer.matrix_a_cov.shape == layer.spec.a_shape(layer.a_dim, 4)
        assert layer.matrix_g_cov.shape == stored_shape(layer.g_dim, 4)
    taps = [layer.factor_tap for layer in layers]
    assert taps[1] is taps[2] and taps[1].shared and taps[3] is not taps[1]  # equal geometry: one tap
    assert taps[5] is taps[6] and len({id(t) for t in taps}) == 5
    assert net.first.matrix_a_cov.name == "first.matrix_a_cov"
    with pytest.raises(ValueError, match="'auto'"):
        convert_net(_Net(), TapSettings(convention=Convention.AUTO))


def test_convert_net_again_gives_the_layers_its_settings():
    """A second conversion (a second thor()) re-settles the THOR layers: new taps; factors kept at the same
    width, zeros of the new shape (same names) at another."""
    net = _Net()
    first = convert_net(net, TapSettings(block_size=4, guard=_guard(2)))
    ops.assign(net.fc.matrix_a_cov, Tensor(np.ones(net.fc.matrix_a_cov.shape, np.float32)))
    old_tap = net.fc.factor_tap
    again = convert_net(net, TapSettings(batch_size=16, block_size=4))
    assert again == first and net.fc.factor_tap is not old_tap
    assert net.fc.factor_tap.settings.guard is None and net.fc.factor_tap.batch_size == 16
    np.testing.assert_array_equal(net.fc.matrix_a_cov.asnumpy(), np.ones((3, 4, 4), np.float32))
    convert_net(net, TapSettings(block_size=None))
    assert net.fc.matrix_a_cov.shape == (9, 9) and not net.fc.matrix_a_cov.asnumpy().any()
    assert net.fc.matrix_a_cov.name == "fc.matrix_a_cov" and net.fc.factor_block_size is None


@pytest.mark.parametrize("n", [1, 5, 127, 128, 129, 150, 4608])
@pytest.mark.parametrize("block_size", [None, 1, 4, 128])
def test_factor_blocks_is_the_one_block_geometry(n, block_size):
    nblocks, bs = factor_blocks(n, block_size)
    whole = block_size is None or block_size >= n
    assert (nblocks, bs) == ((1, n) if whole else (-(-n // block_size), block_size))
    assert stored_shape(n, block_size) == ((n, n) if nblocks == 1 else (nblocks, bs, bs))
    layout = BlockLayout(n, block_size)
    assert (layout.nblocks, layout.bs) == (nblocks, bs)


def test_convention_multipliers():
    """The kinds' multipliers of conventions.py's formulas (bs = batch_size 4; N rows, T positions, B)."""
    assert kinds.dense_scales(Convention.KFC, 4, 8, 3) == (1.0, 1.0)
    assert kinds.dense_scales(Convention.GPU, 4, 8, 3) == (8 / 3, 16 / 64)   # a^T a / in; bs^2 / N d^T d
    assert kinds.dense_scales(Convention.ASCEND, 4, 8, 3) == (1.0, 16 / 64)
    assert kinds.conv_scales(Convention.KFC, 4, 2, 9) == (1.0, 1.0)
    assert kinds.conv_scales(Convention.GPU, 4, 2, 9) == (3.0, 16 / 3)      # sqrt(T); bs^2 / sqrt(T)
    root = (18 / 4) ** 0.5                                                     # sqrt(n / bs), n = B T
    assert kinds.conv_scales(Convention.ASCEND, 4, 2, 9) == (root, root * 16 / (18 * 2))
    assert kinds.embedding_scales(Convention.KFC, 4, 6) == (1.0, 1.0)
    assert kinds.embedding_scales(Convention.GPU, 4, 6) == (6 / 4, 16 / 36)  # counts / bs; bs^2 / N d^T d


class _MyNorm(nn.LayerNorm):
    pass


def test_layernorm_rule():
    norm = _MyNorm((4,))
    assert kinds.LAYERNORM.supports(norm) and not kinds.LAYERNORM.supports(nn.Dense(2, 2))
    assert kinds.LAYERNORM.params(norm) == (norm.gamma, norm.beta)
    assert isinstance(kinds.LAYERNORM, GradientSquareCurvature) and kinds.LAYERNORM.has_curvature
    assert isinstance(kinds.PLAIN, NoCurvature) and not kinds.PLAIN.has_curvature
