"""Checkpoints that never go bad: ``FiniteCheckpoint``, a MindSpore ``Callback`` for any zoo trainer.

Contract: a file it writes holds only finite values (every Parameter of the given cells: weights,
BatchNorm statistics, optimizer state). At every step end it reads the loss (unless
``stop_on_loss=False``: in a data-parallel run each rank sees its own loss, and ranks that stopped at
different steps would wait for each other for ever; the state at a save, identical on every rank
once ``before_save`` has averaged the rank-local statistics, decides for all of them alike); at every
save it reads the whole state. A non-finite loss or state is never saved: the callback records ``failure`` (one
line), asks MindSpore to stop, and ``raise_if_failed()`` then raises ``NonFiniteState`` (a
``TrainingFailed``: exit status 1 through ``model_zoo.common.cli.run_main``). Rotation
(``keep_max``) removes old files only after a newer one was written, so the last finite checkpoint
always stays on disk. MindSpore writes each file under a temporary name and renames it.

Usage, as in ``model_zoo/resnet`` and ``model_zoo/bert``::

    saver = FiniteCheckpoint(out_dir, "lenet", (net, opt), every=100, keep_max=3, total_steps=n)
    model.train(epochs, data, callbacks=[saver])
    saver.raise_if_failed()
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, save_checkpoint
from mindspore.train.callback import Callback

from .cli import TrainingFailed

__all__ = ["FiniteCheckpoint", "NonFiniteState", "gather_state", "non_finite_entries", "save_finite",
           "loss_value"]


class NonFiniteState(TrainingFailed):
    """The loss or the state to save became non-finite; nothing non-finite was written."""


def loss_value(outputs: Any) -> float:
    """The loss of a training step's ``net_outputs`` (the first element of a tuple), as a float."""
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    if isinstance(outputs, Tensor):
        return float(np.mean(outputs.asnumpy()))
    return float(np.mean(np.asarray(outputs)))


def gather_state(cells: Sequence) -> Dict[str, np.ndarray]:
    """Every Parameter of ``cells`` (network and optimizer), each once by name, as NumPy copies."""
    state: Dict[str, np.ndarray] = {}
    for cell in cells:
        for _, param in cell.parameters_and_names():
            if param.name not in state:
                state[param.name] = param.asnumpy()
    return state


def non_finite_entries(state: Mapping[str, np.ndarray]) -> List[Tuple[str, int]]:
    """``(name, count of NaN/inf values)`` of every floating-point entry of ``state`` that has any."""
    bad = []
    for name, value in state.items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating):
            count = int(value.size - np.count_nonzero(np.isfinite(value)))
            if count:
                bad.append((name, count))
    return bad


def _describe(bad: List[Tuple[str, int]]) -> str:
    total = sum(count for _, count in bad)
    return f"{total} non-finite values in {len(bad)} tensors, first '{bad[0][0]}'"


def save_finite(cells: Sequence, path: str, append_dict: Optional[Dict[str, Any]] = None) -> None:
    """Save every Parameter of ``cells`` to ``path``; raise ``NonFiniteState`` (writing nothing) if any
    floating-point value is NaN or inf."""
    state = gather_state(cells)
    bad = non_finite_entries(state)
    if bad:
        raise NonFiniteState(f"not saving {path}: {_describe(bad)}")
    save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in state.items()], path, append_dict=append_dict)


class FiniteCheckpoint(Callback):
    """Saves the state of ``cells`` every ``every`` global steps and at step ``total_steps`` as
    ``directory/{file_name(step)}``, keeping the newest ``keep_max`` files; stops the run instead of
    saving (or continuing with) a non-finite loss or state.

    ``start_step`` is the number of global steps done before the current ``Model.train`` call (a
    trainer that calls ``Model.train`` once per epoch, or resumes, sets it). ``before_save`` runs
    before each save (e.g. to average rank-local statistics); ``stop_on_loss=False`` leaves the loss
    unchecked (data-parallel runs, see the module docstring). Subclasses may override
    ``file_name(step)`` and ``extra(step)`` (entries appended to the file).
    """

    def __init__(self, directory: str, prefix: str, cells: Sequence, every: int, keep_max: int,
                 total_steps: Optional[int] = None, printer: Callable[[str], None] = print,
                 before_save: Optional[Callable[[], None]] = None, stop_on_loss: bool = True):
        super().__init__()
        self.stop_on_loss = stop_on_loss
        if every < 1 or keep_max < 1:
            raise ValueError(f"every and keep_max must be >= 1, got {every} and {keep_max}")
        self.directory, self.prefix, self.cells = directory, prefix, list(cells)
        self.every, self.keep_max, self.total_steps = every, keep_max, total_steps
        self.printer, self.before_save = printer, before_save
        self.start_step = 0
        self.saved: List[str] = []
        self.last_path: Optional[str] = None
        self.failure: Optional[str] = None
        self._last: Optional[int] = None

    # ------------------------------------------------------------------ naming (overridable)
    def file_name(self, step: int) -> str:
        return f"{self.prefix}-{step}.ckpt"

    def extra(self, step: int) -> Dict[str, Any]:
        return {}

    # ------------------------------------------------------------------------------ callback
    def on_train_begin(self, run_context):
        self._last = None

    def on_train_step_end(self, run_context):
        if self.failure is not None:
            run_context.request_stop()
            return
        params = run_context.original_args()
        step = self.start_step + params.cur_step_num
        loss = loss_value(params.net_outputs) if self.stop_on_loss else 0.0
        if not np.isfinite(loss):
            self._fail(f"step {step}: the loss became {loss}", run_context)
            return
        last = self._last if self._last is not None else self.start_step
        if step // self.every > last // self.every or step == self.total_steps:
            if self.save(step) is None:
                run_context.request_stop()
        self._last = step

    # ----------------------------------------------------------------------------- saving
    def save(self, step: int) -> Optional[str]:
        """Write the checkpoint of global step ``step``; returns its path, or None (and sets
        ``failure``) when the state is not finite."""
        if self.before_save is not None:
            self.before_save()
        path = os.path.join(self.directory, self.file_name(step))
        state = gather_state(self.cells)
        bad = non_finite_entries(state)
        if bad:
            self._fail(f"step {step}: the parameters became non-finite ({_describe(bad)})", None)
            return None
        os.makedirs(self.directory, exist_ok=True)
        save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in state.items()], path,
                        append_dict=self.extra(step) or None)
        if path in self.saved:
            self.saved.remove(path)
        self.saved.append(path)
        self.last_path = path
        while len(self.saved) > self.keep_max:
            old = self.saved.pop(0)
            if os.path.exists(old):
                os.remove(old)
        self.printer(f"checkpoint saved: {path}")
        return path

    def _fail(self, reason: str, run_context) -> None:
        kept = f"last finite checkpoint {self.last_path}" if self.last_path else "no checkpoint was saved"
        self.failure = f"{reason}; training stopped, {kept}"
        if run_context is not None:
            run_context.request_stop()

    def raise_if_failed(self) -> None:
        """Raise ``NonFiniteState`` with the one-line reason if the run was stopped."""
        if self.failure is not None:
            raise NonFiniteState(self.failure)
