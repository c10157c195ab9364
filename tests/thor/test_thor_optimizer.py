"""THOR optimizer vs the NumPy float64 oracle (tests/reference/thor_ref.py), every parameter after
every step (rtol 1e-3), in PYNATIVE and GRAPH mode, the optimizer inside TrainOneStepCell.

Nets: a ReLU MLP with biases and a 150-wide hidden layer (so 128-wide blocks matter and the last block
is smaller); a conv net (stride 2, padding, dilation 2, a 3x2 kernel, biases); an Embedding + Dense +
LayerNorm model. Settings: frequency 3 and 100, blocked and full inverses, Nesterov, weight decay with
a decay_filter, clipping, loss_scale 128 (sens 128, as FixedLossScaleManager(drop_overflow_update=False)
trains) equal to loss_scale 1. Also: identity factors with damping 0 equal nn.Momentum, the thor_flag
schedule, and the clear error past the end of the learning-rate/damping Tensors.
"""
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from reference.thor_factors import stored_form
from reference.thor_ref import ConvRef, EmbedRef, MLPRef, ThorReference, block_inverse
from support.nets import MLP, ConvNet, EmbedNet
from support.params import param_values
from support.thor_runs import init_params, mlp_batches, run_against_oracle, schedules, train_cell

from ms_optim._thor.factory import thor
from ms_optim._thor.inversion import preconditioner as pc
from ms_optim._thor.net.blocks import apply_left, apply_right, keep_if
from ms_optim._thor.net.layers import ThorLayer
from ms_optim._thor.step.optimizer import ThorOptimizer

pytestmark = [pytest.mark.core, pytest.mark.numeric]  # selected by CI's version legs (.ci/run)

RTOL = 1e-3
ATOL = 1e-6


# ----------------------------------------------------------------------------------- MLP
MLP_CASES = {
    # frequency 3 (THOR steps 0, 3, 6), default 128-wide blocks: 150 -> blocks of 128 and 22
    "f3_blocked": dict(frequency=3, steps=7, kwargs={}, ref={}),
    # frequency 100, whole-matrix inverses, Nesterov, weight decay on weights only, clipping
    "f100_full_nesterov_decay_clip": dict(
        frequency=100, steps=4,
        kwargs=dict(use_nesterov=True, weight_decay=0.01, decay_filter=lambda p: "bias" not in p.name,
                    enable_clip_grad=True, inverse="full"),
        ref=dict(use_nesterov=True, weight_decay=0.01, decay_filter=lambda name: "bias" not in name,
                 enable_clip_grad=True, block_size=None)),
}


@pytest.mark.parametrize("case", sorted(MLP_CASES))
def test_mlp_matches_reference(mode, path, rng, case):
    spec = MLP_CASES[case]
    steps = spec["steps"]
    net = MLP()
    init_params(net, rng)
    lr, damping = schedules(steps)
    ref = ThorReference(MLPRef(), param_values(net), lr, damping, 0.9, batch_size=16,
                        frequency=spec["frequency"], **spec["ref"])
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=16, frequency=spec["frequency"], **spec["kwargs"])
    assert opt.get_frequency() == spec["frequency"]
    layouts = [(lay.nblocks, lay.bs) for lay in opt.a_layouts + opt.g_layouts]
    if case == "f3_blocked":
        assert layouts == [(1, 20), (2, 128), (2, 128), (1, 10)]  # A: 20, 150; G: 150, 10
    else:
        assert layouts == [(1, 20), (1, 150), (1, 150), (1, 10)]
    cell = train_cell(net, opt)
    run_against_oracle(net, ref, cell, mlp_batches(rng, steps))
    if case == "f100_full_nesterov_decay_clip":
        # the clip must have been active: some preconditioned gradient had norm > 1 (else the case tests nothing)
        assert ref.clipped > 0
    # one step past the end of the per-step Tensors: a clear error naming the argument
    x, y = mlp_batches(rng, 1)[0]
    with pytest.raises(ValueError, match=rf"For 'thor', the argument 'learning_rate' gives {steps} values, one per "
                                         rf"step, but step {steps + 1} was requested"):
        cell(Tensor(x), Tensor(y))


