"""Smoke run of benchmarks/bench_compile.py (marked ``bench``: excluded from the default test command).

A quick run (ResNet-18 width 4 and a tiny BERT) writes the JSON and the plot with every promised
field; times and memory are reported, never asserted (beyond being positive and consistent).
"""
import json
import os
import subprocess
import sys

import pytest
from support import REPO

pytestmark = pytest.mark.bench


def test_bench_compile_quick_writes_results(tmp_path):
    out = tmp_path / "bench_compile_quick.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "bench_compile.py"), "--quick", "--steps", "3",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["net"] for r in result["results"]] == ["resnet18", "bert-tiny"]
    for res in result["results"]:
        assert res["thor_layers"] > 0 and res["momentum"]["thor_layers"] == 0
        for name in ("momentum", "thor"):
            rec = res[name]
            assert not rec["failed"] and len(rec["step_ms"]) == 3
            assert 0 < rec["build_s"] < rec["build_compile_s"] and rec["compile_cpu_s"] > 0
            assert 0 < rec["rss_after_compile_gb"] <= rec["peak_rss_gb"]
        assert set(res["ratios"]) == {"build_compile", "compile_cpu", "rss_after_compile", "peak_rss", "thor_step",
                                      "non_thor_step"}
        assert all(value > 0 for value in res["ratios"].values())
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_compile_help():
    script = os.path.join(REPO, "benchmarks", "bench_compile.py")
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--nets" in run.stdout and "--quick" in run.stdout
