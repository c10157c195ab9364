"""LeNet5 quickstart (model_zoo/lenet): argument errors, divergence, checkpoints, progress, tuned lrs.

Bad arguments are refused before MindSpore is imported (one stderr line, exit 2, nothing written),
so those tests take well under a second each. The divergence test trains a few steps.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENET = os.path.join(ROOT, "model_zoo", "lenet")
TRAIN = os.path.join(LENET, "train.py")
COMPARE = os.path.join(LENET, "compare.py")
ENV = {**os.environ, "PYTHONPATH": ROOT, "GLOG_v": "3"}

sys.path.insert(0, ROOT)
from model_zoo.lenet import compare as compare_mod  # noqa: E402
from model_zoo.lenet import train as train_mod  # noqa: E402
from model_zoo.lenet import tune as tune_mod  # noqa: E402
from model_zoo.lenet.callbacks import AccuracyMonitor, ProgressMonitor  # noqa: E402
from model_zoo.lenet.compare import format_table, note  # noqa: E402
from model_zoo.lenet.train import OPTIMIZERS, THOR_DEFAULTS, TUNED_LR_FILE, thor_recipe, tuned_lr  # noqa: E402
from model_zoo.lenet.tune import GRID, LADDER, MAX_EXTENSIONS, choose, next_outward  # noqa: E402


def _files(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


BAD = [
    (["--damping=-1"], "--damping: damping must be finite and > 0, got -1"),
    (["--damping=0"], "got 0"),
    (["--damping=nan"], "got nan"),
    (["--damping=abc"], "expected a number, got 'abc'"),
    (["--lr=inf"], "learning rate must be finite"),
    (["--lr=-0.1"], "got -0.1"),
    (["--lr-decay=-1"], "--lr-decay"),
    (["--epochs=0"], "--epochs: must be >= 1, got 0"),
    (["--frequency=1"], "--frequency: must be >= 2, got 1"),
    (["--target=1.5"], "target must be finite and > 0 and <= 1"),
    (["--max-seconds=nan"], "--max-seconds"),
    (["--optimizer=adam"], "invalid choice: 'adam'"),
    (["--json", "missing_dir/out.json"], "--json: cannot write 'missing_dir/out.json'"),
    (["--checkpoint", "missing_dir/lenet.ckpt"], "--checkpoint: cannot write"),
    (["--kl-clip=0"], "argument --kl-clip: kl-clip must be 'none' or finite, > 0 and <= 3.40282e+38, got 0"),
    (["--kl-clip=-1e-3"], "argument --kl-clip: kl-clip must be 'none' or finite, > 0 and <= 3.40282e+38, got -1e-3"),
    (["--kl-clip=nan"], "argument --kl-clip: kl-clip must be 'none' or finite, > 0 and <= 3.40282e+38, got nan"),
    (["--kl-clip=inf"], "argument --kl-clip: kl-clip must be 'none' or finite, > 0 and <= 3.40282e+38, got inf"),
    (["--kl-clip=1e39"], "argument --kl-clip: kl-clip must be 'none' or finite, > 0 and <= 3.40282e+38, got 1e39"),
    (["--kl-clip=off"], "argument --kl-clip: expected a number > 0 or 'none', got 'off'"),
    (["--factor-convention=cuda"], "argument --factor-convention: invalid choice: 'cuda'"),
    (["--factor-convention=ASCEND"], "argument --factor-convention: invalid choice: 'ASCEND'"),
    (["--optimizer=thor_adaptive", "--lr=0.1"], "--optimizer thor_adaptive chooses its own learning rate and "
                                                "damping: give no --lr or --damping"),
    (["--optimizer=thor_adaptive", "--damping=0.01"], "--optimizer thor_adaptive chooses its own learning rate"),
]


@pytest.mark.parametrize("args,expect", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_argument_is_one_line_exit_2_nothing_written(tmp_path, args, expect):
    proc = subprocess.run([sys.executable, TRAIN, *args, "--json", "out.json", "--checkpoint", "lenet.ckpt"]
                          if "--json" not in args and "--checkpoint" not in args else [sys.executable, TRAIN, *args],
                          cwd=str(tmp_path), env=ENV, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("train.py: error: ") and expect in lines[0], lines[0]
    assert proc.stdout == ""
    assert _files(str(tmp_path)) == []


@pytest.mark.parametrize("args,expect", [
    (["--kl-clip", "-1"], "argument --kl-clip: kl-clip must be 'none'"),
    (["--factor-convention", "tpu"], "argument --factor-convention: invalid choice: 'tpu'"),
])
def test_compare_bad_thor_flag_is_one_line_exit_2(tmp_path, args, expect):
    proc = subprocess.run([sys.executable, COMPARE, *args, "--plot", "p.png"], cwd=str(tmp_path), env=ENV,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("compare.py: error: ") and expect in lines[0] and args[1] in lines[0], lines[0]
    assert _files(str(tmp_path)) == []


@pytest.mark.parametrize("argv,kl_clip,convention", [
    ([], THOR_DEFAULTS["kl_clip"], THOR_DEFAULTS["factor_convention"]),
    (["--kl-clip", "1e-3", "--factor-convention", "ascend"], 1e-3, "ascend"),
    (["--kl-clip=none", "--factor-convention=gpu"], None, "gpu"),
    (["--kl-clip", " None ", "--factor-convention", "kfc"], None, "kfc"),
    (["--kl-clip", "0.5", "--factor-convention", "auto"], 0.5, "auto"),
])
def test_thor_flags_parse_and_reach_run(monkeypatch, argv, kl_clip, convention):
    args = train_mod.parse_args(argv)
    assert args.kl_clip == kl_clip and args.factor_convention == convention
    seen = {}

    def fake_run(*positional, **keywords):
        seen.update(keywords)
        return {"diverged": None, "final_loss": 0.1, "test_accuracy": 0.9, "train_seconds": 1.0,
                "seconds_to_target": None}

    monkeypatch.setattr(train_mod, "run", fake_run)
    assert train_mod.main(argv + ["--quiet"]) == 0
    assert seen["kl_clip"] == kl_clip and seen["factor_convention"] == convention


@pytest.mark.parametrize("kl_clip,convention,resolved", [(1e-3, "ascend", "ascend"), (None, "gpu", "gpu"),
                                                         (0.25, "kfc", "kfc"), (None, "auto", "kfc")])
def test_thor_flags_reach_the_optimizer(kl_clip, convention, resolved):
    """make_optimizer hands both knobs to thor(): the optimizer carries them ("auto" is "kfc" on CPU)."""
    from model_zoo.lenet.lenet import LeNet5

    opt = train_mod.make_optimizer("thor", LeNet5(), 0.1, 12, 32, kl_clip=kl_clip, factor_convention=convention)
    assert opt.kl_clip == kl_clip and opt.factor_convention == resolved


class _Built(Exception):
    pass


def test_run_passes_the_thor_flags_to_make_optimizer(monkeypatch):
    """run() builds THOR with its kl_clip / factor_convention (stopped before training)."""
    built = []
    real = train_mod.make_optimizer

    def spy(*positional, **keywords):
        built.append(real(*positional, **keywords))
        raise _Built

    monkeypatch.setattr(train_mod, "make_optimizer", spy)
    with pytest.raises(_Built):
        train_mod.run("thor", epochs=1, lr=0.1, quiet=True, kl_clip=2e-3, factor_convention="ascend")
    assert built[0].kl_clip == 2e-3 and built[0].factor_convention == "ascend"


def test_compare_and_tune_train_thor_with_train_pys_recipe(monkeypatch, tmp_path):
    calls = []

    def fake_run(name, **keywords):
        calls.append((name, keywords))
        raise RuntimeError("not training in this test")

    monkeypatch.setattr(compare_mod, "run", fake_run)
    assert compare_mod.main(["--optimizers", "thor", "momentum", "--quiet", "--plot", str(tmp_path / "p.png")]) == 1
    assert {k: calls[0][1][k] for k in thor_recipe()} == thor_recipe()
    assert not set(thor_recipe()) & set(calls[1][1])  # the first-order optimizers get no THOR settings
    calls.clear()
    assert compare_mod.main(["--optimizers", "thor", "--kl-clip", "none", "--factor-convention", "gpu", "--quiet",
                             "--plot", str(tmp_path / "p.png")]) == 1
    assert calls[0][1]["kl_clip"] is None and calls[0][1]["factor_convention"] == "gpu"
    assert {k: calls[0][1][k] for k in thor_recipe()} == thor_recipe(kl_clip=None, factor_convention="gpu")

    monkeypatch.setattr(tune_mod, "run", lambda name, **kw: calls.append((name, kw)) or {
        "test_accuracy": 0.5, "final_loss": 1.0, "diverged": None, "train_seconds": 1.0})
    calls.clear()
    tune_mod.measure("thor", 0.1, 1, None)
    tune_mod.measure("lamb", 0.01, 1, None)
    assert {k: calls[0][1][k] for k in thor_recipe()} == thor_recipe()
    assert not set(thor_recipe()) & set(calls[1][1])
    with open(TUNED_LR_FILE, encoding="utf-8") as f:
        assert json.load(f)["recipe"]["thor"] == thor_recipe()  # THOR's lr was tuned with today's recipe


def test_thor_adaptive_is_the_thor_call_with_adaptive_lr_and_damping(monkeypatch, tmp_path):
    """thor_adaptive: THOR's call of the quickstart with learning_rate and damping "adaptive" and every other
    argument the same (momentum 0.9, weight decay, frequency, clipping, ...); compare.py gives it the THOR
    recipe and no learning rate from the grid, and its row and legend say "adaptive"."""
    import dataclasses

    from model_zoo.lenet.lenet import LeNet5

    adaptive = train_mod.make_optimizer("thor_adaptive", LeNet5(), None, 12, 32).config
    scheduled = train_mod.make_optimizer("thor", LeNet5(), 0.3, 12, 32).config
    assert (adaptive.lr_mode, adaptive.damping_mode) == ("adaptive", "adaptive")
    assert scheduled.lr_mode == "scheduled"
    for field in dataclasses.fields(scheduled):
        if field.name not in ("learning_rate", "damping", "lr_mode", "damping_mode", "adapt_every", "damping_bounds"):
            assert getattr(adaptive, field.name) == getattr(scheduled, field.name), field.name
    assert adaptive.momentum == 0.9 and adaptive.frequency == THOR_DEFAULTS["frequency"]

    calls = []
    monkeypatch.setattr(compare_mod, "run", lambda name, **kw: calls.append((name, kw)) or {
        "optimizer": name, "lr": kw["lr"], "steps": 220, "final_loss": 0.01, "test_accuracy": 0.5,
        "train_seconds": 9.0, "seconds_to_target": 4.0, "stopped_by_time_cap": False, "diverged": None,
        "history": [{"step": 11, "seconds": 1.0, "test_accuracy": 0.5, "loss": 1.0}]})
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert compare_mod.main(["--optimizers", "thor", "thor_adaptive", "--quiet", "--plot",
                             str(tmp_path / "p.png")]) == 0
    table = sys.stdout.getvalue()
    assert [(name, kw["lr"]) for name, kw in calls] == [("thor", tuned_lr()["thor"]), ("thor_adaptive", "adaptive")]
    assert {k: calls[1][1][k] for k in thor_recipe()} == thor_recipe()
    assert "=== THOR adaptive (lr adaptive) ===" in table
    assert "| THOR adaptive | adaptive | 220 | 0.0100 | 0.5000 | 9.0 | 4.0 | still climbing " in table
    assert table.count("slow start with adaptive steps") == 1 and (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.slow
def test_thor_adaptive_trains_lenet():
    result = train_mod.run("thor_adaptive", epochs=1, quiet=True)
    assert result["lr"] == "adaptive" and result["damping"] == "adaptive" and result["steps"] == 44
    assert result["diverged"] is None and np.isfinite(result["final_loss"])
    assert result["test_accuracy"] > 0.8, result["test_accuracy"]


@pytest.mark.parametrize("item", ["lars=-3", "thor_adaptive=0.1"])
def test_compare_bad_lr_is_one_line_exit_2(tmp_path, item):
    proc = subprocess.run([sys.executable, COMPARE, "--lr", item, "--plot", "p.png"], cwd=str(tmp_path),
                          env=ENV, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and f"'{item}'" in lines[0], proc.stderr
    assert _files(str(tmp_path)) == []


def test_diverging_run_stops_with_one_line_error_and_keeps_only_finite_checkpoints(tmp_path):
    import mindspore as ms

    ckpt = tmp_path / "lenet.ckpt"
    proc = subprocess.run([sys.executable, TRAIN, "--optimizer", "momentum", "--lr", "1e6", "--epochs", "1",
                           "--eval-every", "1", "--quiet", "--checkpoint", str(ckpt), "--json", "r.json"],
                          cwd=str(tmp_path), env=ENV, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(errors) == 1 and errors[0].startswith("train.py: error: training diverged at step "), proc.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["diverged"] is not None and result["diverged"] < 44  # stopped early, not at the end
    assert ckpt.exists() and result["checkpoint_step"] is not None, "the last finite state was not kept"
    assert f"kept the checkpoint of step {result['checkpoint_step']}" in errors[0]
    values = ms.load_checkpoint(str(ckpt))
    assert any(name.startswith("moment") for name in values), sorted(values)  # optimizer state saved too
    for name, value in values.items():
        assert np.isfinite(value.asnumpy()).all(), name
    assert [f for f in os.listdir(tmp_path) if ".tmp-" in f] == []


class _Context:
    """A stand-in for MindSpore's RunContext: step number and loss output."""

    def __init__(self, step, loss):
        import mindspore as ms

        self.args = SimpleNamespace(cur_step_num=step, net_outputs=ms.Tensor(np.float32(loss)))
        self.stopped = False

    def original_args(self):
        return self.args

    def request_stop(self):
        self.stopped = True


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _drive(tty, total=8, per_epoch=4, losses=None):
    monitor = AccuracyMonitor(lambda: 0.5, eval_every=2, total_steps=total)
    stream = _Stream(tty)
    progress = ProgressMonitor("demo", monitor, total, per_epoch, stream=stream)
    monitor.on_train_begin(None)
    contexts = []
    for step in range(1, total + 1):
        ctx = _Context(step, (losses or {}).get(step, 1.0 / step))
        contexts.append(ctx)
        monitor.on_train_step_end(ctx)
        progress.on_train_step_end(ctx)
        if ctx.stopped:
            break
    progress.on_train_end(None)
    return monitor, stream.getvalue(), contexts


