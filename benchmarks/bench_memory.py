"""THOR memory benchmark: peak host memory (RSS) and step time of THOR against MindSpore's Momentum.

Every (case, optimizer) pair runs in its own child process (GRAPH_MODE, CPU), so each peak is that
optimizer's alone: the child builds model_zoo/resnet's net (1001 classes, ImageNet stem) on generated
data, trains ``--steps`` steps through ``nn.TrainOneStepCell`` and reports ``ru_maxrss`` of itself
(``resource.getrusage(RUSAGE_SELF)``: the peak resident set of the process, compilation included) and
the wall time of every step. Once the training cell is compiled, both optimizers' children call
``ms_optim.release_freed_memory()`` (what ``ModelThor`` does; ``--no-release`` leaves it out), so the
compiler's freed memory is not counted in the steps' peak. THOR runs with ``frequency=--frequency``
(default 2), so steps 0, 2, 4, ... are THOR steps (factors collected, inverses recomputed) and the
others reuse stored inverses.

Reported per case (the baseline, Momentum, is measured in the same run):

* ``peak_rss_gb`` of each optimizer (GiB, 2**30 bytes) and ``thor_vs_momentum_rss`` (target <= 1.5, aim 1.3);
* ``step_ms``: medians of Momentum's steps, THOR's THOR steps and THOR's other steps, the first step
  of each process (compilation) left out; ``thor_step_vs_momentum`` (target <= 1.5) and
  ``non_thor_vs_momentum``.

The parent polls each child's resident set and kills a child that passes ``--max-rss-gb`` (a shared
machine must not run out of memory); such a run is reported with ``"killed": true`` and the
largest resident set seen. Cases run one after the other, never two children at once.

    python benchmarks/bench_memory.py                          # resnet50 at 224x224, batch 8 and 32, resnet18 batch 32
    python benchmarks/bench_memory.py --cases resnet50:8       # one case (NET:BATCH[:IMAGE])
    python benchmarks/bench_memory.py --quick                  # smoke run: tiny ResNet-18, 32x32
    python benchmarks/bench_memory.py --cases resnet50:8 --float16 --float16-add mindspore   # then: float32
    python benchmarks/bench_memory.py --cases resnet50:8 --optimizers momentum,thor,thor_adaptive
Writes ``benchmarks/results/bench_memory[_quick][_float16[_add32]][_adaptive].json`` and the PNG of the same
name (``_adaptive`` when ``thor_adaptive``, ``thor(net, "adaptive", "adaptive", 0.9)``, is measured too:
``adaptive_vs_thor_rss`` and its THOR and other steps against THOR's).

``--float16`` casts the net to float16 (``to_float``: what amp "O3" does, as the model-zoo ResNet trainer
gives THOR); ``--float16-add float32`` has both children add float16 tensors through float32 first
(``ms_optim.float16_add_via_float32``, which ``ModelThor`` applies on CPU; same bits), ``mindspore`` keeps
MindSpore's float16 ``Add``, whose CPU kernel keeps 16 bytes of index arrays per element of each sum.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports"): run as a file, this folder
# would be sys.path[0] and its modules importable under bare names; the repository root takes its
# place, so each module has one name (benchmarks._common, model_zoo....) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import RESULTS_DIR, read_json, save_figure, write_json  # noqa: E402

TARGETS = {"thor_vs_momentum_rss": 1.5, "thor_step_vs_momentum": 1.5}
DEFAULT_CASES = "resnet50:8,resnet50:32,resnet18:32"
OPTIMIZERS = ("momentum", "thor", "thor_adaptive")
COLOURS = {"momentum": "#4C72B0", "thor": "#DD8452", "thor_adaptive": "#C44E52"}


def parse_case(text: str, default_image: int) -> Dict:
    """``NET:BATCH[:IMAGE]`` -> dict; NET is a model_zoo/resnet architecture name."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[1].isdigit() or (len(parts) == 3 and not parts[2].isdigit()):
        raise argparse.ArgumentTypeError(f"a case is NET:BATCH[:IMAGE], e.g. resnet50:8, but got {text!r}")
    return {"net": parts[0], "batch": int(parts[1]), "image": int(parts[2]) if len(parts) == 3 else default_image}


