"""Redraw the plots of saved benchmark records, training nothing.

Each record (a JSON file a benchmark wrote) names the command that measured it; the benchmark's own
``plot_record`` draws its PNG(s) beside the JSON again, stamped with the record's date, machine and
command (``_common.plotted_from``), so a plot changed for readability keeps the source of its numbers.

Usage: ``python benchmarks/replot.py benchmarks/results/bench_step.json [more records ...]``
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import List, Optional

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports").
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import plotted_from, read_json  # noqa: E402


def benchmark_of(record: dict, json_path: str) -> str:
    """The module (``bench_thor``, ...) whose run the record holds: named by its command, else its file name."""
    found = re.search(r"\b(bench_[a-z0-9_]+)\.py\b", str(record.get("command", "")))
    if found:
        return found.group(1)
    stem = os.path.basename(json_path)
    candidates = [name[:-3] for name in os.listdir(os.path.dirname(os.path.abspath(__file__)))
                  if name.startswith("bench_") and name.endswith(".py") and stem.startswith(name[:-3])]
    if not candidates:
        raise SystemExit(f"{json_path}: no benchmark named in its command or file name")
    return max(candidates, key=len)


def replot(json_path: str) -> List[str]:
    """Redraw the PNG(s) of one record; returns their paths."""
    record = read_json(json_path)
    module = importlib.import_module(f"benchmarks.{benchmark_of(record, json_path)}")
    with plotted_from(record):
        return module.plot_record(record, json_path)


def main(argv: Optional[List[str]] = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for path in paths:
        for written in replot(path):
            print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
