"""Write ``thor_checkpoints.npz``'s companions: checkpoints of three THOR optimizers and what the run did next.

For each of ``thor`` (damping and learning rate Tensors), ``damping`` (``damping="adaptive"``) and
``recipe_free`` (``learning_rate`` and ``damping`` ``"adaptive"``): an MLP from fixed weights trained 4 steps
by ``ms_optim.nn.TrainOneStepCell`` on fixed batches, its training cell saved to ``thor_<name>.ckpt``, then 2
more steps, whose parameters go to ``thor_checkpoints.npz`` (``<name>/<parameter>``). The checkpoints are a
format users keep: ``tests/thor/test_thor_checkpoint_format.py`` loads them into today's optimizers and checks
that every entry finds its Parameter and that the run goes on as it did.

    python tests/data/make_thor_checkpoints.py      # rewrites the files beside this script
"""
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ms_optim import nn as ms_nn  # noqa: E402

CONFIGS = ("thor", "damping", "recipe_free")


def build(name: str):
    """The net (fixed weights), its optimizer and its training cell for config ``name``."""
    rng = np.random.default_rng(7)
    net = nn.SequentialCell([nn.Dense(12, 40, activation="relu"), nn.Dense(40, 5)])
    for param in net.trainable_params():
        param.set_data(Tensor((0.3 * rng.standard_normal(param.shape)).astype(np.float32)))
    lr = "adaptive" if name == "recipe_free" else Tensor(np.float32(0.05))
    damping = Tensor(np.float32(0.03)) if name == "thor" else "adaptive"
    extra = {} if name == "thor" else {"adapt_every": 2}
    opt = ms_nn.thor(net, lr, damping, 0.9, batch_size=16, frequency=3, **extra)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return net, opt, ms_nn.TrainOneStepCell(loss, opt).set_train()


def batches():
    rng = np.random.default_rng(8)
    return [(Tensor(rng.standard_normal((16, 12)).astype(np.float32)),
             Tensor(rng.integers(0, 5, 16).astype(np.int32))) for _ in range(6)]


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    after = {}
    for name in CONFIGS:
        net, _, cell = build(name)
        data = batches()
        for x, y in data[:4]:
            cell(x, y)
        ms.save_checkpoint(cell, os.path.join(HERE, f"thor_{name}.ckpt"))
        for x, y in data[4:]:
            cell(x, y)
        after.update({f"{name}/{p.name}": p.asnumpy() for p in net.trainable_params()})
    np.savez(os.path.join(HERE, "thor_checkpoints.npz"), **after)


if __name__ == "__main__":
    main()
