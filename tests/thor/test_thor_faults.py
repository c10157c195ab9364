"""THOR under faults: overflowing steps, dead layers, singular factors, checkpoint and resume.

What holds when a loss-scale cell skips a step (non-finite gradients; the optimizer is not called):
parameters, moments, inverses, ``global_step`` and every ``thor_flag`` are untouched, and
``matrix_g_cov`` too (a layer keeps its previous G when the new one is not finite). ``matrix_a_cov``
is untouched on a skipped non-THOR step (no factor work at all); on a skipped THOR step the layer
has already stored the A of the bad batch, but the flag stays True, so the retried step stores a
fresh A before the optimizer reads it: the trajectory is exactly the one without the bad batch.
"""
import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from reference.thor_ref import MLPRef, ThorReference
from support.nets import MLP

from ms_optim._thor.factory import thor
from ms_optim.loss_scale import TrainOneStepWithLossScaleCell  # MindSpore's needs an Ascend-only op on CPU

RTOL = 1e-3
ATOL = 1e-6


def _make(seed=3, **kwargs):
    net = MLP(6, 5, 3)
    rng = np.random.default_rng(seed)
    for p in net.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.7).astype(np.float32)))
    return net


def _loss_net(net):
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def _state(opt, net):
    return {
        **{p.name: p.asnumpy().copy() for p in net.trainable_params()},
        **{p.name: p.asnumpy().copy() for p in opt.moments},
        **{p.name: p.asnumpy().copy() for p in opt.matrix_a_inv},
        **{p.name: p.asnumpy().copy() for p in opt.matrix_g_inv},
        **{p.name: p.asnumpy().copy() for p in opt.matrix_g_cov},
        **{p.name: p.asnumpy().copy() for p in opt.thor_flags},
        "global_step": opt.global_step.asnumpy().copy(),
    }


def _assert_same(before, after, what):
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=f"{name} changed by {what}")


def test_overflow_step_is_skipped_and_trajectory_continues(mode, rng):
    """DynamicLossScaleManager: a non-finite batch on a non-THOR step and on a THOR step is skipped;
    the run equals the oracle trained on the good batches only (frequency 2)."""
    net = _make()
    steps = 4
    lr = np.linspace(0.1, 0.05, steps).astype(np.float32)
    damping = np.full(steps, 0.05, np.float32)
    ref = ThorReference(MLPRef(), {p.name: p.asnumpy() for p in net.trainable_params()}, lr, damping, 0.9,
                        batch_size=8, frequency=2)
    opt = thor(net, Tensor(lr), Tensor(damping), 0.9, batch_size=8, frequency=2)
    manager = ms.DynamicLossScaleManager(init_loss_scale=1.0, scale_factor=2, scale_window=1000)
    cell = TrainOneStepWithLossScaleCell(_loss_net(net), opt, scale_sense=manager.get_update_cell()).set_train()
    good = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
            for _ in range(steps)]
    bad_x = rng.standard_normal((8, 6)).astype(np.float32)
    bad_x[2, 1] = np.inf
    bad = (bad_x, rng.integers(0, 3, 8).astype(np.int32))
    # t = 0 (THOR), bad at t = 1 (non-THOR), t = 1, bad at t = 2 (THOR), t = 2 (THOR, retried), t = 3
    plan = [good[0], bad, good[1], bad, good[2], good[3]]
    done = 0
    for x, y in plan:
        is_bad = x is bad_x
        t = int(opt.global_step.asnumpy()[0])
        before = _state(opt, net)
        a_before = [p.asnumpy().copy() for p in opt.matrix_a_cov]
        _, overflow, _ = cell(Tensor(x), Tensor(y))
        assert bool(overflow.asnumpy()) == is_bad
        if is_bad:
            _assert_same(before, _state(opt, net), f"the skipped step at t={t}")
            if t % 2 != 0:  # non-THOR step: no factor work at all
                for a0, p in zip(a_before, opt.matrix_a_cov):
                    np.testing.assert_array_equal(p.asnumpy(), a0)
        else:
            ref.step(x, y)
            done += 1
            for p in net.trainable_params():
                np.testing.assert_allclose(p.asnumpy(), ref.params[p.name], rtol=RTOL, atol=ATOL,
                                           err_msg=f"{p.name} after good step {done}")
    assert int(opt.global_step.asnumpy()[0]) == steps


