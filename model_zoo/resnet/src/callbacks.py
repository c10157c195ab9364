"""The ResNet trainer's checkpoints (``StepCheckpoint``) and the rank-statistics averaging before them.

Progress lines come from ``model_zoo.common.progress.ProgressMonitor``; the finite-state contract of
the checkpoints (nothing non-finite is ever written, the run stops instead) from
``model_zoo.common.checkpoint.FiniteCheckpoint``.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np
from mindspore import Tensor
from mindspore import float16 as ms_float16
from mindspore import float32 as ms_float32

from model_zoo.common.checkpoint import FiniteCheckpoint

__all__ = ["StepCheckpoint", "RankStatsAverager"]

# Per-rank running statistics: BatchNorm's moving averages and THOR's last-step factors. Data-parallel
# training keeps weights and optimizer state identical on every rank but not these.
_RANK_LOCAL_SUFFIXES = ("moving_mean", "moving_variance", "matrix_a_cov", "matrix_g_cov")


class RankStatsAverager:
    """Replaces every rank-local statistic (see ``_RANK_LOCAL_SUFFIXES``) by its mean over the ranks,
    in one all-reduce, so all ranks write the same checkpoint. Training is unaffected: BatchNorm uses
    batch statistics while training, and THOR recomputes its factors before it next uses them."""

    def __init__(self, cells: Sequence, rank_size: int):
        import mindspore.ops as ops

        seen = {}
        for cell in cells:
            for _, param in cell.parameters_and_names():
                if param.name.endswith(_RANK_LOCAL_SUFFIXES) and param.dtype in (ms_float32, ms_float16):
                    seen.setdefault(param.name, param)
        self.params = list(seen.values())
        self.rank_size = rank_size
        self.allreduce = ops.AllReduce()

    def __call__(self) -> None:
        if not self.params or self.rank_size <= 1:
            return
        flat = np.concatenate([p.asnumpy().astype(np.float32).reshape(-1) for p in self.params])
        total = self.allreduce(Tensor(flat)).asnumpy() / self.rank_size
        offset = 0
        for param in self.params:
            size = int(np.prod(param.shape))
            param.set_data(Tensor(total[offset:offset + size].reshape(param.shape), param.dtype))
            offset += size


class StepCheckpoint(FiniteCheckpoint):
    """Network + optimizer state (weights, BN statistics, THOR factors and inverses, momenta,
    global_step, lr) as ``{prefix}-{epoch}_{step_in_epoch}.ckpt``, with the zoo's bookkeeping in the
    file (``zoo_step``, ``zoo_steps_per_epoch``) so ``--resume`` continues exactly."""

    def __init__(self, directory: str, prefix: str, cells: Sequence, every: int, keep_max: int,
                 steps_per_epoch: int, total_steps: int, **kwargs):
        super().__init__(directory, prefix, cells, every, keep_max, total_steps=total_steps, **kwargs)
        self.steps_per_epoch = steps_per_epoch

    def file_name(self, step: int) -> str:
        epoch, in_epoch = (step - 1) // self.steps_per_epoch + 1, (step - 1) % self.steps_per_epoch + 1
        return f"{self.prefix}-{epoch}_{in_epoch}.ckpt"

    def extra(self, step: int) -> Dict[str, Any]:
        return {"zoo_step": step, "zoo_steps_per_epoch": self.steps_per_epoch}
