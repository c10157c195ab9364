"""Each layer kind applies its curvature through its spec alone (``net/curvature.py``): a kind that differs from
Dense only in its spec -- A kept as its diagonal, so its curvature is ``G V diag(a)`` -- gets THOR's
preconditioning, the quadratic model's curvature and the adaptive step from that spec, with nothing else of
THOR changed; checked against NumPy in both modes. Also: every form's ``apply(+1)`` against the NumPy product
of the stored factors, and ``apply(-1)`` against the stored inverses."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from ms_optim import nn as ms_nn
from ms_optim import thor
from ms_optim._thor.modes import Convention
from ms_optim._thor.net import kinds
from ms_optim._thor.net.blocks import apply_left
from ms_optim._thor.net.layers import DenseThor

BATCH, N_IN, N_OUT = 16, 6, 3
LR, DAMPING = 0.1, 0.05


class DiagonalDense(nn.Dense):
    """A plain Dense under another type, so that only the new kind converts it."""


@ms.jit_class
class DiagonalDenseSpec(kinds.DenseSpec):
    """Dense whose A is kept as its diagonal ``mean(x^2)``: curvature ``G V diag(a)``."""

    kind = "diagonal_dense"
    plain_type = DiagonalDense
    a_diagonal = True
    conventions = (Convention.KFC,)

    def a_value(self, x, geometry, convention, bs, block_size):
        return ops.mean(ops.square(ops.cast(x, ms.float32)), 0)

    def a_fused(self, op, a_cov, x, flag, geometry, convention, bs, block_size):
        new = self.a_value(x, geometry, convention, bs, block_size)
        return ops.assign(a_cov, ops.select(ops.broadcast_to(flag, new.shape), new, a_cov))

    @staticmethod
    def apply(slot, vector, power, step):
        g_geom, _, g_inv, a_inv, g_cov, a_cov = slot
        _, _, g_unscale, _, _ = step
        v32 = ops.cast(vector, ms.float32)
        if power > 0:
            left = apply_left(ops.cast(g_cov, ms.float32), v32, g_geom[0], g_geom[1], g_geom[2])
            return left * ops.expand_dims(ops.cast(a_cov, ms.float32), 0) * g_unscale
        return apply_left(g_inv, v32, g_geom[0], g_geom[1], g_geom[2]) * ops.expand_dims(a_inv, 0)


class DiagonalDenseThor(DenseThor):
    """The new kind's THOR layer: DenseThor's state and forward, the new spec."""

    spec = DiagonalDenseSpec()


@pytest.fixture(scope="module", autouse=True)
def _registered():
    """``kinds.register``, the one line that adds a kind, for this module's tests only (the registry is the
    process's: other test modules list the built-in kinds)."""
    kinds.register(DiagonalDenseThor)
    yield
    kinds._REGISTERED.remove(DiagonalDenseThor.spec)  # pylint: disable=protected-access
    DiagonalDenseThor.spec.thor_class = None


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = DiagonalDense(N_IN, N_OUT, has_bias=False)

    def construct(self, x):
        return self.fc(x)


def _setup(rng):
    net = Net()
    net.fc.weight.set_data(Tensor(rng.standard_normal((N_OUT, N_IN)).astype(np.float32)))
    x = rng.standard_normal((BATCH, N_IN)).astype(np.float32)
    y = rng.standard_normal((BATCH, N_OUT)).astype(np.float32)
    return net, x, y


def _numpy_factors(w, x, y):
    """The kind's factors on the batch (kfc, MSE over all entries): ``a = mean(x^2)`` and ``G = N d^T d``,
    and the loss gradient of the weight."""
    s = x @ w.T
    d = 2.0 * (s - y) / (BATCH * N_OUT)
    return np.mean(x ** 2, 0), BATCH * d.T @ d, d.T @ x


