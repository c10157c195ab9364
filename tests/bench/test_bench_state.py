"""``benchmarks._common.set_thor_state``: every timed call after it is the step it names.

Regression: ``Parameter.set_data(t)`` aliases ``t``, so a "step 0" or "flags on" tensor shared between
calls was moved by the step's own writes and only the first timed "THOR step" was one. Here three
calls in a row, each after ``set_thor_state(opt, 0)``, must each invert every layer (counted by the
trace rule with thresholds 0) and collect new factors; ``(1, True)`` collects without inverting and
``(0, False)`` inverts without collecting.
"""
import numpy as np
from mindspore import Tensor, nn

from benchmarks._common import set_thor_state
from model_zoo.lenet.lenet import LeNet5
from ms_optim.nn import thor


def test_set_thor_state_makes_every_call_the_named_step(mode):
    net = LeNet5()
    opt = thor(net, Tensor(np.float32(0.01)), Tensor(np.float32(0.03)), 0.9, batch_size=4, frequency=100,
               trace_thresholds=0.0)
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                               opt).set_train()
    rng = np.random.default_rng(0)
    batches = [(Tensor(rng.normal(size=(4, 1, 32, 32)).astype(np.float32)),
                Tensor(rng.integers(0, 10, size=(4,)).astype(np.int32))) for _ in range(5)]

    def a_factors():
        return [p.asnumpy().copy() for p in opt.matrix_a_cov]

    for calls, (x, y) in enumerate(batches[:3], start=1):
        before = a_factors()
        set_thor_state(opt, 0)
        cell(x, y).asnumpy()
        assert opt.trace.inversion_counts().tolist() == [calls] * opt.num_layers
        assert all(not np.array_equal(b, a) for b, a in zip(before, a_factors()))
        assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 1
        assert not any(bool(f.asnumpy()) for f in opt.thor_flags)  # step 1 of frequency 100 is not a THOR step
    before = a_factors()
    set_thor_state(opt, 1, True)  # collect only
    cell(*batches[3]).asnumpy()
    assert opt.trace.inversion_counts().tolist() == [3] * opt.num_layers
    assert all(not np.array_equal(b, a) for b, a in zip(before, a_factors()))
    before = a_factors()
    set_thor_state(opt, 0, False)  # invert only
    cell(*batches[4]).asnumpy()
    assert opt.trace.inversion_counts().tolist() == [4] * opt.num_layers
    assert all(np.array_equal(b, a) for b, a in zip(before, a_factors()))