def test_progress_is_plain_lines_per_epoch_when_not_a_terminal():
    monitor, text, _ = _drive(tty=False)
    lines = text.splitlines()
    assert "\r" not in text and len(lines) == 2, text
    pattern = r"\[demo\] epoch (\d)/2 step (\d)/8 loss (\d\.\d{4}) test_acc 0\.5000 (\d+\.\d)s"
    assert [re.fullmatch(pattern, line).groups()[:3] for line in lines] == [("1", "4", "0.2500"),
                                                                          ("2", "8", "0.1250")]
    assert [h["step"] for h in monitor.history] == [2, 4, 6, 8]


def test_progress_is_a_bar_redrawn_in_place_on_a_terminal():
    _, text, _ = _drive(tty=True)
    frames = text.rstrip("\n").split("\r")[1:]
    assert len(frames) == 8 and text.endswith("\n")
    assert frames[0].startswith("[demo] [###.....................] epoch 1/2 step 1/8 loss 1.0000 test_acc   -   ")
    assert frames[-1].startswith("[demo] [########################] epoch 2/2 step 8/8 loss 0.1250 test_acc 0.5000")


def test_monitor_stops_at_the_first_non_finite_loss():
    monitor, text, contexts = _drive(tty=False, losses={3: float("nan")})
    assert monitor.diverged == 3 and contexts[-1].stopped and len(contexts) == 3
    assert text.splitlines()[-1].startswith("[demo] epoch 1/2 step 3/8 loss nan")


