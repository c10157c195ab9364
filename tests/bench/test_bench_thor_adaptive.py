"""Smoke run of benchmarks/bench_thor_adaptive.py (marked ``bench``: excluded from the default test command):
``--quick`` on LeNet5 writes the JSON (every run, the table, the goals) and the PNG; ``--help`` explains the
options and bad ones are refused."""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_thor_adaptive.py")

pytestmark = pytest.mark.bench


def test_bench_thor_adaptive_quick_lenet(tmp_path):
    out = tmp_path / "adaptive"
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--tasks", "lenet", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "adaptive.json").read_text())
    kinds = [r["kind"] for r in result["runs"]]
    assert kinds == ["adaptive", "recipe", "thor", "momentum"]  # --quick: one grid point
    assert all(r["task"] == "lenet" and r["steps"] <= 6 for r in result["runs"])
    assert [row["kind"] for row in result["table"]] == kinds
    goals = {"never_nan", "within_1_point_every_task", "beats_momentum_time_2_of_3"}
    assert set(result["goals"]["met"]) == goals
    assert result["goals"]["step_cost_vs_thor"]["lenet"] > 0  # the adaptive step's cost, measured
    assert result["targets"] == {"lenet": 0.9} and result["settings"]["adaptive"] == ["damping", "lr"]
    for r in result["runs"]:
        assert r["nan"] or 0.0 <= r["final"] <= 1.0
    adaptive = result["runs"][0]  # momentum 0.9: the averaged step; its alpha recorded every step
    assert result["settings"]["adaptive_momentum"] == [0.9] and adaptive["momentum"] == 0.9
    assert len(adaptive["step_sizes"]) == adaptive["steps"] and max(adaptive["step_sizes"]) > 0
    assert (tmp_path / "adaptive.png").stat().st_size > 0


def test_bench_thor_adaptive_seeds_average_each_setting(tmp_path):
    """``--seeds 2``: every setting runs with seeds 1 and 2; the table's final figure is their mean."""
    out = tmp_path / "seeds"
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--tasks", "lenet", "--seeds", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "seeds.json").read_text())
    assert [(r["kind"], r["seed"]) for r in result["runs"]] == [
        (kind, seed) for seed in (1, 2) for kind in ("adaptive", "recipe", "thor", "momentum")]
    for row in result["table"]:
        mine = [r for r in result["runs"] if r["kind"] == row["kind"]]
        assert row["finals"] == [r["final"] for r in mine] and row["runs"] == 1
        assert row["final"] == pytest.approx(sum(row["finals"]) / 2) or any(r["nan"] for r in mine)
    assert result["runs"][0]["step_sizes"] != result["runs"][4]["step_sizes"]  # two seeds, two problems


def test_bench_thor_adaptive_several_momenta(tmp_path):
    """``--adaptive-momentum 0.9,0.5``: one adaptive run per momentum, each its own table row; the goals judge
    the first (its step cost is the first run's)."""
    out = tmp_path / "momenta"
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--tasks", "lenet", "--adaptive-momentum", "0.9,0.5",
                          "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "momenta.json").read_text())
    assert [(r["kind"], r["momentum"]) for r in result["runs"]] == [
        ("adaptive", 0.9), ("adaptive", 0.5), ("recipe", None), ("thor", 0.9), ("momentum", 0.9)]
    assert [(row["kind"], row["momentum"]) for row in result["table"]] == [
        (r["kind"], r["momentum"]) for r in result["runs"]]
    first, second = result["runs"][:2]
    assert first["step_sizes"] != second["step_sizes"]  # two momenta, two runs
    thor_ms = result["runs"][3]["median_step_ms"]
    assert result["goals"]["step_cost_vs_thor"]["lenet"] == pytest.approx(first["median_step_ms"] / thor_ms)
    assert result["settings"]["adaptive_momentum"] == [0.9, 0.5]


def test_bench_thor_adaptive_lr_multiples(tmp_path):
    """``--lr-multiples 1,3``: the grids, then damping='adaptive' at the best grid THOR's lr times 1 and 3 and the
    fixed damping at 3x; the table has a row per multiple, the goals are judged."""
    out = tmp_path / "multiples"
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--tasks", "lenet", "--lr-multiples", "1,3",
                          "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "multiples.json").read_text())
    best = result["runs"][0]  # --quick: one grid point
    assert [(r["kind"], r["multiple"]) for r in result["runs"]] == [
        ("thor", None), ("momentum", None), ("damping", 1), ("damping", 3), ("thor", 3)]
    assert [r["lr"] for r in result["runs"][2:]] == pytest.approx([best["lr"], 3 * best["lr"], 3 * best["lr"]])
    assert all(isinstance(r["rejected_steps"], int) for r in result["runs"] if r["kind"] == "damping")
    assert [row["multiple"] for row in result["table"]] == [1, 3]
    assert set(result["goals"]["met"]) == {"never_nan", "within_2_points_at_3x", "above_momentum_at_10x"}
    assert result["goals"]["step_cost_vs_thor"]["lenet"] == pytest.approx(
        result["runs"][2]["median_step_ms"] / best["median_step_ms"])
    assert (tmp_path / "multiples.png").stat().st_size > 0


def test_bench_thor_adaptive_help_and_bad_options():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    for text in ("--adaptive", "--lrs", "--dampings", "--quick", "--tasks", "time to target",
                 "--resnet-width", "target 0.90", "--adaptive-momentum", "--seeds", "--lr-multiples"):
        assert text in run.stdout
    for bad, option in ((["--adaptive", "lr,lr"], "--adaptive"), (["--tasks", "vgg"], "--tasks"),
                        (["--adaptive-momentum", "1.0"], "--adaptive-momentum"), (["--seeds", "0"], "--seeds"),
                        (["--adaptive-momentum", "0.9,0.9"], "--adaptive-momentum"),
                        (["--adaptive-momentum", "0.9,1.5"], "--adaptive-momentum"),
                        (["--adaptive", "damping", "--adaptive-momentum", "adaptive"], "--adaptive-momentum"),
                        (["--lr-multiples", "1,0"], "--lr-multiples"), (["--lr-multiples", "1", "--cost"],
                                                                           "--lr-multiples")):
        refused = subprocess.run([sys.executable, SCRIPT, *bad], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and option in refused.stderr


_BERT_DIGEST = """
import hashlib, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.bench_thor_adaptive import parse_args
from benchmarks._adaptive_tasks import build_task
task = build_task("bert", parse_args(["--tasks", "bert", "--quick"]))
digest = hashlib.sha256()
for batch in task["batches"]:
    for column in batch:
        digest.update(column.tobytes())
print(digest.hexdigest())
"""


def test_bench_bert_task_is_the_same_in_every_process():
    """The BERT task's token ids, hence every batch, do not depend on the process (a vocabulary learned by
    HuggingFace's WordPiece trainer numbered its tokens differently in every process, so two runs of the
    benchmark trained different problems)."""
    digests = {subprocess.run([sys.executable, "-c", _BERT_DIGEST, REPO], capture_output=True, text=True,
                              timeout=300, check=True).stdout.strip() for _ in range(3)}
    assert len(digests) == 1 and len(next(iter(digests))) == 64, digests
