"""Worker for the data-parallel test of THOR's adaptive rules (2 CPU ranks under ``msrun``, or alone as the
reference).

Trains ``worker.SmallNet`` (conv + 2 Dense, ``support.thor_runs.init_params``'s values) for ``STEPS`` steps
with ``thor(...)`` in three settings (``RUNS``): ``damping="adaptive"`` with a learning-rate Tensor,
``learning_rate="adaptive"`` with a damping Tensor (momentum 0.9: the averaged step), and all three adaptive
(``momentum="adaptive"`` too: the 2x2 solve), each on two kinds of global batch
(``DATA``): ``"split"``, 8 samples of which each rank takes its own half, and ``"twin"``, whose two halves are
the same 4 samples (so each rank's factors are the factors of the concatenated batch), in GRAPH and PYNATIVE
mode. Under ``msrun``: data parallel, ``gradients_mean=True``;
alone (``--single``): the whole (concatenated) batch in one process. Every run steps
``ms_optim.nn.TrainOneStepCell`` (the extra forward pass: the adaptive damping's, or the adaptive learning
rate's at its trial point).

Writes ``OUT/<run>_<data>_<mode>_rank<r>.npz`` (``..._single.npz`` alone): the net's and the optimizer's
parameters after the last step, and per step the loss (``__losses__``), the damping (``__dampings__``) and,
with the adaptive learning rate, ``__alphas__``/``__betas__`` and the calibration kappa (``__kappas__``).

Usage: python adaptive_worker.py --out DIR [--single]
"""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from worker import (  # noqa: E402
    BOTH_MODES,
    GLOBAL_BATCH,
    SmallNet,
    global_batches,
    save_state,
    start_worker,
    trained_state,  # noqa: E402
)

STEPS = 6
#: run -> (learning_rate, damping): "adaptive" or a constant Tensor's value
RUNS = {"damping": (0.05, "adaptive"), "lr": ("adaptive", 0.3), "both": ("adaptive", "adaptive")}
#: the momentum argument of each run: the averaged step with 0.9, the 2x2 solve ("adaptive") where both adapt
MOMENTUM = {"damping": 0.9, "lr": 0.9, "both": "adaptive"}
DATA = ("split", "twin")


def batches(data: str):
    """``STEPS`` global batches: ``global_batches``'s, or (``"twin"``) their first half twice."""
    xs, ys = global_batches(STEPS)
    if data == "twin":
        half = GLOBAL_BATCH // 2
        xs = np.concatenate([xs[:, :half], xs[:, :half]], axis=1)
        ys = np.concatenate([ys[:, :half], ys[:, :half]], axis=1)
    return xs, ys


def _schedule(value):
    return value if isinstance(value, str) else Tensor(np.float32(value))


def run(name: str, data: str, rank: int, local: int):
    from support.thor_runs import init_params

    from ms_optim import nn as ms_nn
    from ms_optim import thor

    net = SmallNet()
    init_params(net, np.random.default_rng(11))  # well-scaled (the same on every rank and alone)
    learning_rate, damping = RUNS[name]
    opt = thor(net, _schedule(learning_rate), _schedule(damping), MOMENTUM[name], batch_size=local, frequency=2,
               **(dict(adapt_every=2) if damping == "adaptive" else {}))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = ms_nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
    xs, ys = batches(data)
    history = {"__losses__": [], "__dampings__": [], "__alphas__": [], "__betas__": [], "__kappas__": [],
               "__ratios__": []}
    for s in range(STEPS):
        part = slice(rank * local, (rank + 1) * local)
        history["__losses__"].append(float(cell(Tensor(xs[s, part]), Tensor(ys[s, part])).asnumpy()))
        history["__dampings__"].append(float(np.asarray(opt.damping.asnumpy()).reshape(-1)[0]))
        if damping == "adaptive":  # the reduction ratio of the last adaptation step
            history["__ratios__"].append(float(opt.damping_rule.ratio.asnumpy()))
        if learning_rate == "adaptive":
            history["__alphas__"].append(float(opt.step_rule.step_size.asnumpy()))
            history["__betas__"].append(float(opt.step_rule.momentum_coefficient.asnumpy()))
            history["__kappas__"].append(float(opt.step_rule.calibration.asnumpy()))
    state = trained_state(net, opt)
    state.update({key: np.array(values) for key, values in history.items()})
    return state


def main() -> None:
    args, rank, size = start_worker(__doc__.splitlines()[0])
    local = GLOBAL_BATCH // size
    for mode_name, mode in BOTH_MODES:
        ms.set_context(mode=mode)
        for name in RUNS:
            for data in DATA:
                save_state(args, rank, f"{name}_{data}_{mode_name}", run(name, data, rank, local))
    print(f"adaptive worker rank {rank}/{size} done")


if __name__ == "__main__":
    main()