def test_loss_scale_128_equals_loss_scale_1(mode, rng):
    """sens 128 + loss_scale=128 (FixedLossScaleManager(128, drop_overflow_update=False)'s training
    cell) follows the oracle, which is the loss_scale 1 trajectory, and equals a loss_scale 1 run.
    Learning rate and damping are 0-D Tensors here (the same value every step)."""
    steps = 4
    lr, damping = np.float32(0.08), np.float32(0.03)
    batches = mlp_batches(rng, steps)
    nets = []
    for scale in (128.0, 1.0):
        net = MLP()
        init_params(net, np.random.default_rng(7))
        ref = ThorReference(MLPRef(), param_values(net), lr, damping, 0.9, batch_size=16, frequency=2)
        opt = thor(net, Tensor(lr), Tensor(damping), 0.9, loss_scale=scale, batch_size=16, frequency=2)
        run_against_oracle(net, ref, train_cell(net, opt, sens=scale if scale != 1.0 else None), batches)
        nets.append(param_values(net))
    for name in nets[0]:
        np.testing.assert_allclose(nets[0][name], nets[1][name], rtol=RTOL, atol=ATOL, err_msg=name)


# ----------------------------------------------------------------------------------- conv
def test_conv_matches_reference(mode, path, rng):
    steps = 5
    net = ConvNet(dilation=2)
    init_params(net, rng)
    lr, damping = schedules(steps)
    ref = ThorReference(ConvRef((3, 2), 2, 2, 1), param_values(net), lr, damping, 0.9,
                        batch_size=8, frequency=3)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=3)
    assert [type(c).__name__ for c in opt.thor_cells] == ["Conv2dThor", "DenseThor"]
    assert opt.a_layouts[0].n == 3 * 3 * 2
    batches = [(rng.standard_normal((8, 3, 9, 9)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32))
               for _ in range(steps)]
    run_against_oracle(net, ref, train_cell(net, opt), batches)


# ----------------------------------------------------------------------------------- embedding
def test_embedding_dense_layernorm_matches_reference(mode, path, rng):
    steps = 5
    net = EmbedNet()
    init_params(net, rng)
    lr, damping = schedules(steps)

    def keep(name):
        return not name.startswith("ln.") and "bias" not in name

    ref = ThorReference(EmbedRef(1e-7), param_values(net), lr, damping, 0.9, weight_decay=0.005, batch_size=8,
                        decay_filter=keep, frequency=2, layernorm=("ln",))
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, weight_decay=0.005, batch_size=8, frequency=2,
               decay_filter=lambda p: keep(p.name))
    assert [c.kind for c in opt.thor_cells] == ["embedding", "dense", "dense"]
    batches = [(rng.integers(0, 12, (8, 3)).astype(np.int32), rng.integers(0, 4, 8).astype(np.int32))
               for _ in range(steps)]
    run_against_oracle(net, ref, train_cell(net, opt), batches)


# ----------------------------------------------------------------------------------- degenerate case
def test_identity_factors_damping_zero_equals_momentum(mode, rng):
    """With A = I, G = I (times loss_scale**2, as the layers store it) and damping 0, THOR is Momentum."""
    steps = 3
    net = MLP(6, 5, 3)
    init_params(net, rng)
    plain = MLP(6, 5, 3)
    for p, q in zip(plain.trainable_params(), net.trainable_params()):
        p.set_data(Tensor(q.asnumpy()))
    lr = Tensor(np.array([0.1, 0.05, 0.02], np.float32))
    opt = thor(net, lr, Tensor(np.zeros(steps, np.float32)), 0.9, loss_scale=4.0, frequency=2)
    for layer in opt.thor_cells:
        layer.matrix_a_cov.set_data(Tensor(np.eye(layer.a_dim, dtype=np.float32)))
        layer.matrix_g_cov.set_data(Tensor(16.0 * np.eye(layer.g_dim, dtype=np.float32)))
    momentum = nn.Momentum(plain.trainable_params(), lr, 0.9, loss_scale=4.0)
    for step in range(steps):
        grads = tuple(Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in net.trainable_params())
        opt(grads)
        momentum(grads)
        for p, q in zip(net.trainable_params(), plain.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=RTOL, atol=ATOL, err_msg=f"{p.name} step {step}")
        assert int(opt.global_step.asnumpy()[0]) == step + 1


