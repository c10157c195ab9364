"""Smoke run of benchmarks/bench_thor_robust.py (marked ``bench``: excluded from the default test command):
a one-cell grid on LeNet5 writes the JSON (runs, NaN counts, best configuration) and the heatmap."""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_thor_robust.py")

pytestmark = pytest.mark.bench


def test_bench_thor_robust_one_cell(tmp_path):
    out = tmp_path / "robust"
    cmd = [sys.executable, SCRIPT, "--models", "lenet", "--lenet-epochs", "1", "--lrs", "0.03", "--dampings", "0.03",
           "--frequencies", "10", "--kl-clips", "1e-3", "--conventions", "kfc", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "robust.json").read_text())
    assert len(result["runs"]) == 1
    cell = result["runs"][0]
    assert cell["model"] == "lenet" and cell["kl_clip"] == 1e-3 and cell["steps"] == 44
    assert cell["nan"] is False and 0.0 <= cell["test_accuracy"] <= 1.0
    assert list(result["nan_counts"].values())[0]["runs"] == 1
    assert (tmp_path / "robust_lenet.png").stat().st_size > 0  # one heat-map figure per model


def test_bench_thor_robust_help_and_bad_options():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    for option in ("--lrs", "--dampings", "--frequencies", "--kl-clips", "--conventions", "--models"):
        assert option in run.stdout
    bad = subprocess.run([sys.executable, SCRIPT, "--kl-clips", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--kl-clips" in bad.stderr
