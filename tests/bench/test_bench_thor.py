"""Smoke run of benchmarks/bench_thor.py (marked ``bench``: excluded from the default test command).

Checks that a quick run writes the JSON and both plots with the promised fields; timing values are
reported, never asserted.
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.bench


def test_bench_thor_quick_writes_results(tmp_path):
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_thor.py"), "--quick", "--repeats", "2",
           "--tta-epochs", "1", "--tta-seconds", "10", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench_thor_quick.json").read_text())
    step = result["steps"][0]
    assert step["net"] == "lenet" and step["thor_layers"] == 5
    for key in ("momentum", "thor_step", "non_thor", "collect_only", "invert_only"):
        assert step["timings_ms"][key]["n"] == 2 and step["timings_ms"][key]["median_ms"] > 0
    assert set(step["thor_step_split_ms"]) == {"factor_collection", "inversion", "non_thor_step", "unexplained"}
    assert step["amortised_f100_vs_momentum"] > 0 and step["non_thor_vs_momentum"] > 0
    tta = result["time_to_accuracy"]
    assert [(r["optimizer"], r["lr"]) for r in tta["runs"]] == [("thor", 0.1), ("momentum", 0.03)]
    assert tta["thor_lrs"] == [0.1] and tta["momentum_lrs"] == [0.03]
    assert all(r["history"] for r in tta["runs"])
    assert (tmp_path / "bench_thor_quick_steps.png").stat().st_size > 0
    assert (tmp_path / "bench_thor_quick_tta.png").stat().st_size > 0


def test_bench_thor_help():
    run = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_thor.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--quick" in run.stdout and "--skip-tta" in run.stdout and "--stem" in run.stdout