def test_every_optimizer_has_a_tuned_lr_from_its_grid():
    lrs = tuned_lr()
    assert set(lrs) == set(OPTIMIZERS) == set(GRID)
    with open(TUNED_LR_FILE, encoding="utf-8") as f:
        record = json.load(f)
    for name in OPTIMIZERS:
        rows = record["results"][name]
        tried = [r["lr"] for r in rows]
        assert set(GRID[name]) <= set(tried) <= set(LADDER) and len(tried) <= len(GRID[name]) + MAX_EXTENSIONS
        assert record["grid"][name] == tried == sorted(tried)
        assert choose(rows)["lr"] == lrs[name]  # the recorded choice follows the documented rule
        if next_outward(lrs[name], tried) is not None:  # still on an edge: only after all extensions, flagged
            assert len(tried) == len(GRID[name]) + MAX_EXTENSIONS and name in record["at_edge"], name


def test_quickstart_reads_the_tuned_lrs():
    with open(os.path.join(ROOT, "scripts", "quickstart.sh"), encoding="utf-8") as f:
        script = f.read()
    assert "--lr" not in script and "compare.py" in script


def test_an_edge_choice_extends_the_window_outward_along_the_ladder():
    assert next_outward(0.3, [0.03, 0.1, 0.3]) == 1.0
    assert next_outward(3.0, [3.0, 10.0, 30.0]) == 1.0
    assert next_outward(0.1, [0.03, 0.1, 0.3]) is None


