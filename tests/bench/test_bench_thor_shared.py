"""Smoke run of benchmarks/bench_thor_shared.py (marked ``bench``: excluded from the default test command).

A quick 2-rank msrun run writes the JSON and the plot with the promised fields, and each rank inverted
only its share of the layers (the counts partition the layers); timings are reported, never asserted.
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "bench_thor_shared.py")

pytestmark = pytest.mark.bench


def test_bench_thor_shared_quick_writes_results(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--repeats", "2", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench_thor_shared_quick.json").read_text())
    assert result["net"] == "resnet18" and result["thor_layers"] == 21 and result["inverse"] == "full"
    assert len(result["ranks"]) == 2 and result["owners_agree"]
    for rank in result["ranks"]:
        for name in ("unshared_thor", "shared_thor", "unshared_non_thor", "shared_non_thor"):
            assert rank["timings_ms"][name]["n"] == 2 and rank["timings_ms"][name]["median_ms"] > 0
    calls = result["ranks"][0]["thor_step_calls"]
    counts = result["inversion_count_per_rank"]
    for layer, owner in enumerate(result["owners"]):
        assert [counts[r][layer] for r in range(2)] == [calls if r == owner else 0 for r in range(2)], layer
    assert sum(result["layers_inverted_per_rank"]) == 21 and min(result["layers_inverted_per_rank"]) > 0
    assert result["thor_step_speedup"] > 0 and 1.0 < result["ideal_inversion_speedup"] <= 2.0
    assert (tmp_path / "bench_thor_shared_quick.png").stat().st_size > 0


def test_bench_thor_shared_help():
    run = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--quick" in run.stdout and "--width" in run.stdout and "--as-rank" not in run.stdout
