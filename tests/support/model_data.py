"""The data, net and loss of the Model/ModelThor tests (tests/thor/test_thor_model.py), shared with the
memory-release tests that train through ModelThor."""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from support.nets import labelled_batches

N_SAMPLES, BATCH, IN, OUT = 20, 4, 6, 3          # 5 batches per dataset epoch


def sample_data(seed=0):
    """(x, labels): N_SAMPLES rows of IN normal features and OUT classes."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_SAMPLES, IN)).astype(np.float32)
    y = rng.integers(0, OUT, size=(N_SAMPLES,)).astype(np.int32)
    return x, y


def sample_dataset(x, y, batch=BATCH):
    """``{"x", "y"}`` batches of ``batch`` rows, in order."""
    return labelled_batches(x, y, batch)


class SmallMLP(nn.Cell):
    """Dense(IN -> 5) -> ReLU -> Dense(5 -> OUT), normal initial weights (from MindSpore's global seed)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(IN, 5, weight_init="normal")
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(5, OUT, weight_init="normal")

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def ce_loss():
    """Mean sparse softmax cross-entropy."""
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def thor_mlp(frequency=4, seed=0, **kwargs):
    """(net, optimizer): ``SmallMLP`` from ``seed`` and ``ms_optim.nn.thor`` on it (64 steps of lr 0.05,
    damping 0.03; momentum 0.9, weight decay 1e-4, batch size BATCH)."""
    from ms_optim.nn import thor

    ms.set_seed(seed)
    net = SmallMLP()
    steps = 64
    lr, damping = Tensor(np.full((steps,), 0.05, np.float32)), Tensor(np.full((steps,), 0.03, np.float32))
    opt = thor(net, lr, damping, 0.9, weight_decay=1e-4, batch_size=BATCH, frequency=frequency, **kwargs)
    return net, opt
