"""A training cell with adaptive THOR runs its step as two graphs when called in GRAPH_MODE
(``ms_optim._extra_pass._TwoGraphs``: the loss, gradients and optimizer, then the extra forward pass and the
optimizer's finish), and as one graph inside another cell's graph: the same numbers either way.

Checked for both of ms_optim's training cells and for ``learning_rate`` and ``damping`` "adaptive" with
weight decay (the decay terms are read before the optimizer's branch): every loss, parameter and piece of
optimizer state bit for bit equal after every step, a loss-scale overflow skipping the probe in both; which
cells run as two graphs (none in PYNATIVE_MODE, none for a subclass with a ``construct`` of its own);
``compile`` ahead of the first step compiling both graphs.
"""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from support.nets import MLP
from support.thor_runs import init_params, mlp_batches

from ms_optim import nn as ms_nn
from ms_optim import thor
from ms_optim._memory import release_after_compile

pytestmark = pytest.mark.core  # selected by CI's version leg on the oldest MindSpore (.ci/run)

STEPS = 6
OVERFLOW_STEP = 3  # a batch scaled so that its loss-scaled gradients overflow float32


class _Outer(nn.Cell):
    """Calls a training cell from its own graph: the training cell's construct is compiled into it."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, x, y):
        return self.cell(x, y)


def _loss_net(net):
    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def _build(kind: str, scaled: bool, seed: int = 3):
    net = MLP()
    init_params(net, np.random.default_rng(seed))
    lr = "adaptive" if kind == "lr" else Tensor(0.05, ms.float32)
    opt = thor(net, lr, "adaptive", 0.9, weight_decay=1e-3, batch_size=16, frequency=3, adapt_every=2)
    if scaled:
        cell = ms_nn.TrainOneStepWithLossScaleCell(_loss_net(net), opt, scale_sense=Tensor(2.0 ** 10, ms.float32))
    else:
        cell = ms_nn.TrainOneStepCell(_loss_net(net), opt)
    return net, opt, cell.set_train()


def _state(net, opt):
    """Every parameter of the net and of the optimizer, in the cells' order, with its name (``_Outer`` renames
    some: the runs are compared position by position)."""
    return [(p.name, p.asnumpy().copy()) for p in list(net.get_parameters()) + list(opt.get_parameters())]


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "loss_scale"])
@pytest.mark.parametrize("kind", ["lr", "damping"])
def test_two_graphs_and_one_graph_give_the_same_numbers(graph_mode, kind, scaled):
    net_two, opt_two, two = _build(kind, scaled)
    net_one, opt_one, cell_one = _build(kind, scaled)
    one = _Outer(cell_one)
    assert len(two._graph_parts()) == 2
    batches = mlp_batches(np.random.default_rng(7), STEPS)
    for step, (x, y) in enumerate(batches):
        if scaled and step == OVERFLOW_STEP:
            x = x * np.float32(1e36)  # the loss-scaled gradients overflow: no update and no probe
        out_two, out_one = two(Tensor(x), Tensor(y)), one(Tensor(x), Tensor(y))
        outs = zip(out_two, out_one) if scaled else [(out_two, out_one)]
        for got, expected in outs:
            np.testing.assert_array_equal(got.asnumpy(), expected.asnumpy(), err_msg=f"output at step {step}")
        if scaled:
            assert bool(out_two[1].asnumpy()) == (step == OVERFLOW_STEP)
        state_two, state_one = _state(net_two, opt_two), _state(net_one, opt_one)
        assert len(state_two) == len(state_one)
        for (name, value), (_, expected) in zip(state_two, state_one):
            np.testing.assert_array_equal(value, expected, err_msg=f"{name} after step {step}")
    assert int(opt_two.global_step.asnumpy()[0]) == STEPS - (1 if scaled else 0)


def test_compile_ahead_compiles_both_graphs(graph_mode):
    """``cell.compile(x, y)`` before the first step (as ``ms_optim.release_freed_memory``'s docs show)
    compiles both graphs, each wrapped by ``release_after_compile`` as ``ModelThor`` wraps its cell; the steps
    then find them compiled and train."""
    _, opt, cell = _build("lr", False)
    (x, y), = mlp_batches(np.random.default_rng(7), 1)
    assert release_after_compile(cell) is cell
    parts = cell._graph_parts()
    assert all(part.compile is not type(part).compile for part in parts)  # each graph releases after compiling
    cell.compile(Tensor(x), Tensor(y))
    compiled = [set(part.compile_cache) for part in parts]
    assert all(compiled), compiled
    loss = cell(Tensor(x), Tensor(y))
    assert [set(part.compile_cache) for part in parts] == compiled  # nothing compiled again
    assert np.isfinite(float(loss.asnumpy())) and int(opt.global_step.asnumpy()[0]) == 1


def test_one_graph_where_two_cannot_be_run():
    """PYNATIVE_MODE runs the cell's construct; a subclass with a construct of its own always runs it; a
    THOR without an adaptive mode, or another optimizer, needs no second graph."""
    _, _, cell = _build("lr", False)
    assert cell._graph_parts() == ()  # PYNATIVE_MODE (the tests' default)

    class Own(ms_nn.TrainOneStepCell):
        def construct(self, *inputs):
            return ops.depend(self.network(*inputs), self.optimizer(self.grad(self.network, self.weights)(
                *inputs, Tensor(1.0, ms.float32))))

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        assert len(cell._graph_parts()) == 2
        net = MLP()
        own = Own(_loss_net(net), thor(net, "adaptive", "adaptive", 0.9))
        assert own._graph_parts() == ()
        net = MLP()
        fixed = ms_nn.TrainOneStepCell(_loss_net(net), thor(net, Tensor(0.1), Tensor(0.03), 0.9))
        assert fixed._graph_parts() == ()
        net = MLP()
        plain = ms_nn.TrainOneStepCell(_loss_net(net), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        assert plain._graph_parts() == ()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
