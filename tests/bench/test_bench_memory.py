"""Smoke run of benchmarks/bench_memory.py (marked ``bench``: excluded from the default test command).

Checks that a quick run writes the JSON and the plot with the promised fields; memory and timing
values are reported, never asserted (beyond being positive).
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.bench


def test_bench_memory_quick_writes_results(tmp_path):
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_memory.py"), "--quick",
           "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench_memory_quick.json").read_text())
    case = result["cases"][0]
    assert (case["net"], case["batch"], case["image"]) == ("resnet18", 4, 32)
    for name in ("momentum", "thor"):
        rec = case[name]
        assert not rec["failed"] and rec["peak_rss_gb"] > 0 and len(rec["step_ms"]) == result["steps"]
        assert 0 < rec["rss_before_steps_gb"] <= rec["peak_rss_gb"]
    assert result["release_freed_memory"] is True
    assert case["thor_vs_momentum_rss"] > 0 and case["thor_step_vs_momentum"] > 0
    assert (tmp_path / "bench_memory_quick.png").stat().st_size > 0


def test_bench_memory_quick_float16_through_float32(tmp_path):
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_memory.py"), "--quick", "--float16",
           "--float16-add", "float32", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench_memory_quick_float16_add32.json").read_text())
    assert result["float16"] is True and result["float16_add"] == "float32"
    assert all(not result["cases"][0][name]["failed"] for name in ("momentum", "thor"))


def test_bench_memory_help_and_bad_case():
    script = os.path.join(REPO, "benchmarks", "bench_memory.py")
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--cases" in run.stdout and "--max-rss-gb" in run.stdout
    assert "--no-release" in run.stdout and "--float16-add" in run.stdout
    run = subprocess.run([sys.executable, script, "--cases", "resnet50"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "NET:BATCH" in run.stderr


def test_bench_memory_quick_adaptive_thor(tmp_path):
    """``--optimizers thor,thor_adaptive``: the recipe-free THOR measured beside THOR, with its ratios, in a file
    of its own (the default run's results stay)."""
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_memory.py"), "--quick", "--optimizers",
           "thor,thor_adaptive", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    case = json.loads((tmp_path / "bench_memory_quick_adaptive.json").read_text())["cases"][0]
    assert "momentum" not in case and not case["thor_adaptive"]["failed"]
    assert case["adaptive_vs_thor_rss"] > 0 and case["adaptive_non_thor_vs_thor"] > 0
    assert (tmp_path / "bench_memory_quick_adaptive.png").stat().st_size > 0
    assert not (tmp_path / "bench_memory_quick.json").exists()
