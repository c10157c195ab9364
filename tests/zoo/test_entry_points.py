"""Every model_zoo and benchmark entry point follows the one import convention (model_zoo/README.md):
``python PATH/TO/SCRIPT.py --help`` works from any working directory; afterwards ``ms_optim`` is the
checkout's even when another ``ms_optim`` comes first on PYTHONPATH; and every module loaded from the
checkout has exactly the name its path gives (``model_zoo.resnet.src.config``), never a bare
``src.config`` or ``bert_model`` beside it.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _entry_points():
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "model_zoo", "*", "*.py"))
                       + glob.glob(os.path.join(ROOT, "benchmarks", "bench_*.py"))):
        with open(path, encoding="utf-8") as handle:
            if 'if __name__ == "__main__":' in handle.read():
                found.append(os.path.relpath(path, ROOT))
    return found


ENTRY_POINTS = _entry_points()

# Runs SCRIPT --help as `python SCRIPT --help` would (its folder as sys.path[0], __main__), then reports
# which ms_optim an import finds and every checkout module whose name does not match its path.
PROBE = r"""
import os, runpy, sys
root, script = sys.argv[1], sys.argv[2]
sys.argv = [script, "--help"]
sys.path[0] = os.path.dirname(script)
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
import ms_optim
print("MS_OPTIM_FILE", ms_optim.__file__)
# Installed packages are not checkout modules, even when the virtual environment lives inside the
# checkout (scripts/test.sh makes .venv there).
installed = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
for name, module in sorted(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name in ("__main__", "__mp_main__") or not path:
        continue
    path = os.path.abspath(path)
    if not path.startswith(root + os.sep) or path.startswith(installed):
        continue
    rel = os.path.relpath(path, root)[:-len(".py")].replace(os.sep, ".")
    expected = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
    if name != expected:
        print("WRONG_NAME", name, "for", rel)
"""


def test_every_entry_point_is_covered():
    names = set(_entry_points())
    for script in ("model_zoo/resnet/train.py", "model_zoo/resnet/eval.py", "model_zoo/bert/train.py",
                   "benchmarks/bench_step.py", "benchmarks/bench_thor.py", "benchmarks/bench_resnet.py"):
        assert script in names, (script, names)


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_help_from_another_directory_uses_the_checkouts_ms_optim(script, tmp_path):
    decoy = tmp_path / "decoy"
    (decoy / "ms_optim").mkdir(parents=True)
    (decoy / "ms_optim" / "__init__.py").write_text("raise ImportError('the decoy ms_optim was imported')\n")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(decoy), ROOT]))
    plain = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], cwd=str(cwd), env=env,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "usage" in plain.stdout.lower(), plain.stderr[-3000:]
    assert "Traceback" not in plain.stderr, plain.stderr[-3000:]
    probe = subprocess.run([sys.executable, "-c", PROBE, ROOT, os.path.join(ROOT, script)], cwd=str(cwd), env=env,
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert f"MS_OPTIM_FILE {os.path.join(ROOT, 'ms_optim', '__init__.py')}" in probe.stdout, probe.stdout[-3000:]
    assert "WRONG_NAME" not in probe.stdout, probe.stdout[-3000:]
    assert os.listdir(cwd) == []