def test_choice_rule_counts_diverged_runs_as_zero_and_breaks_ties_by_loss():
    rows = [{"lr": 1, "val_accuracy": 0.99, "final_loss": float("nan"), "diverged": 5},
            {"lr": 2, "val_accuracy": 0.95, "final_loss": 0.3, "diverged": None},
            {"lr": 3, "val_accuracy": 0.95, "final_loss": 0.2, "diverged": None}]
    assert choose(rows)["lr"] == 3


def test_table_says_why_a_row_is_below_90_percent():
    base = {"lr": 0.1, "steps": 220, "final_loss": 0.5, "train_seconds": 30.0, "seconds_to_target": None,
            "stopped_by_time_cap": False, "diverged": None}
    rows = [{**base, "optimizer": "momentum", "test_accuracy": 0.95},
            {**base, "optimizer": "asgd", "test_accuracy": 0.6},
            {**base, "optimizer": "lamb", "test_accuracy": 0.6, "stopped_by_time_cap": True, "steps": 99},
            {**base, "optimizer": "lars", "test_accuracy": 0.1, "diverged": 17},
            {"optimizer": "thor", "error": "RuntimeError: boom"}]
    assert note(rows[0], 0.9) == ""
    assert note(rows[1], 0.9) == "below 90% within the budget (220 steps at the tuned lr)"
    assert "time cap after 99 steps" in note(rows[2], 0.9)
    assert "diverged at step 17" in note(rows[3], 0.9)
    table = format_table(rows, 0.97)
    assert len(table.splitlines()) == 7 and "failed: RuntimeError: boom" in table