def test_a_new_kind_converts_and_preconditions_through_its_spec(mode, rng):
    net, x, y = _setup(rng)
    w0 = net.fc.weight.asnumpy().astype(np.float64)
    opt = thor(net, Tensor(LR, ms.float32), Tensor(DAMPING, ms.float32), 0.0, batch_size=BATCH, frequency=10)
    assert type(net.fc) is DiagonalDenseThor and opt.table.specs[0] is DiagonalDenseThor.spec
    assert net.fc.matrix_a_cov.shape == (N_IN,) and opt.slots[0].a_diagonal  # the diagonal inverse, as stored
    cell = ms_nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt).set_train()
    cell(Tensor(x), Tensor(y))
    a, g, grad = _numpy_factors(w0, x, y)
    lam = np.sqrt(DAMPING)
    np.testing.assert_allclose(net.fc.matrix_a_cov.asnumpy(), a, rtol=1e-5)
    np.testing.assert_allclose(net.fc.matrix_g_cov.asnumpy(), g, rtol=1e-4, atol=1e-7)
    want = w0 - LR * np.linalg.inv(g + lam * np.eye(N_OUT)) @ grad / (a + lam)[None, :]
    np.testing.assert_allclose(net.fc.weight.asnumpy(), want, rtol=1e-4, atol=1e-6)


def test_a_new_kind_gives_the_quadratic_model_its_curvature(mode, rng):
    """learning_rate="adaptive": the model's curvature K(x, x) of the first step (x = -u, u the
    preconditioned gradient) is the new form's, ``<G x diag(a), x>``."""
    net, x, y = _setup(rng)
    w0 = net.fc.weight.asnumpy().astype(np.float64)
    opt = thor(net, "adaptive", Tensor(DAMPING, ms.float32), 0.5, batch_size=BATCH, frequency=10)
    cell = ms_nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt).set_train()
    cell(Tensor(x), Tensor(y))
    a, g, grad = _numpy_factors(w0, x, y)
    lam = np.sqrt(DAMPING)
    u = np.linalg.inv(g + lam * np.eye(N_OUT)) @ grad / (a + lam)[None, :]
    system = opt.step_rule.system.asnumpy()
    np.testing.assert_allclose(system[0], np.sum((g @ u) * a[None, :] * u), rtol=1e-4)  # K(x, x)
    np.testing.assert_allclose(system[3], np.sum(u * u), rtol=1e-5)                       # D(x, x)
    np.testing.assert_allclose(system[9], -np.sum(grad * u), rtol=1e-5)                   # b0 = <g, x>


@pytest.mark.parametrize("spec", [kinds.DENSE, kinds.EMBEDDING, kinds.LAYERNORM, kinds.PLAIN], ids=repr)
def test_apply_plus_one_is_the_stored_curvature_and_minus_one_the_stored_inverse(mode, rng, spec):
    """Each registered form, composite path: ``apply(+1)`` = ``u G V A`` (its form) and ``apply(-1)`` the
    stored inverses' product, against NumPy."""
    rows, cols = 4, 5
    v = rng.standard_normal((rows, cols)).astype(np.float32)
    grad = rng.standard_normal((rows, cols)).astype(np.float32)
    g_mat = rng.standard_normal((rows, rows)).astype(np.float32)
    a_mat = rng.standard_normal((cols, cols)).astype(np.float32)
    a_vec = rng.random(rows).astype(np.float32) + 0.5
    g_cols = rng.standard_normal((cols, cols)).astype(np.float32)
    unscale, lam, bs = 0.25, 0.3, 8.0
    if spec is kinds.EMBEDDING:  # rows are the vocabulary, G acts on the columns
        slot = ((cols, 1, cols), (0, 0, 0), Tensor(g_cols[None]), Tensor(a_vec), Tensor(g_cols), Tensor(a_vec))
        plus = unscale * (a_vec[:, None] * v) @ g_cols
        minus = (a_vec[:, None] * v) @ g_cols
    elif spec is kinds.DENSE:
        slot = ((rows, 1, rows), (cols, 1, cols), Tensor(g_mat[None]), Tensor(a_mat[None]), Tensor(g_mat),
                Tensor(a_mat))
        plus = unscale * g_mat @ v @ a_mat
        minus = g_mat @ v @ a_mat
    elif spec is kinds.LAYERNORM:
        slot = ()
        plus = grad ** 2 / bs * v
        minus = v / (grad ** 2 / bs + lam)
    else:
        slot = ()
        plus, minus = np.zeros_like(v), v
    step = ((), Tensor(np.float32(lam)), Tensor(np.float32(unscale)), Tensor(np.float32(bs)), Tensor(grad))
    got_plus = spec.apply(slot, Tensor(v), 1, step).asnumpy()
    got_minus = spec.apply(slot, Tensor(v), -1, step).asnumpy()
    np.testing.assert_allclose(got_plus, plus, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_minus, minus, rtol=1e-5, atol=1e-6)
    assert spec.has_curvature == (spec is not kinds.PLAIN)
