"""Training progress in MindSpore's callbacks style: ``ProgressMonitor`` and the ``LinePrinter`` it writes to.

Lines (``unit`` is ``images`` or ``tokens``; ``samples_per_step`` counts them over all ranks)::

    epoch 1/3 step 20/50 (global 20) loss 2.1034 lr 0.100000 step 41.2 ms images/s 776.3 elapsed 1.9 s
    epoch 1/3 done: 50 steps in 2.1 s, mean loss 2.2011, last loss 2.0102, 761.0 images/s, elapsed 2.1 s

On an interactive terminal the step line is rewritten in place (carriage return) and the epoch line
stays; anywhere else (logs, pipes, CI) every line is a plain line and no carriage return is written.
Steps are *global* (across epochs and across a resume): a trainer that calls ``Model.train`` once per
epoch, or resumes, sets ``start_step`` to the steps done before the call. In dataset-sink mode
MindSpore calls ``on_train_step_end`` once per sink, and the line covers the whole sink.
"""
from __future__ import annotations

import sys
import time
from typing import List, Optional, TextIO

import numpy as np
from mindspore.train.callback import Callback

from .checkpoint import loss_value

__all__ = ["LinePrinter", "ProgressMonitor"]


class LinePrinter:
    """``line(text)`` writes a permanent line; ``status(text)`` a transient one, rewritten in place on a
    TTY and a plain line elsewhere. Both flush."""

    def __init__(self, stream: Optional[TextIO] = None):
        self.stream = stream
        self._pending = False

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def _tty(self) -> bool:
        isatty = getattr(self._out(), "isatty", None)
        return bool(isatty and isatty())

    def line(self, text: str) -> None:
        out = self._out()
        if self._pending:
            out.write("\r\x1b[K")
            self._pending = False
        out.write(text + "\n")
        out.flush()

    def status(self, text: str) -> None:
        if not self._tty():
            self.line(text)
            return
        out = self._out()
        out.write("\r\x1b[K" + text)
        out.flush()
        self._pending = True

    __call__ = line


class ProgressMonitor(Callback):
    """Prints a step line every ``interval`` global steps (and at each epoch's last step) and an epoch
    summary; keeps ``losses`` (this epoch's) and ``last_loss``. ``lr``: the per-step learning rates."""

    def __init__(self, epoch_size: int, steps_per_epoch: int, samples_per_step: int, interval: int,
                 unit: str = "images", lr: Optional[np.ndarray] = None, printer: Optional[LinePrinter] = None):
        super().__init__()
        self.epoch_size, self.steps_per_epoch = epoch_size, steps_per_epoch
        self.samples_per_step, self.interval, self.unit = samples_per_step, max(1, interval), unit
        self.lr = lr
        self.printer = printer if printer is not None else LinePrinter()
        self.start_step = 0
        self.losses: List[float] = []
        self.all_losses: List[float] = []
        self.last_loss = float("nan")
        self._t_start: Optional[float] = None
        self._t0 = self._epoch_t0 = 0.0
        self._last_step = self._epoch_first = 0

    def _elapsed(self, now: float) -> float:
        return now - (self._t_start if self._t_start is not None else now)

    def on_train_begin(self, run_context):
        if self._t_start is None:
            self._t_start = time.perf_counter()

    def on_train_epoch_begin(self, run_context):
        params = run_context.original_args()
        self._epoch_t0 = self._t0 = time.perf_counter()
        self._last_step = self._epoch_first = self.start_step + params.cur_step_num
        self.losses = []

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        g = self.start_step + params.cur_step_num
        self.last_loss = loss_value(params.net_outputs)
        self.losses.append(self.last_loss)
        self.all_losses.append(self.last_loss)
        epoch = (g - 1) // self.steps_per_epoch
        if g // self.interval > self._last_step // self.interval or g % self.steps_per_epoch == 0:
            now = time.perf_counter()
            steps = max(g - self._last_step, 1)
            rate = self.samples_per_step * steps / max(now - self._t0, 1e-9)
            lr = f" lr {self.lr[g - 1]:.6f}" if self.lr is not None and 0 < g <= len(self.lr) else ""
            self.printer.status(
                f"epoch {epoch + 1}/{self.epoch_size} step {g - epoch * self.steps_per_epoch}/{self.steps_per_epoch}"
                f" (global {g}) loss {self.last_loss:.4f}{lr} step {1000.0 * (now - self._t0) / steps:.1f} ms "
                f"{self.unit}/s {rate:.1f} elapsed {self._elapsed(now):.1f} s")
            self._t0, self._last_step = now, g

    def on_train_epoch_end(self, run_context):
        params = run_context.original_args()
        g = self.start_step + params.cur_step_num
        now = time.perf_counter()
        seconds = now - self._epoch_t0
        steps = g - self._epoch_first
        mean = float(np.mean(self.losses)) if self.losses else float("nan")
        epoch = (max(g, 1) - 1) // self.steps_per_epoch
        self.printer.line(f"epoch {epoch + 1}/{self.epoch_size} done: {steps} steps in {seconds:.1f} s, "
                          f"mean loss {mean:.4f}, last loss {self.last_loss:.4f}, "
                          f"{self.samples_per_step * steps / max(seconds, 1e-9):.1f} {self.unit}/s, "
                          f"elapsed {self._elapsed(now):.1f} s")
