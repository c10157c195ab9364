"""Names that must not change: the public ``ms_optim.thor`` function beside the private ``ms_optim._thor``
package, and every Parameter name of the optimizer and the converted net (checkpoints depend on them)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
from mindspore import Tensor, nn, ops

import ms_optim
import ms_optim.nn
from ms_optim._thor.factory import thor


def test_package_and_function_do_not_clash():
    """``import ms_optim._thor.net.layers as L`` works in a fresh interpreter, before and after ``ms_optim.thor``."""
    code = ("import inspect, ms_optim._thor.net.layers as L, ms_optim, ms_optim.nn;"
            "assert inspect.isfunction(ms_optim.thor) and ms_optim.thor is ms_optim.nn.thor;"
            "import ms_optim._thor.net.convert;"
            "assert inspect.isfunction(ms_optim.thor) and L.DenseThor is ms_optim.nn.DenseThor;"
            "print('NAMES-OK')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "NAMES-OK" in proc.stdout, proc.stderr[-2000:]
    assert callable(ms_optim.thor) and ms_optim.thor is ms_optim.nn.thor is thor


class _Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.conv = nn.Conv2d(1, 2, 3, has_bias=True)
        self.frozen = nn.Dense(8, 8)
        self.fc = nn.Dense(8 + 2 * 3 * 3, 3)

    def construct(self, ids, x):
        e = ops.reshape(self.frozen(ops.reshape(self.emb(ids), (-1, 8))), (-1, 8))
        c = ops.reshape(self.conv(x), (x.shape[0], -1))
        return self.fc(ops.concat((e, c), 1))


def test_parameter_names_are_stable():
    net = _Net()
    for param in net.frozen.get_parameters():
        param.requires_grad = False
    opt = thor(net, Tensor(np.float32(0.1)), Tensor(np.float32(0.01)), 0.9, block_size=4)
    assert [p.name for p in net.get_parameters()] == [
        "emb.embedding_table", "emb.matrix_a_cov", "emb.matrix_g_cov", "emb.thor_flag",
        "conv.weight", "conv.bias", "conv.matrix_a_cov", "conv.matrix_g_cov", "conv.thor_flag",
        "frozen.weight", "frozen.bias",
        "fc.weight", "fc.bias", "fc.matrix_a_cov", "fc.matrix_g_cov", "fc.thor_flag"]
    trainable = ["emb.embedding_table", "conv.weight", "conv.bias", "fc.weight", "fc.bias"]
    assert [name for name, _ in opt.parameters_and_names()] == (
        ["global_step", "learning_rate"] + trainable + ["momentum"] + [f"moments.{n}" for n in trainable]
        + [f"matrix_a_inv_blocks_{i}" for i in range(3)] + [f"matrix_g_inv_blocks_{i}" for i in range(3)]
        + [f"{layer}.{what}" for what in ("matrix_a_cov", "matrix_g_cov", "thor_flag")
           for layer in ("emb", "conv", "fc")]
        + ["factor_loss_scale"])
    # blocked layouts of width 4: emb A is its diagonal (10,), conv A 9 -> 3 blocks, fc A 26 -> 7 blocks
    assert opt.matrix_a_inv[0].shape == (10,) and opt.matrix_a_inv[1].shape == (3, 4, 4)
    assert opt.matrix_a_inv[2].shape == (7, 4, 4) and opt.matrix_g_inv[0].shape == (1, 4, 4)
