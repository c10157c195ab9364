"""Training callbacks of the LeNet5 example, in MindSpore's ``Callback`` style.

* :class:`AccuracyMonitor` measures the held-out accuracy every ``eval_every`` steps (training clock
  paused), records the history, stops at a time cap or at the target when asked, stops at the first
  non-finite loss, and optionally writes a checkpoint after each measurement whose parameters and
  optimizer state are all finite (atomically, so the last finite checkpoint always survives).
* :class:`ProgressMonitor` shows the run: a progress bar redrawn in place when the stream is an
  interactive terminal, one plain line per epoch otherwise (logs, CI).
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, TextIO

import numpy as np
from mindspore.train import Callback


def _step_loss(run_context) -> float:
    out = run_context.original_args().net_outputs
    out = out[0] if isinstance(out, (tuple, list)) else out
    return float(np.asarray(out.asnumpy()).reshape(-1)[0])


def all_finite(parameters) -> bool:
    """True when every value of every parameter is finite."""
    return all(bool(np.isfinite(p.asnumpy()).all()) for p in parameters)


class AccuracyMonitor(Callback):
    """Measure test accuracy every ``eval_every`` steps and at the last step; stop on trouble.

    Args:
        accuracy: returns the held-out accuracy of the current weights.
        eval_every: steps between two measurements.
        total_steps: steps of the whole run (the last one is always measured).
        target: accuracy whose first time-to-reach is recorded.
        stop_at_target: stop as soon as ``target`` is reached.
        max_seconds: stop once the training time reaches this many seconds (None: no cap).
        state_params: parameters (network and optimizer state) checked for finiteness and saved.
        checkpoint: path of the checkpoint written after each measurement with finite state (None: none).
    """

    def __init__(self, accuracy: Callable[[], float], eval_every: int, total_steps: int, target: float = 0.97,
                 stop_at_target: bool = False, max_seconds: Optional[float] = None, state_params=(),
                 checkpoint: Optional[str] = None):
        super().__init__()
        self.accuracy, self.eval_every, self.total_steps = accuracy, eval_every, total_steps
        self.target, self.stop_at_target, self.max_seconds = target, stop_at_target, max_seconds
        self.state_params, self.checkpoint = list(state_params), checkpoint
        self.history: List[Dict] = []
        self.loss = float("nan")
        self.seconds_to_target: Optional[float] = None
        self.capped = False
        self.diverged: Optional[int] = None  # step whose loss or state was not finite
        self.saved_step: Optional[int] = None
        self._start = self._paused = 0.0
        self._last_eval = 0

    def seconds(self) -> float:
        """Training seconds so far (measurements excluded)."""
        return time.perf_counter() - self._start - self._paused

    def on_train_begin(self, run_context):
        self._start, self._paused = time.perf_counter(), 0.0

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        self.loss = _step_loss(run_context)
        if not math.isfinite(self.loss):
            self.diverged = step
            run_context.request_stop()
            return
        if step - self._last_eval < self.eval_every and step < self.total_steps:
            return
        pause = time.perf_counter()
        seconds = pause - self._start - self._paused
        self._last_eval = step
        if self.state_params and not all_finite(self.state_params):
            self.diverged = step
            run_context.request_stop()
            self._paused += time.perf_counter() - pause
            return
        acc = self.accuracy()
        self.history.append({"step": step, "seconds": seconds, "test_accuracy": acc, "loss": self.loss})
        if self.checkpoint is not None:
            self._save(step)
        if acc >= self.target and self.seconds_to_target is None:
            self.seconds_to_target = seconds
            if self.stop_at_target:
                run_context.request_stop()
        if self.max_seconds is not None and seconds >= self.max_seconds:
            self.capped = True
            run_context.request_stop()
        self._paused += time.perf_counter() - pause

    def _save(self, step: int) -> None:
        import mindspore as ms

        tmp = f"{self.checkpoint}.tmp-{os.getpid()}.ckpt"  # MindSpore appends .ckpt to other names
        ms.save_checkpoint([{"name": p.name, "data": p} for p in self.state_params], tmp)
        os.replace(tmp, self.checkpoint)  # atomic: the previous finite checkpoint survives a crash
        self.saved_step = step


class ProgressMonitor(Callback):
    """Show epoch, step, loss, latest test accuracy and training seconds while training.

    On an interactive terminal one line is redrawn after every step as a progress bar; elsewhere
    (a log file, a pipe, CI) one plain line is printed at the end of each epoch and at the last step.
    Place it after the :class:`AccuracyMonitor` it reads.

    Args:
        label: run name printed at the start of each line.
        monitor: the accuracy monitor whose measurements are shown.
        total_steps: steps of the whole run.
        steps_per_epoch: steps per epoch.
        stream: where to write (default: ``sys.stdout``).
        bar: draw a bar (default: when ``stream`` is a terminal).
    """

    WIDTH = 24

    def __init__(self, label: str, monitor: AccuracyMonitor, total_steps: int, steps_per_epoch: int,
                 stream: Optional[TextIO] = None, bar: Optional[bool] = None):
        super().__init__()
        self.label, self.monitor = label, monitor
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.stream = stream if stream is not None else sys.stdout
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = bar
        self._last_line_epoch = 0
        self._drawn = False

    def _fields(self, step: int) -> str:
        epochs = -(-self.total_steps // self.steps_per_epoch)
        epoch = min(-(-step // self.steps_per_epoch), epochs)
        acc = self.monitor.history[-1]["test_accuracy"] if self.monitor.history else None
        acc_text = "  -   " if acc is None else f"{acc:.4f}"
        return (f"epoch {epoch}/{epochs} step {step}/{self.total_steps} loss {self.monitor.loss:.4f} "
                f"test_acc {acc_text} {self.monitor.seconds():.1f}s")

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if self.bar:
            filled = int(self.WIDTH * min(step, self.total_steps) / self.total_steps)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r[{self.label}] [{bar}] {self._fields(step)}\x1b[K")
            self.stream.flush()
            self._drawn = True
            return
        epoch = -(-step // self.steps_per_epoch)
        epoch_done = (step % self.steps_per_epoch == 0 or step >= self.total_steps) and epoch > self._last_line_epoch
        stopping = self.monitor.diverged is not None or self.monitor.capped
        if epoch_done or stopping:
            self._last_line_epoch = epoch
            print(f"[{self.label}] {self._fields(step)}", file=self.stream, flush=True)

    def on_train_end(self, run_context):
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
