"""model_zoo.common: the one-line CLI statuses, progress lines without carriage returns off a terminal,
and FiniteCheckpoint's contract (nothing non-finite written, the last finite file never rotated away)."""
from __future__ import annotations

import io
import os
from types import SimpleNamespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from model_zoo.common.checkpoint import FiniteCheckpoint, NonFiniteState, save_finite
from model_zoo.common.cli import InputError, TrainingFailed, run_main
from model_zoo.common.progress import LinePrinter, ProgressMonitor


class _Context:
    """The part of MindSpore's RunContext the callbacks use."""

    def __init__(self, step, loss):
        self.args = SimpleNamespace(cur_step_num=step, net_outputs=Tensor(np.float32(loss)))
        self.stopped = False

    def original_args(self):
        return self.args

    def request_stop(self):
        self.stopped = True


def test_run_main_statuses(capsys):
    def fail(exc):
        def main(argv):
            raise exc
        return main

    assert run_main(fail(InputError("bad path")), None, "p.py") == 2
    assert run_main(fail(TrainingFailed("diverged")), None, "p.py") == 1
    assert run_main(lambda argv: {"a": 1}, None, "p.py") == 0 and run_main(lambda argv: 3, None, "p.py") == 3
    assert capsys.readouterr().err == "p.py: error: bad path\np.py: error: diverged\n"


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_progress_lines_plain_off_a_terminal(tty):
    stream = _Stream(tty)
    printer = LinePrinter(stream)
    monitor = ProgressMonitor(2, 3, samples_per_step=8, interval=1, unit="tokens", lr=np.full(6, 0.5),
                              printer=printer)
    monitor.on_train_begin(_Context(0, 0.0))
    monitor.on_train_epoch_begin(_Context(0, 0.0))
    for step in (1, 2, 3):
        monitor.on_train_step_end(_Context(step, 2.0 / step))
    monitor.on_train_epoch_end(_Context(3, 0.0))
    text = stream.getvalue()
    assert "epoch 1/2 step 2/3 (global 2) loss 1.0000 lr 0.500000 step " in text and "tokens/s" in text
    assert "elapsed" in text and "epoch 1/2 done: 3 steps in " in text
    if tty:  # step lines rewritten in place, the epoch line kept
        assert text.count("\r") >= 3 and text.endswith(" s\n")
    else:
        assert "\r" not in text and "\x1b" not in text and len(text.splitlines()) == 4


def test_finite_checkpoint_never_writes_non_finite_and_keeps_the_last_finite(tmp_path):
    net = nn.Dense(3, 2)
    extra = Parameter(Tensor(np.zeros(2, np.float32)), name="state.m")
    holder = nn.Cell()
    holder.m = extra
    saver = FiniteCheckpoint(str(tmp_path), "net", (net, holder), every=1, keep_max=1, total_steps=10,
                             printer=lambda line: None)
    for step in (1, 2):
        context = _Context(step, 1.0)
        saver.on_train_step_end(context)
        assert not context.stopped
    assert sorted(os.listdir(tmp_path)) == ["net-2.ckpt"]
    extra.set_data(Tensor(np.array([1.0, np.inf], np.float32)))  # optimizer state goes bad
    context = _Context(3, 1.0)
    saver.on_train_step_end(context)
    assert context.stopped and sorted(os.listdir(tmp_path)) == ["net-2.ckpt"]
    with pytest.raises(NonFiniteState, match=r"step 3: the parameters became non-finite \(1 non-finite values in 1 "
                                             r"tensors, first 'state.m'\); training stopped, last finite checkpoint"):
        saver.raise_if_failed()
    assert np.all(np.isfinite(ms.load_checkpoint(str(tmp_path / "net-2.ckpt"))["state.m"].asnumpy()))

    loss_saver = FiniteCheckpoint(str(tmp_path / "b"), "net", (net,), every=1, keep_max=1, printer=lambda x: None)
    context = _Context(1, float("nan"))
    loss_saver.on_train_step_end(context)
    assert context.stopped and not os.path.exists(tmp_path / "b")
    with pytest.raises(NonFiniteState, match="step 1: the loss became nan; training stopped, no checkpoint"):
        loss_saver.raise_if_failed()
    with pytest.raises(NonFiniteState, match="not saving"):
        save_finite((holder,), str(tmp_path / "final.ckpt"))
    assert not (tmp_path / "final.ckpt").exists()