# ------------------------------------------------------------------------------------ the child
def child_main(args: argparse.Namespace) -> None:
    """Train a few steps with one optimizer; print one JSON line with the peak RSS and step times."""
    import resource

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from model_zoo.resnet.src.resnet import build_resnet

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    if args.float16_add == "float32":
        from ms_optim import float16_add_via_float32

        float16_add_via_float32()
    net = build_resnet(args.net, class_num=args.classes, width=args.width)
    if args.float16:
        net.to_float(ms.float16)
    rng = np.random.default_rng(0)
    x = Tensor(rng.normal(size=(args.batch, 3, args.image, args.image)).astype(np.float32))
    y = Tensor(rng.integers(0, args.classes, size=(args.batch,)).astype(np.int32))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    steps = args.steps
    cell_class = nn.TrainOneStepCell
    if args.optimizer == "thor":
        from ms_optim.nn import thor

        opt = thor(net, Tensor(np.full((steps,), 0.01, np.float32)), Tensor(np.full((steps,), 0.03, np.float32)),
                   0.9, weight_decay=1e-4, batch_size=args.batch, frequency=args.frequency)
    elif args.optimizer == "thor_adaptive":  # no schedules; ms_optim's cell runs the trial's forward pass
        from ms_optim.nn import TrainOneStepCell, thor

        opt = thor(net, "adaptive", "adaptive", 0.9, weight_decay=1e-4, batch_size=args.batch,
                   frequency=args.frequency)
        cell_class = TrainOneStepCell
    else:
        opt = nn.Momentum(net.trainable_params(), Tensor(np.full((steps,), 0.01, np.float32)), 0.9,
                          weight_decay=1e-4)
    train = cell_class(nn.WithLossCell(net, loss), opt)
    train.set_train(True)
    rss_built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"PROGRESS built {rss_built / 1024 ** 2:.2f} GiB", flush=True)
    train.compile(x, y)  # compilation alone, so its share of the peak is known
    rss_compiled = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"PROGRESS compiled {rss_compiled / 1024 ** 2:.2f} GiB", flush=True)
    if args.release:  # what ModelThor does once its training cell is compiled, here for both optimizers
        from ms_optim import release_freed_memory

        release_freed_memory()
    rss_resident = _rss_kb(os.getpid())
    print(f"PROGRESS resident before the first step {rss_resident / 1024 ** 2:.2f} GiB", flush=True)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train(x, y).asnumpy()
        times.append((time.perf_counter() - start) * 1e3)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT " + json.dumps({"peak_rss_kb": peak_kb, "rss_after_build_kb": rss_built,
                                  "rss_after_compile_kb": rss_compiled, "rss_before_steps_kb": rss_resident,
                                  "step_ms": times}),
          flush=True)


