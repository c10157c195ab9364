"""Smoke run of benchmarks/bench_resnet.py --quick (marked `bench`: excluded from the default run;
`python -m pytest -m bench tests/bench` runs it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO


@pytest.mark.bench
def test_bench_resnet_quick_writes_json_and_png(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_resnet.py"), "--quick",
                           "--only", "resnet18", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "bench_resnet_quick_resnet18.json").read_text())
    (result,) = record["results"]
    ips = result["images_per_s"]
    assert set(ips) == {"Momentum", "THOR f=834", "THOR f=100"} and all(v > 0 for v in ips.values())
    med = result["median_ms"]
    for f in (834, 100):  # the amortized cost is the documented mix of THOR and ordinary steps
        expected = (med["thor_step"] + (f - 1) * med["other_step"]) / f
        assert med[f"thor_f{f}_amortized"] == pytest.approx(expected, rel=1e-12)
        assert ips[f"THOR f={f}"] / ips["Momentum"] == pytest.approx(result["ratio_to_momentum"][f"THOR f={f}"])
    assert (tmp_path / "bench_resnet_quick_resnet18.png").stat().st_size > 1000
    assert "ratio to Momentum" in proc.stdout
