"""How often a training step runs the network's forward pass, counted by the network itself (an int32 Parameter
it adds 1 to in its forward, so every execution counts, in GRAPH_MODE too): with an adaptive THOR, ms_optim's
training cells run it once for the loss and the gradients and once for the probe (``ms_optim._thor.probe``),
and for every other optimizer once, as MindSpore's cells do. In GRAPH_MODE a loss computed by a separate
forward call would be a third execution: MindSpore reuses the loss's forward inside the gradient's only while
the network is called nowhere else in the step."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_optim import nn as ms_nn
from ms_optim import thor

STEPS = 4
BATCH = 16
SEQ = 6
VOCAB = 12


class _Counted(nn.Cell):
    """Embedding rows picked at positions offset by ``arange(batch) * seq`` (the zoo BERT's masked-LM gather:
    with it, MindSpore 2.10's GRAPH_MODE fails to compile a plain second call of the network next to the
    gradient that gives the loss), then Dense and mean sparse cross-entropy; counts its forward executions in
    ``runs``."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 8)
        self.dense = nn.Dense(8, 3)
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        self.runs = Parameter(Tensor(0, ms.int32), name="forward_runs", requires_grad=False)

    def construct(self, ids, positions, labels):
        ids = ops.depend(ids, ops.assign_add(self.runs, Tensor(1, ms.int32)))
        batch, seq = ids.shape
        rows = self.embedding(ids).reshape(batch * seq, 8)
        offsets = (ops.arange(batch, dtype=ms.int32) * seq).reshape(batch, 1)
        picked = ops.gather(rows, (positions + offsets).reshape(-1), 0)
        return self.loss(self.dense(picked), labels.reshape(-1))


def _optimizer(kind, loss_net):
    if kind == "momentum":
        return nn.Momentum(loss_net.trainable_params(), 0.1, 0.9)
    if kind == "adaptive_damping":
        return thor(loss_net, Tensor(np.float32(0.05)), "adaptive", 0.9, batch_size=BATCH, frequency=2,
                    adapt_every=2)
    return thor(loss_net, "adaptive", Tensor(np.float32(0.3)), 0.9, batch_size=BATCH, frequency=2)


def _cell(kind, loss_net, opt):
    if kind == "plain":
        return ms_nn.TrainOneStepCell(loss_net, opt)
    if kind == "sens_return_grad":
        return ms_nn.TrainOneStepCell(loss_net, opt, sens=4.0, return_grad=True)
    return ms_nn.TrainOneStepWithLossScaleCell(loss_net, opt, Tensor(np.float32(8.0)))


# (optimizer, cell, forward executions in STEPS steps)
CASES = [
    ("adaptive_lr", "plain", 2 * STEPS),
    ("adaptive_lr", "sens_return_grad", 2 * STEPS),
    ("adaptive_lr", "loss_scale", 2 * STEPS),
    ("adaptive_damping", "plain", 2 * STEPS),  # every step is measured (it may be taken back)
    ("momentum", "plain", STEPS),
    ("momentum", "loss_scale", STEPS),
]


@pytest.mark.parametrize("kind, cell_kind, expected", CASES)
def test_forward_runs_per_step(mode, rng, kind, cell_kind, expected):
    loss_net = _Counted()
    opt = _optimizer(kind, loss_net)
    cell = _cell(cell_kind, loss_net, opt).set_train()
    ids = Tensor(rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32))
    positions = Tensor(rng.integers(0, SEQ, (BATCH, 2)).astype(np.int32))
    labels = Tensor((ids.asnumpy()[np.arange(BATCH)[:, None], positions.asnumpy()] % 3).astype(np.int32))
    losses = []
    for _ in range(STEPS):
        out = cell(ids, positions, labels)
        losses.append(float((out[0] if isinstance(out, tuple) else out).asnumpy()))
    assert int(loss_net.runs.asnumpy()) == expected
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses  # the steps trained
