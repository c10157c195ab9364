"""Smoke run of benchmarks/bench_thor_trace.py (marked ``bench``: excluded from the default test command).

Checks that a quick run writes the JSON and the plot with the promised fields and that the counted
inversions are consistent (the fixed schedule performs layers x THOR steps; the trace rule at most as
many); timing values and the goal are reported, never asserted.
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_thor_trace.py")

pytestmark = pytest.mark.bench


def test_bench_thor_trace_quick_writes_results(tmp_path):
    cmd = [sys.executable, SCRIPT, "--quick", "--epochs", "1", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench_thor_trace_quick.json").read_text())
    fixed, trace = result["runs"]
    assert (fixed["schedule"], trace["schedule"]) == ("fixed", "trace") and fixed["layers"] == 5
    assert fixed["inversions"] == fixed["layers"] * fixed["thor_steps"]
    assert 0 < trace["inversions"] <= trace["layers"] * trace["thor_steps"]
    assert sum(e["inversions"] for e in trace["per_epoch"]) == trace["inversions"] == sum(trace["inversions_per_layer"])
    for r in (fixed, trace):
        assert r["history"] and r["thor_step_seconds"] > 0 and r["train_seconds"] >= r["thor_step_seconds"]
    cmp = result["comparisons"][0]
    assert cmp["inversions_trace_vs_fixed"] == trace["inversions"] / fixed["inversions"]
    assert "goal_met" in cmp
    assert (tmp_path / "bench_thor_trace_quick_tta.png").stat().st_size > 0


def test_bench_thor_trace_help():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--quick" in run.stdout and "--thresholds" in run.stdout