def test_thor_flag_schedule_and_damping_end(mode, rng):
    """thor_flag is written (t + 1) % f == 0 after every step; step t is a THOR step iff t % f == 0
    (the inverses change exactly then); a damping Tensor shorter than the run is a clear error."""
    net = MLP(6, 5, 3)
    init_params(net, rng)
    lr = Tensor(np.full(10, 0.05, np.float32))
    opt = thor(net, lr, Tensor(np.full(5, 0.1, np.float32)), 0.9, batch_size=4, frequency=3)
    assert all(bool(layer.thor_flag.asnumpy()) for layer in opt.thor_cells)  # step 0 is a THOR step
    cell = train_cell(net, opt)
    before = opt.matrix_a_inv[1].asnumpy().copy()
    for t in range(5):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        cell(Tensor(x), Tensor(rng.integers(0, 3, 4).astype(np.int32)))
        after = opt.matrix_a_inv[1].asnumpy().copy()
        assert (not np.array_equal(before, after)) == (t % 3 == 0), f"step {t}"
        before = after
        for layer in opt.thor_cells:
            assert bool(layer.thor_flag.asnumpy()) == ((t + 1) % 3 == 0)
        assert int(opt.global_step.asnumpy()[0]) == t + 1
    with pytest.raises(ValueError, match=r"For 'thor', the argument 'damping' gives 5 values, one per step, "
                                         r"but step 6 was requested"):
        cell(Tensor(rng.standard_normal((4, 6)).astype(np.float32)), Tensor(np.zeros(4, np.int32)))


def test_public_attributes():
    net = MLP(6, 5, 3)
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, frequency=7, split_indices=[0, 1])
    assert isinstance(opt, ThorOptimizer) and isinstance(opt, nn.Optimizer)
    assert opt.get_frequency() == opt.frequency == 7
    assert all(isinstance(c, ThorLayer) for c in opt.thor_cells) and opt.num_layers == 2
    names = {p.name for p in opt.get_parameters()}
    assert {"matrix_a_inv_blocks_0", "matrix_a_inv_blocks_1", "matrix_g_inv_blocks_0", "matrix_g_inv_blocks_1",
            "global_step", "momentum",
            "moments.fc1.weight", "moments.fc2.bias"} <= names
    assert opt.matrix_a_inv[0].shape == (1, 6, 6) and opt.matrix_g_inv[0].shape == (1, 5, 5)
    assert opt.split_indices == [0, 1]


# ----------------------------------------------------------------------------------- preconditioner
class _Blocks(nn.Cell):
    def __init__(self, layout_a, layout_g):
        super().__init__()
        self.la, self.lg = layout_a, layout_g
        self.ga = (layout_a.n, layout_a.nblocks, layout_a.bs)
        self.gg = (layout_g.n, layout_g.nblocks, layout_g.bs)

    def construct(self, a, g, grad, lam):
        ba = pc.damped_blocks(a, lam, self.la.n, self.la.nblocks, self.la.bs, self.la.eye, self.la.pad_eye)
        bg = pc.damped_blocks(g, lam, self.lg.n, self.lg.nblocks, self.lg.bs, self.lg.eye, self.lg.pad_eye)
        ia, ig = pc.invert_blocks(ba), pc.invert_blocks(bg)
        ok = ops.logical_and(pc.accept_inverse(ba, ia, self.la.eye), pc.accept_inverse(bg, ig, self.lg.eye))
        return ia, ig, ok, apply_right(apply_left(ig, grad, *self.gg), ia, *self.ga)


