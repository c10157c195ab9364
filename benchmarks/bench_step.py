"""Time one optimizer update (the optimizer Cell called on fixed gradients) in GRAPH_MODE.

Candidates, timed interleaved in one run (medians of ``--repeats`` calls after ``--warmup``):

- ``Momentum (MindSpore)``: MindSpore's fused ``nn.Momentum``, the baseline;
- ``Lamb``, ``LARS(Momentum)`` and ``ASGD``: ms_optim's;
- ``ASGD (MindSpore)``: MindSpore's ``nn.ASGD`` (the only one of MindSpore's three that runs on CPU);
- ``floor <name>``: a NumPy copy of the bytes the update must touch (reads + writes of
  parameter-sized float32 arrays, see ``ARRAY_PASSES``), split over ``--floor-threads`` threads (all
  CPUs by default, as the fused kernels use them), the memory-bandwidth floor on this machine.

The model: ``--tensors`` parameters (default 64) of equal size, ``--params`` float32 values in all
(default 16M). Prints a table and writes ``bench_step.json`` and ``bench_step.png`` into
``--out-dir`` (default ``benchmarks/results``).

Targets: ASGD <= 1.0x MindSpore's ASGD; Lamb <= 2.5x Momentum; LARS(Momentum) <= 1.5x Momentum.

    python benchmarks/bench_step.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/bench_step.py --quick    # smoke run: 64 x 4096 values, 5 calls each
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List

import numpy as np

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports"): run as a file, this folder
# would be sys.path[0] and its modules importable under bare names; the repository root takes its
# place, so each module has one name (benchmarks._common, model_zoo....) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    bar_plot,
    copy_floor,
    interleaved_medians,
    read_json,
    write_json,
)

# Parameter-sized float32 arrays each update must read plus write at the least:
#   Momentum: read w, g, m; write w, m.
#   LARS(Momentum): Momentum plus reading w and g once more for their norms.
#   Lamb: read w, g, m, v; write w, m, v; plus two norms (||w||, ||r||) = 9 (r is not stored).
#   ASGD with t <= t0 (mu = 1, the default t0 = 1e6): read w, g; write w, ax.
ARRAY_PASSES = {"Momentum (MindSpore)": 5, "LARS(Momentum)": 7, "Lamb": 9, "ASGD": 4, "ASGD (MindSpore)": 4}
BASELINE = "Momentum (MindSpore)"
TARGETS = {"ASGD": ("ASGD (MindSpore)", 1.0), "Lamb": (BASELINE, 2.5), "LARS(Momentum)": (BASELINE, 1.5)}


def parse_args(argv: List[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Targets: ASGD <= 1.0x MindSpore's ASGD; Lamb <= 2.5x Momentum; "
                                            "LARS(Momentum) <= 1.5x Momentum.")
    parser.add_argument("--tensors", type=int, default=64, help="number of parameter tensors (default 64)")
    parser.add_argument("--params", type=int, default=16 * 2 ** 20,
                        help="float32 values in all, split evenly (default 16M = 16777216)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per candidate (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per candidate first (default 3)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="time only these candidates (names as in the table; floors follow)")
    parser.add_argument("--floor-threads", type=int, default=os.cpu_count(),
                        help="threads of the NumPy copy timed as the memory floor (default: all CPUs)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 64 x 4096 values, 5 calls, 1 warm-up, results as bench_step_quick.*")
    parser.add_argument("--out-dir", default=RESULTS_DIR, help="where to write the JSON and PNG")
    args = parser.parse_args(argv)
    if args.quick:
        args.params, args.repeats, args.warmup = args.tensors * 4096, 5, 1
    return args


def build_candidates(n_tensors: int, size: int, only=None, floor_threads=None) -> Dict[str, Callable[[], object]]:
    """One optimizer per candidate, each with its own parameters, all fed the same gradients."""
    from mindspore import Parameter, Tensor, nn

    from ms_optim.optim.asgd import ASGD
    from ms_optim.optim.lamb import Lamb
    from ms_optim.optim.lars import LARS

    rng = np.random.default_rng(0)
    grads = tuple(Tensor(rng.standard_normal(size).astype(np.float32) * 1e-3) for _ in range(n_tensors))
    init = rng.standard_normal(size).astype(np.float32)

    def params(tag: str):
        return [Parameter(Tensor(init), name=f"{tag}.layer{i}.weight") for i in range(n_tensors)]

    makers = {
        BASELINE: lambda: nn.Momentum(params("mom"), learning_rate=0.01, momentum=0.9),
        "LARS(Momentum)": lambda: LARS(nn.Momentum(params("lars"), learning_rate=0.01, momentum=0.9)),
        "Lamb": lambda: Lamb(params("lamb"), learning_rate=0.01),
        "ASGD": lambda: ASGD(params("asgd"), learning_rate=0.01),
        "ASGD (MindSpore)": lambda: nn.ASGD(params("msasgd"), learning_rate=0.01),
    }
    candidates = {}
    for name, make in makers.items():
        if only and name not in only:
            continue
        optimizer = make()
        candidates[name] = (lambda opt=optimizer: opt(grads))
        # a copy reads and writes its bytes: half the passes' worth of values, copied once
        candidates["floor " + name] = copy_floor(n_tensors * size * ARRAY_PASSES[name] // 2, floor_threads)
    return candidates


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the bar chart of a record of this benchmark beside its JSON; returns the PNG's path."""
    rows = record["results"]
    labels = list(rows)
    base = rows.get(BASELINE, {}).get("ms_per_step")
    params = record["tensors"] * record["values_per_tensor"] / 2 ** 20
    png = bar_plot(os.path.splitext(json_path)[0] + ".png", labels, [rows[n]["ms_per_step"] for n in labels],
                   "ms per step (median)", f"Optimizer step, {params:.1f}M float32 params, GRAPH_MODE CPU",
                   errors=[[rows[n]["ms_per_step"] - rows[n]["p25_ms"] for n in labels],
                           [rows[n]["p75_ms"] - rows[n]["ms_per_step"] for n in labels]],
                   hlines=[(base, "Momentum")] if base else (),
                   marks=[rows[n]["floor_ms"] for n in labels], marks_label="memory floor (NumPy copy)")
    return [png]


