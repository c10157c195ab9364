"""Worker for the data-parallel loss-scale test (2 CPU ranks under ``msrun``, or alone as the reference).

Under ``ms_optim.use()``, trains ``Dense(4, 3)`` + MSELoss for 3 steps with the zoo-style subclasses of
``mindspore.nn.TrainOneStepWithLossScaleCell`` (``tests/support/loss_scale_cells.py``: ``bert`` with
MindSpore's Momentum, ``global_norm`` with ms_optim's Lamb) and a DynamicLossScaleManager, in GRAPH and PYNATIVE
mode. Step 2's global batch has an inf in the half that rank 1 gets, so only rank 1 sees it locally: the
overflow must be all-reduced and both ranks skip the step. Under ``msrun`` each rank takes its half
(data parallel, ``gradients_mean=True``); alone (``--single``) the process takes the whole batch.
Writes ``OUT/<kind>_<mode>_rank<r>.npz`` (``..._single.npz`` alone): parameters, optimizer state, the
loss scale and the overflow flag of every step.

Usage: python loss_scale_worker.py --out DIR [--single]
"""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(HERE))  # tests/: support

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from worker import BOTH_MODES, save_state, start_worker, trained_state  # noqa: E402  (tests/distributed/worker.py)

import ms_optim  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 3
BAD_STEP = 1            # 0-based: this step's batch has an inf ...
BAD_SAMPLE = GLOBAL_BATCH // 2 + 1  # ... in the half that rank 1 trains on
KINDS = {"bert": "momentum", "global_norm": "lamb"}


def batches():
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((STEPS, GLOBAL_BATCH, 4)) * 2.0).astype(np.float32)
    ys = rng.standard_normal((STEPS, GLOBAL_BATCH, 3)).astype(np.float32)
    xs[BAD_STEP, BAD_SAMPLE, 2] = np.inf
    return xs, ys


def build(kind: str):
    from support.loss_scale_cells import zoo_cells

    ms.set_seed(0)
    rng = np.random.default_rng(5)
    net = nn.Dense(4, 3)
    net.weight.set_data(Tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    net.bias.set_data(Tensor(rng.standard_normal(3).astype(np.float32)))
    opt = (nn.Momentum(net.trainable_params(), 0.1, 0.9) if KINDS[kind] == "momentum"
           else ms_optim.nn.Lamb(net.trainable_params(), 0.01))
    manager = ms.amp.DynamicLossScaleManager(init_loss_scale=2.0 ** 10, scale_factor=2, scale_window=1000)
    cell = zoo_cells()[kind](nn.WithLossCell(net, nn.MSELoss()), opt, manager.get_update_cell())
    return net, opt, cell.set_train()


def main() -> None:
    args, rank, size = start_worker(__doc__.splitlines()[0])
    local = GLOBAL_BATCH // size
    xs, ys = batches()
    ms_optim.use(verbose=False)  # as `python -m ms_optim.run` does before the script runs
    for mode_name, mode in BOTH_MODES:
        ms.set_context(mode=mode)
        for kind in KINDS:
            net, opt, cell = build(kind)
            assert (cell.reducer_flag, cell.is_distributed) == (size > 1, size > 1)
            scales, overflows = [], []
            for step in range(STEPS):
                out = cell(Tensor(xs[step, rank * local:(rank + 1) * local]),
                           Tensor(ys[step, rank * local:(rank + 1) * local]))
                scale = cell.loss_scale if kind == "bert" else cell.scale_sense
                scales.append(float(scale.asnumpy()))
                overflows.append(bool(out[1].asnumpy()) if kind == "bert" else False)
            state = trained_state(net, opt)
            state["__scales__"] = np.array(scales)
            state["__overflows__"] = np.array(overflows)
            save_state(args, rank, f"{kind}_{mode_name}", state)
    print(f"loss-scale worker rank {rank}/{size} done")


if __name__ == "__main__":
    main()
