"""Training callbacks: progress lines, per-epoch summaries and step-numbered checkpoints.

Both callbacks count *global* steps (across epochs and across a resume): the trainer calls
``Model.train`` once per epoch and sets ``start_step`` before each call. In dataset-sink mode
MindSpore calls ``on_train_step_end`` once per sink, so steps are counted from ``cur_step_num``.
"""
from __future__ import annotations

import os
import time
from typing import Callable, List, Optional, Sequence

import numpy as np
from mindspore import Tensor, save_checkpoint
from mindspore import float16 as ms_float16, float32 as ms_float32
from mindspore.train.callback import Callback

__all__ = ["ProgressMonitor", "StepCheckpoint", "gather_state", "RankStatsAverager"]

# Per-rank running statistics: BatchNorm's moving averages and THOR's last-step factors. Data-parallel
# training keeps weights and optimizer state identical on every rank but not these.
_RANK_LOCAL_SUFFIXES = ("moving_mean", "moving_variance", "matrix_a_cov", "matrix_g_cov")


def _loss_value(outputs) -> float:
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    if isinstance(outputs, Tensor):
        return float(np.mean(outputs.asnumpy()))
    return float(outputs)


def gather_state(cells: Sequence) -> List[dict]:
    """Every Parameter of ``cells`` (network and optimizer: weights, BN statistics, THOR factors and
    inverses, momenta, global_step, lr), each once, as ``save_checkpoint``'s list of dicts."""
    seen = {}
    for cell in cells:
        for name, param in cell.parameters_and_names():
            seen.setdefault(param.name, param)
    return [{"name": name, "data": Tensor(param.asnumpy())} for name, param in seen.items()]


class ProgressMonitor(Callback):
    """Prints ``epoch e/E step s/S (global g) loss l lr r step t ms images/s x`` every ``interval``
    steps and an epoch summary; images/s is this process's throughput times ``rank_size``."""

    def __init__(self, epoch_size: int, steps_per_epoch: int, batch_size: int, rank_size: int,
                 interval: int, lr: Optional[np.ndarray] = None, printer: Callable[[str], None] = print):
        super().__init__()
        self.epoch_size, self.steps_per_epoch = epoch_size, steps_per_epoch
        self.batch_size, self.rank_size, self.interval = batch_size, rank_size, interval
        self.lr, self.printer = lr, printer
        self.start_step = 0        # global steps done before the current Model.train call
        self.epoch = 0             # 0-based epoch of the current call
        self.losses: List[float] = []
        self.last_loss = float("nan")

    def on_train_epoch_begin(self, run_context):
        self._epoch_t0 = self._t0 = time.perf_counter()
        self._last_step = self.start_step
        self._epoch_first = self.start_step
        self.losses = []

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        g = self.start_step + params.cur_step_num
        loss = _loss_value(params.net_outputs)
        self.last_loss = loss
        self.losses.append(loss)
        if not np.isfinite(loss):
            self.printer(f"step {g}: loss is {loss}; stopping")
            run_context.request_stop()
        crossed = g // self.interval > self._last_step // self.interval
        if crossed or g == (self.epoch + 1) * self.steps_per_epoch:
            now = time.perf_counter()
            steps = g - self._last_step
            step_ms = 1000.0 * (now - self._t0) / max(steps, 1)
            ips = self.batch_size * self.rank_size * steps / max(now - self._t0, 1e-9)
            lr = f" lr {self.lr[g - 1]:.6f}" if self.lr is not None and g - 1 < len(self.lr) else ""
            self.printer(f"epoch {self.epoch + 1}/{self.epoch_size} step {g - self.epoch * self.steps_per_epoch}"
                         f"/{self.steps_per_epoch} (global {g}) loss {loss:.4f}{lr} "
                         f"step {step_ms:.1f} ms images/s {ips:.1f}")
            self._t0, self._last_step = now, g

    def on_train_epoch_end(self, run_context):
        params = run_context.original_args()
        g = self.start_step + params.cur_step_num
        seconds = time.perf_counter() - self._epoch_t0
        steps = g - self._epoch_first
        mean = float(np.mean(self.losses)) if self.losses else float("nan")
        self.printer(f"epoch {self.epoch + 1}/{self.epoch_size} done: {steps} steps in {seconds:.1f} s, "
                     f"mean loss {mean:.4f}, last loss {self.last_loss:.4f}, "
                     f"{self.batch_size * self.rank_size * steps / max(seconds, 1e-9):.1f} images/s")


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


class StepCheckpoint(Callback):
    """Saves network + optimizer state every ``every`` global steps and at the last step, as
    ``{prefix}-{epoch}_{step_in_epoch}.ckpt`` with the zoo's bookkeeping in the file
    (``zoo_step``, ``zoo_steps_per_epoch``), keeping the newest ``keep_max`` files."""

    def __init__(self, directory: str, prefix: str, cells: Sequence, every: int, keep_max: int,
                 steps_per_epoch: int, total_steps: int, printer: Callable[[str], None] = print,
                 before_save: Optional[Callable[[], None]] = None):
        super().__init__()
        self.before_save = before_save
        self.directory, self.prefix, self.cells = directory, prefix, list(cells)
        self.every, self.keep_max = every, keep_max
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.printer = printer
        self.start_step = 0
        self._last = None
        self.saved: List[str] = []
        self.last_path: Optional[str] = None

    def on_train_step_end(self, run_context):
        g = self.start_step + run_context.original_args().cur_step_num
        last = self._last if self._last is not None else self.start_step
        if g // self.every > last // self.every or g == self.total_steps:
            self.save(g)
        self._last = g

    def on_train_begin(self, run_context):
        self._last = None

    def save(self, g: int) -> str:
        epoch, step = (g - 1) // self.steps_per_epoch + 1, (g - 1) % self.steps_per_epoch + 1
        path = os.path.join(self.directory, f"{self.prefix}-{epoch}_{step}.ckpt")
        if self.before_save is not None:
            self.before_save()
        save_checkpoint(gather_state(self.cells), path,
                        append_dict={"zoo_step": g, "zoo_steps_per_epoch": self.steps_per_epoch})
        self.saved.append(path)
        self.last_path = path
        while len(self.saved) > self.keep_max:
            old = self.saved.pop(0)
            if os.path.exists(old):
                os.remove(old)
        self.printer(f"checkpoint saved: {path}")
        return path
