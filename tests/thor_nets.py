"""Small MindSpore nets shared by the THOR optimizer and fault tests (their NumPy twins are in
``reference/thor_ref.py``)."""
from mindspore import nn


class MLP(nn.Cell):
    """Dense(n_in -> hidden, ReLU) -> Dense(hidden -> classes), both with biases. The default width
    150 is over one 128-wide inverse block, so blocking matters."""

    def __init__(self, n_in=20, hidden=150, classes=10):
        super().__init__()
        self.fc1 = nn.Dense(n_in, hidden, activation="relu")
        self.fc2 = nn.Dense(hidden, classes)

    def construct(self, x):
        return self.fc2(self.fc1(x))
