"""Training THOR beside its NumPy float64 oracle (``reference.thor_ref``): initial values, batches,
learning-rate/damping schedules, the training cell, and the step-by-step comparison."""
from typing import List, Tuple

import numpy as np
from mindspore import Tensor, nn

from support.params import param_values

RTOL = 1e-3  # every parameter and the loss, every step, against the oracle
ATOL = 1e-6


def init_params(net, rng) -> None:
    """Well-scaled random values (so the factors dominate the damping) written into ``net``."""
    for p in net.trainable_params():
        shape = p.shape
        if p.name.endswith("gamma"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif p.name.endswith(("bias", "beta")):
            value = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = rng.standard_normal(shape) * (1.0 if "embedding" in p.name else np.sqrt(2.0 / fan_in))
        p.set_data(Tensor(value.astype(np.float32)))


def train_cell(net, opt, sens=None):
    """``TrainOneStepCell`` with mean sparse softmax cross-entropy (``sens``: a fixed loss scale)."""
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(loss, opt) if sens is None else nn.TrainOneStepCell(loss, opt, sens=sens)
    return cell.set_train()


def compare(net, ref, step) -> None:
    """Every trainable parameter of ``net`` equals the oracle's (rtol RTOL, atol ATOL)."""
    got = param_values(net)
    assert set(got) == set(ref.params)
    for name, want in ref.params.items():
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"parameter {name} after step {step}")


def run_against_oracle(net, ref, cell, batches) -> None:
    """Train ``cell`` and step ``ref`` on each batch; the loss and every parameter agree after every step."""
    for step, (x, y) in enumerate(batches):
        loss = cell(Tensor(x), Tensor(y))
        ref.step(x, y)
        np.testing.assert_allclose(float(loss.asnumpy()), ref.losses[-1], rtol=RTOL,
                                   err_msg=f"loss at step {step}")
        compare(net, ref, step)


def mlp_batches(rng, steps, batch=16, n_in=20, classes=10) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``steps`` (x, labels) batches for ``MLP(n_in, ., classes)``."""
    return [(rng.standard_normal((batch, n_in)).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int32)) for _ in range(steps)]


def net_batches(rng, data: str, steps: int, batch: int = 8) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``steps`` batches for ``data``: "conv" (9x9 images for ``ConvNet``, 5 classes), "vectors" (6 features,
    2 classes, for ``MLP(6, ., 2)``) or "ids" (3 token ids < 12 for ``EmbedNet``, 4 classes)."""
    if data == "conv":
        return [(rng.standard_normal((batch, 3, 9, 9)).astype(np.float32),
                 rng.integers(0, 5, batch).astype(np.int32)) for _ in range(steps)]
    if data == "vectors":
        return [(rng.standard_normal((batch, 6)).astype(np.float32),
                 rng.integers(0, 2, batch).astype(np.int32)) for _ in range(steps)]
    return [(rng.integers(0, 12, (batch, 3)).astype(np.int32), rng.integers(0, 4, batch).astype(np.int32))
            for _ in range(steps)]


def schedules(steps) -> Tuple[np.ndarray, np.ndarray]:
    """Per-step learning rate (0.1 -> 0.05) and damping (0.05 -> 0.02), float32."""
    lr = np.linspace(0.1, 0.05, steps).astype(np.float32)
    damping = np.linspace(0.05, 0.02, steps).astype(np.float32)
    return lr, damping