def test_dead_layer_and_singular_factors_never_put_nan(mode, rng):
    """A dead ReLU layer (all-zero activations: A of fc2 and G of fc1 are zero) with damping 0, and
    an input with a zero feature and fewer samples than features (singular A of fc1): the singular
    factors' inverses are rejected (the layer keeps its previous inverse, here the identity) and the
    parameters stay finite."""
    net = _make()
    net.fc1.bias.set_data(Tensor(np.full((5,), -1e3, np.float32)))  # every ReLU unit dead
    steps = 3
    opt = thor(net, Tensor(np.full(steps, 0.1, np.float32)), Tensor(np.zeros(steps, np.float32)), 0.9,
               batch_size=4, frequency=2)
    cell = nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    for _ in range(steps):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        x[:, 0] = 0.0
        cell(Tensor(x), Tensor(rng.integers(0, 3, 4).astype(np.int32)))
        for p in net.trainable_params():
            assert np.all(np.isfinite(p.asnumpy())), p.name
    assert np.all(net.fc2.matrix_a_cov.asnumpy() == 0)          # the dead layer's A is zero ...
    np.testing.assert_array_equal(opt.matrix_a_inv[1].asnumpy()[0], np.eye(5))   # ... its inverse rejected
    np.testing.assert_array_equal(opt.matrix_g_inv[0].asnumpy()[0], np.eye(5))   # fc1's G is zero too
    for p in list(opt.matrix_a_inv) + list(opt.matrix_g_inv) + list(opt.moments):
        assert np.all(np.isfinite(p.asnumpy())), p.name


def test_checkpoint_resume_mid_cycle(mode, rng, tmp_path):
    """Save the training cell (net + optimizer) after 2 steps of a frequency-3 run, rebuild everything,
    load, continue: identical to the uninterrupted run, same frequency phase (step 3 is a THOR step)."""
    steps, split = 6, 2
    lr = Tensor(np.linspace(0.1, 0.04, steps).astype(np.float32))
    damping = Tensor(np.linspace(0.05, 0.02, steps).astype(np.float32))
    batches = [(Tensor(rng.standard_normal((8, 6)).astype(np.float32)), Tensor(rng.integers(0, 3, 8).astype(np.int32)))
               for _ in range(steps)]

    def build(seed):
        net = _make(seed)
        opt = thor(net, lr, damping, 0.9, batch_size=8, frequency=3)
        return net, opt, nn.TrainOneStepCell(_loss_net(net), opt).set_train()

    net_a, _, cell_a = build(3)
    trajectory = []
    for x, y in batches:
        cell_a(x, y)
        trajectory.append({p.name: p.asnumpy().copy() for p in net_a.trainable_params()})

    net_b, _, cell_b = build(3)
    for x, y in batches[:split]:
        cell_b(x, y)
    path = os.path.join(str(tmp_path), "thor.ckpt")
    ms.save_checkpoint(cell_b, path)

    net_c, opt_c, cell_c = build(11)  # different initial values: everything must come from the checkpoint
    param_not_loaded, _ = ms.load_param_into_net(cell_c, ms.load_checkpoint(path))
    assert param_not_loaded == []
    assert int(opt_c.global_step.asnumpy()[0]) == split
    assert not any(bool(f.asnumpy()) for f in opt_c.thor_flags)  # step 2 is not a THOR step
    inverses_at_load = [p.asnumpy().copy() for p in opt_c.matrix_a_inv]
    for t in range(split, steps):
        cell_c(*batches[t])
        if t == split:  # a non-THOR step reuses the loaded inverses
            for p, q in zip(opt_c.matrix_a_inv, inverses_at_load):
                np.testing.assert_array_equal(p.asnumpy(), q)
        for p in net_c.trainable_params():
            np.testing.assert_allclose(p.asnumpy(), trajectory[t][p.name], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{p.name} at step {t}")


def test_sync_thor_flags_reaches_the_compiled_graph(mode, rng):
    """After steps compiled the training graph (which writes the flags), moving ``global_step`` to a
    THOR step and calling ``sync_thor_flags`` makes the NEXT step collect fc1's factor A from its
    batch (the flags are written in place, so the compiled graph sees them)."""
    net = _make()
    opt = thor(net, Tensor(np.full(8, 0.05, np.float32)), Tensor(np.full(8, 0.05, np.float32)), 0.9,
               batch_size=8, frequency=3)
    cell = nn.TrainOneStepCell(_loss_net(net), opt).set_train()
    batches = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
               for _ in range(3)]
    for x, y in batches[:2]:                          # steps 0 (THOR) and 1: flags now False
        cell(Tensor(x), Tensor(y))
    assert not any(bool(f.asnumpy()) for f in opt.thor_flags)
    a_step0 = net.fc1.matrix_a_cov.asnumpy().copy()
    ops.assign(opt.global_step, Tensor(np.array([3], np.int32)))
    opt.sync_thor_flags()
    assert all(bool(f.asnumpy()) for f in opt.thor_flags)
    x, y = batches[2]
    cell(Tensor(x), Tensor(y))
    expected = x.astype(np.float64).T @ x.astype(np.float64) / 8
    np.testing.assert_allclose(net.fc1.matrix_a_cov.asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(a_step0, expected)
    assert not any(bool(f.asnumpy()) for f in opt.thor_flags)   # step 4 is not a THOR step
