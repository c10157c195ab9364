"""ms_optim._float16_add: float16 ``x + y`` in graphs through float32 gives MindSpore's bits, forward and backward.

Oracle: the float64 sum of two float16 values is exact (their exponents differ by at most 39 bits, plus 11 of
significand, within float64's 53), so rounding it once to float16 is the correctly rounded float16 sum.
"""
import numpy as np
import pytest
from mindspore import Tensor, context, nn, ops
from mindspore import dtype as mstype

from ms_optim import _float16_add

_EDGES = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 1024.0,
                   2049.0, np.inf, -np.inf, 0.1, 3.0], np.float16)
_EDGES_Y = np.array([-0.0, -0.0, 2.0 ** -11, 2.0 ** -11 * 3, 32.0, -32.0, 16.0, 2.0 ** -24, 2.0 ** -24, -(2.0 ** -25),
                     0.5, 0.5, 1.0, np.inf, 0.2, 2.0 ** -10], np.float16)


class _Sum(nn.Cell):
    def construct(self, x, y):
        return x + y


class _Scaled(nn.Cell):
    """(x + y) * c, whose gradients for x and y are c, through ``+``."""

    def construct(self, x, y, c):
        return (x + y) * c


@pytest.fixture(autouse=True)
def mindspores_add_first():
    """Each test starts from MindSpore's ``+`` (a ModelThor built earlier in this process installs ours, and a
    comparison with "MindSpore's" bits would then compare ours with ours) and leaves the process as found."""
    was_installed = _float16_add._STATE["installed"]
    _float16_add.restore_float16_add()
    yield
    if was_installed:
        _float16_add.float16_add_via_float32()
    else:
        _float16_add.restore_float16_add()


@pytest.fixture
def installed():
    """The float32 path installed for the test."""
    _float16_add.float16_add_via_float32()


def _bits(value) -> np.ndarray:
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value).view(np.uint16)


def _pairs(rng):
    x = np.concatenate([_EDGES, rng.standard_normal(4000).astype(np.float16) * 300,
                        rng.standard_normal(4000).astype(np.float16) * 1e-3]).astype(np.float16)
    y = np.concatenate([_EDGES_Y, rng.standard_normal(4000).astype(np.float16) * 300,
                        -rng.standard_normal(4000).astype(np.float16) * 1e-3]).astype(np.float16)
    return x.reshape(8, -1), y.reshape(8, -1)


def test_float16_sum_is_the_correctly_rounded_sum(mode, rng, installed):
    x, y = _pairs(rng)
    out = _Sum()(Tensor(x), Tensor(y))
    assert out.dtype == mstype.float16
    with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf, and sums past float16's range
        expected = (x.astype(np.float64) + y.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(_bits(out), _bits(expected))


def test_same_bits_as_mindspores_add_forward_and_backward(mode, rng):
    x, y = _pairs(rng)
    c = rng.standard_normal(x.shape).astype(np.float16)

    def run():
        net = _Scaled()  # a new Cell: compiled with the ``+`` registered now
        grads = ops.GradOperation(get_all=True)(net)(Tensor(x), Tensor(y), Tensor(c))
        return [_bits(net(Tensor(x), Tensor(y), Tensor(c)))] + [_bits(g) for g in grads]

    mindspore_bits = run()
    _float16_add.float16_add_via_float32()
    try:
        ours = run()
    finally:
        _float16_add.restore_float16_add()
    assert len(ours) == 4
    for theirs, mine in zip(mindspore_bits, ours):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("x_dtype, y_dtype, y_shape", [
    (np.float32, np.float32, (8, 4)),
    (np.float16, np.float32, (8, 4)),
    (np.float16, np.float16, (1, 4)),  # broadcasting pairs keep MindSpore's add (their gradients reduce)
    (np.int32, np.int32, (8, 4)),
])
def test_other_pairs_keep_mindspores_add(mode, rng, installed, x_dtype, y_dtype, y_shape):
    x = (rng.standard_normal((8, 4)) * 100).astype(x_dtype)
    y = (rng.standard_normal(y_shape) * 100).astype(y_dtype)
    ours = _Sum()(Tensor(x), Tensor(y))
    _float16_add.restore_float16_add()
    theirs = _Sum()(Tensor(x), Tensor(y))
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours.asnumpy(), theirs.asnumpy())


def _casts_in_compiled_add(tmp_path, tag) -> int:
    """Compile ``x + y`` of two float16 tensors in GRAPH mode and count the casts of its validated IR."""
    folder = tmp_path / tag
    context.set_context(mode=context.GRAPH_MODE, save_graphs=1, save_graphs_path=str(folder))
    try:
        _Sum()(Tensor(np.ones((2, 3), np.float16)), Tensor(np.ones((2, 3), np.float16)))
    finally:
        context.set_context(mode=context.PYNATIVE_MODE, save_graphs=0)
    text = sorted(folder.rglob("*validate*.ir"))[-1].read_text()
    return text.count("PrimFunc_Cast")


def test_float16_pair_compiles_through_float32_casts(tmp_path):
    """Which graph is compiled: MindSpore's float16 ``+`` has no cast; ours casts both inputs and the sum."""
    assert _casts_in_compiled_add(tmp_path, "mindspore") == 0
    _float16_add.float16_add_via_float32()
    try:
        assert _casts_in_compiled_add(tmp_path, "ours") >= 3
    finally:
        _float16_add.restore_float16_add()


def test_install_and_restore_are_idempotent():
    _float16_add.float16_add_via_float32()
    _float16_add.float16_add_via_float32()
    assert _float16_add._STATE["installed"]
    _float16_add.restore_float16_add()
    _float16_add.restore_float16_add()
    assert not _float16_add._STATE["installed"]