def main(argv: List[str] = None) -> Dict[str, dict]:
    args = parse_args(argv)
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    size = args.params // args.tensors
    candidates = build_candidates(args.tensors, size, args.only, args.floor_threads)
    timings = interleaved_medians(candidates, repeats=args.repeats, warmup=args.warmup)

    names = [n for n in candidates if not n.startswith("floor ")]
    base = timings.get(BASELINE, {}).get("median_ms")
    rows = {}
    for name in names:
        ms_step = timings[name]["median_ms"]
        floor = timings["floor " + name]["median_ms"]
        row = {"ms_per_step": ms_step, "p25_ms": timings[name]["p25_ms"], "p75_ms": timings[name]["p75_ms"],
               "ratio_to_momentum": ms_step / base if base else None,
               "floor_ms": floor, "array_passes": ARRAY_PASSES[name], "ratio_to_floor": ms_step / floor}
        if name in TARGETS and TARGETS[name][0] in timings:
            ref, limit = TARGETS[name]
            ratio = ms_step / timings[ref]["median_ms"]
            row["target"] = f"<= {limit}x {ref}"
            row["target_ratio"] = ratio
            row["target_met"] = bool(ratio <= limit)
        rows[name] = row

    print(f"\nOptimizer step, GRAPH_MODE CPU, {args.tensors} tensors x {size} float32 = "
          f"{args.tensors * size / 2 ** 20:.2f}M params; medians of {args.repeats} interleaved calls")
    header = f"{'optimizer':<22}{'ms/step':>10}{'x Momentum':>12}{'floor ms':>10}{'x floor':>9}  target"
    print(header)
    print("-" * (len(header) + 24))
    for name, row in rows.items():
        mom = f"{row['ratio_to_momentum']:.2f}" if row["ratio_to_momentum"] is not None else "-"
        target = ""
        if "target" in row:
            target = f"{row['target_ratio']:.2f} ({row['target']}) {'met' if row['target_met'] else 'NOT met'}"
        print(f"{name:<22}{row['ms_per_step']:>10.2f}{mom:>12}{row['floor_ms']:>10.2f}"
              f"{row['ratio_to_floor']:>9.2f}  {target}")

    stem = "bench_step_quick" if args.quick else "bench_step"
    json_path = write_json(os.path.join(args.out_dir, stem + ".json"), {
        "benchmark": "optimizer step alone (optimizer Cell on fixed gradients), GRAPH_MODE, CPU",
        "tensors": args.tensors, "values_per_tensor": size, "repeats": args.repeats, "warmup": args.warmup,
        "floor": f"NumPy copy of array_passes/2 x {args.tensors * size} float32 values on {args.floor_threads} "
                 f"threads", "array_passes": ARRAY_PASSES,
        "results": rows, "raw_timings_ms": timings})
    (png_path,) = plot_record(read_json(json_path), json_path)
    print(f"\nwrote {json_path}\nwrote {png_path}")
    return rows


if __name__ == "__main__":
    main()
