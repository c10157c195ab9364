"""A THOR step past the end of its per-step ``learning_rate``/``damping`` changes nothing.

The optimizer refuses such a step with a clear error, but it runs after the backward pass, in which the
layers' taps write ``matrix_a_cov``/``matrix_g_cov`` on a THOR step. GRAPH mode refuses the whole graph;
in PYNATIVE mode the taps' ScheduleGuard refuses it before they write. Either way every Parameter of the
net and of the optimizer keeps its value, on a THOR step and on a step in between, for either list.
"""
import numpy as np
import pytest
from mindspore import Tensor, nn
from support.nets import MLP

from ms_optim._thor.factory import thor


def _batch(rng):
    return (Tensor(rng.standard_normal((4, 6)).astype(np.float32)), Tensor(rng.integers(0, 3, 4).astype(np.int32)))


def _state(*cells):
    return {p.name: p.asnumpy().copy() for cell in cells for p in cell.get_parameters()}


@pytest.mark.parametrize("lr_steps, damping_steps, name, thor_step", [
    (4, 9, "learning_rate", True),    # step 5 (index 4) is a THOR step at frequency 2: the taps would write
    (3, 9, "learning_rate", False),   # step 4 (index 3) is not
    (9, 4, "damping", True),
])
def test_refused_step_changes_nothing(mode, rng, lr_steps, damping_steps, name, thor_step):
    net = MLP(6, 5, 3, weight_init="normal")
    opt = thor(net, Tensor(np.full(lr_steps, 0.05, np.float32)), Tensor(np.full(damping_steps, 0.03, np.float32)),
               0.9, batch_size=4, frequency=2)
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                               opt)
    steps = min(lr_steps, damping_steps)

    for _ in range(steps):
        cell(*_batch(rng))
    assert all(bool(layer.thor_flag.asnumpy()) == thor_step for layer in opt.thor_cells)
    before = _state(net, opt)
    assert any(k.endswith("matrix_g_cov") for k in before) and any(k.endswith("global_step") for k in before)
    with pytest.raises(ValueError, match=rf"For 'thor', the argument '{name}' gives {steps} values, one per step, "
                                         rf"but step {steps + 1} was requested"):
        cell(*_batch(rng))
    after = _state(net, opt)
    assert set(after) == set(before)
    for key, value in before.items():
        assert np.array_equal(value, after[key]), f"{key} changed by the refused step"


def test_jit_step_in_pynative_trains_and_refuses_without_change(rng):
    """``ms.jit`` around ``value_and_grad`` + the optimizer in PYNATIVE mode: the taps compile the guard into
    the graph; the steps train and the step past the list is refused with nothing changed."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = MLP(6, 5, 3, weight_init="normal")
    opt = thor(net, Tensor(np.full(3, 0.05, np.float32)), Tensor(np.full(9, 0.03, np.float32)), 0.9, batch_size=4,
               frequency=2)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    loss.set_train()
    grad_fn = ms.value_and_grad(loss, None, opt.parameters)

    @ms.jit
    def step(x, y):
        value, grads = grad_fn(x, y)
        opt(grads)
        return value

    start = net.fc1.weight.asnumpy().copy()
    for _ in range(3):
        assert np.isfinite(float(step(*_batch(rng)).asnumpy()))
    assert not np.array_equal(start, net.fc1.weight.asnumpy())
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 3
    before = _state(net, opt)
    with pytest.raises(ValueError, match=r"'learning_rate' gives 3 values, one per step, but step 4 was requested"):
        step(*_batch(rng))
    after = _state(net, opt)
    for key, value in before.items():
        assert np.array_equal(value, after[key]), f"{key} changed by the refused step"


def test_new_optimizer_drops_the_old_schedule_guard(rng):
    """A second ``thor()`` on the same net with scalar schedules: the taps do not keep the first optimizer's
    guard, whose step (past the end of its 2-value list) would refuse every PYNATIVE step of the new one."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = MLP(6, 5, 3, weight_init="normal")
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))

    scalar = Tensor(np.array(0.05, np.float32))
    first = nn.TrainOneStepCell(loss, thor(net, Tensor(np.full(2, 0.05, np.float32)), scalar, 0.9, batch_size=4,
                                           frequency=2))
    for _ in range(2):
        first(*_batch(rng))
    second = thor(net, scalar, scalar, 0.9, batch_size=4, frequency=2)
    assert all(layer.factor_tap.schedule_guard is None for layer in second.thor_cells)
    cell = nn.TrainOneStepCell(loss, second)
    for _ in range(3):  # a THOR step, a step in between, a THOR step
        assert np.isfinite(float(cell(*_batch(rng)).asnumpy()))
    assert int(second.global_step.asnumpy().reshape(-1)[0]) == 3

