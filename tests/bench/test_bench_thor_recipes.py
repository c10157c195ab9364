"""Smoke run of benchmarks/bench_thor_recipes.py (marked ``bench``: excluded from the default test command):
the GPU recipe for 3 steps on a narrow ResNet-50 under "gpu" and "kfc" writes the JSON and the figure."""
import json
import math
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_thor_recipes.py")

pytestmark = pytest.mark.bench


def test_bench_thor_recipes_smoke(tmp_path):
    out = tmp_path / "recipes"
    cmd = [sys.executable, SCRIPT, "--recipes", "gpu", "--steps", "3", "--width", "4", "--image-size", "16",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "recipes.json").read_text())
    assert [(r["recipe"], r["convention"]) for r in result["runs"]] == [("gpu", "gpu"), ("gpu", "kfc")]
    spec = result["recipes"]["gpu"]
    assert spec["frequency"] == 2 and spec["batch_size"] == 32 and spec["split_indices"] == [26, 53]
    assert math.isclose(spec["lr"][0], 0.05672, rel_tol=0.2) and len(spec["damping"]) == 3
    for r in result["runs"]:
        assert len(r["losses"]) == 3 and r["nan_count"] == sum(not math.isfinite(v) for v in r["losses"])
    assert "gpu" in result["final_loss_ratio_own_convention_over_kfc"]
    assert (tmp_path / "recipes.png").stat().st_size > 0


def test_bench_thor_recipes_help_and_bad_options():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    for option in ("--recipes", "--steps", "--steps-per-epoch", "--width", "--image-size"):
        assert option in run.stdout
    bad = subprocess.run([sys.executable, SCRIPT, "--recipes", "tpu"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--recipes" in bad.stderr