@pytest.mark.parametrize("block_size", [4, 3, None])
def test_preconditioner_blocks_match_numpy(mode, rng, block_size):
    """Blocked (last block smaller, padded with the identity) and whole-matrix inverses and the product
    G^-1 dW A^-1 equal the NumPy block-diagonal versions."""
    n_a, n_g = 10, 7
    xa = rng.standard_normal((12, n_a))
    xg = rng.standard_normal((12, n_g))
    a, g = xa.T @ xa / 12, xg.T @ xg / 12
    grad = rng.standard_normal((n_g, n_a))
    lam = 0.3
    la, lg = pc.BlockLayout(n_a, block_size), pc.BlockLayout(n_g, block_size)
    ia, ig, ok, pre = _Blocks(la, lg)(Tensor(stored_form(a, block_size).astype(np.float32)),
                                     Tensor(stored_form(g, block_size).astype(np.float32)),
                                     Tensor(grad.astype(np.float32)), Tensor(np.float32(lam)))
    assert bool(ok.asnumpy())
    bs = n_a if block_size is None else block_size
    assert ia.shape == (int(np.ceil(n_a / bs)), min(bs, n_a), min(bs, n_a))
    want_a = block_inverse(a, lam, block_size)
    got_a = np.zeros((la.padded, la.padded))
    for k in range(la.nblocks):
        got_a[k * la.bs:(k + 1) * la.bs, k * la.bs:(k + 1) * la.bs] = ia.asnumpy()[k]
    np.testing.assert_allclose(got_a[:n_a, :n_a], want_a, rtol=RTOL, atol=ATOL)
    if la.pad:  # the padding of the last block is the (damped) identity's inverse, off the real block
        tail = ia.asnumpy()[-1][n_a - (la.nblocks - 1) * la.bs:, n_a - (la.nblocks - 1) * la.bs:]
        np.testing.assert_allclose(tail, np.eye(la.pad) / (1 + lam), rtol=RTOL)
    want = block_inverse(g, lam, block_size) @ grad @ want_a
    np.testing.assert_allclose(pre.asnumpy(), want, rtol=RTOL, atol=ATOL)


class _KeepIf(nn.Cell):
    def construct(self, new, old):
        return keep_if(ops.all(ops.isfinite(new)), new, old)


@pytest.mark.parametrize("shape", [(3, 4, 4), (5,), (6, 2)])
def test_keep_if_takes_the_whole_new_tensor_or_keeps_the_old(mode, rng, shape):
    """keep_if (the select behind every "store only if finite" rule): a finite new value is taken
    exactly, one non-finite entry keeps the whole old value."""
    new = rng.standard_normal(shape).astype(np.float32)
    old = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(_KeepIf()(Tensor(new), Tensor(old)).asnumpy(), new)
    bad = new.copy()
    bad.reshape(-1)[-1] = np.inf
    np.testing.assert_array_equal(_KeepIf()(Tensor(bad), Tensor(old)).asnumpy(), old)


def test_preconditioner_rejects_singular_and_nonfinite(mode):
    """damping 0 with a singular factor, or a factor with a NaN or an infinite entry (one, or all): the
    inverse is rejected (never NaN); the identity is accepted."""
    layout = pc.BlockLayout(4, None)
    cell = _Blocks(layout, layout)
    singular = np.ones((4, 4), np.float32)
    nan = np.full((4, 4), np.nan, np.float32)
    good = np.eye(4, dtype=np.float32)
    one_inf, one_nan = good.copy(), good.copy()
    one_inf[1, 2], one_nan[3, 3] = np.inf, np.nan
    _, _, ok, _ = cell(Tensor(good), Tensor(good), Tensor(np.ones((4, 4), np.float32)), Tensor(np.float32(0.0)))
    assert bool(ok.asnumpy())
    for bad in (singular, nan, one_inf, one_nan, np.full((4, 4), np.inf, np.float32)):
        _, _, ok, _ = cell(Tensor(bad), Tensor(good), Tensor(np.ones((4, 4), np.float32)), Tensor(np.float32(0.0)))
        assert not bool(ok.asnumpy())