# ----------------------------------------------------------------------------------- the parent
def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_child(case: Dict, optimizer: str, args: argparse.Namespace) -> Dict:
    """Run one (case, optimizer) child under the RSS watchdog; return its measurements."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--net", case["net"], "--batch", str(case["batch"]),
           "--image", str(case["image"]), "--optimizer", optimizer, "--steps", str(args.steps),
           "--frequency", str(args.frequency), "--width", str(args.width), "--classes", str(args.classes)]
    if not args.release:
        cmd.append("--no-release")
    if args.float16:
        cmd.append("--float16")
    cmd += ["--float16-add", args.float16_add]
    limit_kb = int(args.max_rss_gb * 1024 * 1024)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_kb, killed = 0, False
    while proc.poll() is None:
        seen_kb = max(seen_kb, _rss_kb(proc.pid))
        if seen_kb > limit_kb:
            proc.kill()
            killed = True
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    record = {"optimizer": optimizer, "wall_s": time.perf_counter() - start, "killed": killed}
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if killed or proc.returncode != 0 or not lines:
        record.update({"failed": True, "returncode": proc.returncode, "max_rss_seen_gb": seen_kb / 1024 ** 2,
                       "progress": [line for line in out.splitlines() if line.startswith("PROGRESS ")],
                       "stderr_tail": err[-2000:]})
        return record
    data = json.loads(lines[-1][len("RESULT "):])
    steps = data["step_ms"]
    record.update({"failed": False, "peak_rss_gb": data["peak_rss_kb"] / 1024 ** 2,
                   "rss_after_build_gb": data["rss_after_build_kb"] / 1024 ** 2,
                   "rss_after_compile_gb": data["rss_after_compile_kb"] / 1024 ** 2,
                   "rss_before_steps_gb": data["rss_before_steps_kb"] / 1024 ** 2, "step_ms": steps})
    later = list(enumerate(steps))[1:]  # step 0 compiles
    if optimizer in ("thor", "thor_adaptive"):
        thor_steps = [t for i, t in later if i % args.frequency == 0]
        other = [t for i, t in later if i % args.frequency != 0]
        record["thor_step_median_ms"] = statistics.median(thor_steps) if thor_steps else None
        record["non_thor_median_ms"] = statistics.median(other) if other else None
    else:
        record["step_median_ms"] = statistics.median([t for _, t in later]) if later else None
    return record


def run_case(case: Dict, args: argparse.Namespace) -> Dict:
    """Each of ``--optimizers`` in its own process, with the ratios (THOR to Momentum, adaptive THOR to
    THOR)."""
    result = dict(case)
    for optimizer in args.optimizers:
        record = run_child(case, optimizer, args)
        result[optimizer] = record
        peak = record.get("peak_rss_gb", record.get("max_rss_seen_gb"))
        extra = " (killed at the RSS limit)" if record["killed"] else (" FAILED" if record["failed"] else "")
        print(f"  {case['net']} batch {case['batch']} {case['image']}x{case['image']} {optimizer:8s}: "
              f"peak RSS {peak:.2f} GiB{extra}", flush=True)
        if record["failed"] and not record["killed"]:
            print(record["stderr_tail"], file=sys.stderr)
    mom, th = result.get("momentum"), result.get("thor")
    if mom and th and not mom["failed"] and not th["failed"]:
        result["thor_vs_momentum_rss"] = th["peak_rss_gb"] / mom["peak_rss_gb"]
        base = mom["step_median_ms"]
        if base and th["thor_step_median_ms"]:
            result["thor_step_vs_momentum"] = th["thor_step_median_ms"] / base
        if base and th["non_thor_median_ms"]:
            result["non_thor_vs_momentum"] = th["non_thor_median_ms"] / base
        print(f"  -> THOR/Momentum peak RSS {result['thor_vs_momentum_rss']:.2f}x "
              f"(target <= {TARGETS['thor_vs_momentum_rss']}); THOR step / Momentum step "
              f"{result.get('thor_step_vs_momentum', float('nan')):.2f}x, non-THOR step "
              f"{result.get('non_thor_vs_momentum', float('nan')):.2f}x", flush=True)
    adaptive = result.get("thor_adaptive")
    if th and adaptive and not th["failed"] and not adaptive["failed"]:
        result["adaptive_vs_thor_rss"] = adaptive["peak_rss_gb"] / th["peak_rss_gb"]
        for key, name in (("thor_step", "thor_step_median_ms"), ("non_thor", "non_thor_median_ms")):
            if th[name] and adaptive[name]:
                result[f"adaptive_{key}_vs_thor"] = adaptive[name] / th[name]
        print(f"  -> adaptive THOR / THOR: peak RSS {result['adaptive_vs_thor_rss']:.2f}x; THOR step "
              f"{result.get('adaptive_thor_step_vs_thor', float('nan')):.2f}x, non-THOR step "
              f"{result.get('adaptive_non_thor_vs_thor', float('nan')):.2f}x", flush=True)
    return result


def plot(path: str, results: List[Dict], note: str = "") -> str:
    """Grouped bars: peak RSS of Momentum and THOR per case (a killed run drawn at its last RSS, hatched)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(results)), 3.8))
    shown = [name for name in OPTIMIZERS if any(name in res for res in results)]
    width = 0.76 / len(shown)
    for k, (optimizer, color) in enumerate((name, COLOURS[name]) for name in shown):
        for i, res in enumerate(results):
            rec = res.get(optimizer)
            if rec is None:
                continue
            value = rec.get("peak_rss_gb", rec.get("max_rss_seen_gb", 0.0))
            bar = ax.bar(i + (k - (len(shown) - 1) / 2) * width, value, width, color=color,
                         hatch="//" if rec["failed"] else None, label=optimizer if i == 0 else None)[0]
            ax.annotate(f"{value:.2f}" + ("+" if rec["killed"] else ""),
                        (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels([f"{r['net']}\nbatch {r['batch']}, {r['image']}px" + (
        f"\n{r['thor_vs_momentum_rss']:.2f}x" if "thor_vs_momentum_rss" in r else "") for r in results], fontsize=8)
    ax.set_ylabel("peak host RSS (GiB)")
    ax.set_title("Peak memory, THOR vs Momentum (GRAPH_MODE, CPU)" + (f"\n{note}" if note else ""), fontsize=10)
    ax.margins(y=0.12)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path)


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the peak-memory bars of a record of this benchmark beside its JSON; returns the PNG's path."""
    note = f"float16 net, {record.get('float16_add', 'mindspore')} add" if record.get("float16") else ""
    return [plot(os.path.splitext(json_path)[0] + ".png", record["cases"], note)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated NET:BATCH[:IMAGE] (default {DEFAULT_CASES}; image --image-size)")
    parser.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per process (default 5)")
    parser.add_argument("--frequency", type=int, default=2, help="THOR frequency (default 2: steps 0, 2, 4 are THOR)")
    parser.add_argument("--width", type=int, default=64, help="ResNet width (64: the published nets)")
    parser.add_argument("--classes", type=int, default=1001, help="number of classes (default 1001)")
    parser.add_argument("--max-rss-gb", type=float, default=18.0,
                        help="kill a child whose resident set passes this (default 18 GB)")
    parser.add_argument("--optimizers", default="momentum,thor",
                        help="comma-separated subset of momentum,thor,thor_adaptive (default momentum,thor; "
                             "ratios need both of a pair; thor_adaptive: thor(net, 'adaptive', 'adaptive', 0.9) "
                             "through ms_optim's TrainOneStepCell)")
    parser.add_argument("--no-release", dest="release", action="store_false",
                        help="do not return the compiler's freed memory to the system before the first step "
                             "(by default both optimizers do, as ModelThor does)")
    parser.add_argument("--float16", action="store_true", help="cast the net to float16 (amp O3's to_float)")
    parser.add_argument("--float16-add", choices=("mindspore", "float32"), default="mindspore",
                        help="how both children add float16 tensors in the graph: MindSpore's Add (default) or "
                             "through float32 (ms_optim.float16_add_via_float32, as ModelThor does on CPU)")
    parser.add_argument("--quick", action="store_true", help="smoke run: resnet18 width 8, 32x32, batch 4, 3 steps")
    parser.add_argument("--out", default=RESULTS_DIR, help="output folder for the JSON and PNG")
    # the child process
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--net", default="resnet50", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--image", type=int, default=224, help=argparse.SUPPRESS)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="momentum", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    args.optimizers = [name for name in args.optimizers.split(",") if name]
    if not args.optimizers or any(name not in OPTIMIZERS for name in args.optimizers):
        parser.error(f"--optimizers must name momentum, thor and/or thor_adaptive, but got {args.optimizers}")
    if args.quick:
        args.width, args.classes, args.steps = 8, 10, 3
        cases_text = args.cases or "resnet18:4:32"
    else:
        cases_text = args.cases or DEFAULT_CASES
    try:
        cases = [parse_case(text, args.image_size) for text in cases_text.split(",") if text]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    results = []
    for case in cases:
        print(f"case {case}", flush=True)
        results.append(run_case(case, args))
    stem = ("bench_memory_quick" if args.quick else "bench_memory") + ("_float16" if args.float16 else "")
    stem += "_add32" if args.float16_add == "float32" else ""
    stem += "_adaptive" if "thor_adaptive" in args.optimizers else ""
    payload = {"targets": TARGETS, "release_freed_memory": args.release, "float16": args.float16,
               "float16_add": args.float16_add,
               "steps": args.steps, "frequency": args.frequency, "width": args.width,
               "classes": args.classes, "max_rss_gb": args.max_rss_gb, "cases": results}
    json_path = write_json(os.path.join(args.out, stem + ".json"), payload)
    (png_path,) = plot_record(read_json(json_path), json_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
