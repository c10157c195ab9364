"""Small MindSpore nets shared by the THOR tests (their NumPy twins are in ``reference/thor_ref.py``:
``MLPRef``, ``ConvRef``, ``EmbedRef``), and the labelled dataset the Model/ModelThor tests feed them."""
import mindspore.dataset as ds
from mindspore import nn, ops


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


def _conv_out(size: int, kernel: int, pad_mode: str, dilation: int, stride: int = 2, padding: int = 1) -> int:
    """Output length of one spatial axis of ``ConvNet``'s conv (MindSpore's "pad" and "same" rules)."""
    if pad_mode == "same":
        return -(-size // stride)
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class ConvNet(nn.Cell):
    """Conv2d(3 -> 4, 3x2 kernel, stride 2, bias) -> ReLU -> flatten -> Dense(-> 5) on 9x9 inputs.

    ``pad_mode`` "pad" (padding 1) or "same"; ``dilation`` 1 or more. The oracle's twin is
    ``ConvRef((3, 2), 2, dilation, padding, pad_mode)``. ``ConvNet(dilation=2)`` gives 4x5 output positions
    (Dense 80 -> 5); ``ConvNet("pad")`` and ``ConvNet("same")`` give 5x5 (Dense 100 -> 5)."""

    def __init__(self, pad_mode: str = "pad", dilation: int = 1, size: int = 9):
        super().__init__()
        padding = 1 if pad_mode == "pad" else 0
        self.conv = nn.Conv2d(3, 4, (3, 2), stride=2, pad_mode=pad_mode, padding=padding, dilation=dilation,
                              has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        positions = _conv_out(size, 3, pad_mode, dilation) * _conv_out(size, 2, pad_mode, dilation)
        self.fc = nn.Dense(4 * positions, 5)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


class EmbedNet(nn.Cell):
    """Embedding(vocab -> dim) of ``tokens`` ids -> Dense(tokens * dim -> hidden) -> LayerNorm -> ReLU ->
    Dense(hidden -> classes): EmbeddingThor, DenseThor and THOR's LayerNorm rule (``EmbedRef``)."""

    def __init__(self, vocab=12, dim=6, tokens=3, hidden=16, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc1 = nn.Dense(tokens * dim, hidden)
        self.ln = nn.LayerNorm((hidden,), epsilon=1e-7)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(hidden, classes)
        self.flat = tokens * dim

    def construct(self, ids):
        e = self.emb(ids)
        x = ops.reshape(e, (e.shape[0], self.flat))
        return self.fc2(self.relu(self.ln(self.fc1(x))))