def _history(accuracies):
    return [{"step": 11 * (i + 1), "seconds": float(i), "test_accuracy": a, "loss": 1.0}
            for i, a in enumerate(accuracies)]


def test_note_gives_the_reason_from_the_accuracy_history():
    """Below 90%: the run reached it and fell back (swings), was still climbing, or levelled off; the note
    says which, with the numbers, instead of restating the final accuracy."""
    base = {"optimizer": "lamb", "lr": 0.03, "steps": 88, "final_loss": 0.4, "train_seconds": 4.0,
            "seconds_to_target": None, "stopped_by_time_cap": False, "diverged": None}
    swings = {**base, "test_accuracy": 0.8, "history": _history([0.5, 0.7, 0.95, 0.85, 0.93, 0.8, 0.92, 0.8])}
    assert note(swings, 0.9) == ("reached 95.0% at step 33, ended at 80.0%: accuracy swings between evaluations "
                                 "at this constant lr (last 5: 80.0% to 93.0%)")
    climbing = {**base, "test_accuracy": 0.87, "history": _history([0.1, 0.2, 0.1, 0.3, 0.4, 0.6, 0.8, 0.87])}
    assert note(climbing, 0.9) == ("still climbing when the budget ended (88 steps; best 87.0% at step 88, 30.0% "
                                   "in the first half): slow start at the tuned lr")
    flat = {**base, "test_accuracy": 0.85, "history": _history([0.5, 0.86, 0.87, 0.85, 0.86, 0.85, 0.84, 0.85])}
    assert note(flat, 0.9) == "levelled off below 90% (best 87.0% at step 33, 88 steps at the tuned lr)"
