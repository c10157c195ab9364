"""Small MindSpore nets shared by the THOR optimizer and fault tests (their NumPy twins are in
``reference/thor_ref.py``), and the labelled dataset the Model/ModelThor tests feed them."""
import mindspore.dataset as ds
from mindspore import nn


def labelled_batches(x, y, batch: int):
    """``{"x", "y"}`` batches of ``batch`` rows, in order. The labels are sliced as (1,) arrays and
    reshaped to scalars in the pipeline: with NumPy 2, MindSpore's dataset refuses NumPy scalars."""
    data = ds.NumpySlicesDataset({"x": x, "y": y.reshape(-1, 1)}, shuffle=False)
    data = data.map(lambda v: v.reshape(()), input_columns="y")
    return data.batch(batch, drop_remainder=True)


class MLP(nn.Cell):
    """Dense(n_in -> hidden, ReLU) -> Dense(hidden -> classes), both with biases. The default width
    150 is over one 128-wide inverse block, so blocking matters. ``weight_init``: both layers' (None:
    MindSpore's default)."""

    def __init__(self, n_in=20, hidden=150, classes=10, weight_init=None):
        super().__init__()
        self.fc1 = nn.Dense(n_in, hidden, weight_init=weight_init, activation="relu")
        self.fc2 = nn.Dense(hidden, classes, weight_init=weight_init)

    def construct(self, x):
        return self.fc2(self.fc1(x))
