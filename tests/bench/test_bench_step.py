"""Smoke run of benchmarks/bench_step.py --quick (marked `bench`: excluded from the default run;
run with `python -m pytest -m bench tests/bench/test_bench_step.py`). Checks that the script runs end to
end and writes well-formed results; it asserts no timing."""
import json
import os
import subprocess
import sys

import pytest
from support import REPO


@pytest.mark.bench
def test_bench_step_quick_writes_table_json_and_png(tmp_path):
    script = os.path.join(REPO, "benchmarks", "bench_step.py")
    help_text = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, check=True)
    assert "--quick" in help_text.stdout and "Targets" in help_text.stdout
    run = subprocess.run([sys.executable, script, "--quick", "--out-dir", str(tmp_path)], capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ms/step" in run.stdout
    with open(tmp_path / "bench_step_quick.json", encoding="utf-8") as handle:
        record = json.load(handle)
    names = {"Momentum (MindSpore)", "LARS(Momentum)", "Lamb", "ASGD", "ASGD (MindSpore)"}
    assert set(record["results"]) == names
    for name, row in record["results"].items():
        assert row["ms_per_step"] > 0 and row["floor_ms"] > 0, name
        assert row["ratio_to_momentum"] > 0 and row["ratio_to_floor"] > 0, name
    assert {"target_ratio", "target_met"} <= set(record["results"]["ASGD"])
    assert (tmp_path / "bench_step_quick.png").stat().st_size > 1000
