"""THOR at depth: build + compile time, memory and step times of THOR against Momentum, per net.

Every (net, optimizer) pair runs in its own child process (GRAPH_MODE, CPU), the baseline (MindSpore's
``nn.Momentum``) in the same run as THOR; with ``--repeats N`` each child runs N times, Momentum and THOR
alternating, and each figure is the median of its runs (this machine's speed drifts by tens of percent
over minutes: one run each compares two moments, not two optimizers).

A child builds the net on generated data (ResNets of model_zoo/resnet, 1001 classes, at ``--image``
pixels; a BERT-base-size encoder of model_zoo/bert: 12 layers, hidden 768, masked-LM head), the optimizer
and ``nn.TrainOneStepCell``, compiles it, calls
``ms_optim.release_freed_memory()`` (what ``ModelThor`` does after compiling; for both optimizers) and
trains ``--steps`` steps. THOR runs with ``frequency=2``: steps 0, 2, 4 are THOR steps.

Reported per net, each THOR figure also as a ratio to Momentum's:

* ``build_compile_s``: process start to compiled training step (imports excluded; wall seconds) and
  ``compile_cpu_s`` (CPU seconds of the compilation: less sensitive to a busy machine);
* ``rss_after_compile_gb`` (resident set once compiled and released) and ``peak_rss_gb`` (``ru_maxrss``);
* step medians: Momentum's steps, THOR's THOR steps and its other steps (the first step left out);
* ``flops`` (THOR's record): the step's FLOPs in its THOR layers and what THOR adds to them, the
  preconditioning of every step and the factors and inversions of a THOR step, as counted by
  ``benchmarks/_thor_flops.py`` (layer sizes from one PYNATIVE forward pass after the measured steps).

The targets are printed beside the ratios: build+compile <= 2x Momentum's, resident after compile <=
Momentum's + 35%, and THOR's overhead growing at most linearly in the number of THOR layers (the plot:
overhead against layers).

    python benchmarks/bench_compile.py                                # resnet18/34/50/101 and bert-base
    python benchmarks/bench_compile.py --nets resnet50 --batch 8      # one net
    python benchmarks/bench_compile.py --repeats 3                    # each child 3 times, alternating: medians
    python benchmarks/bench_compile.py --quick                        # smoke run: resnet18 width 4, tiny BERT
Writes ``benchmarks/results/bench_compile[_quick].json`` and ``.png``.
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

if not __package__:  # run as a file: the repository root, not this folder, on sys.path (see bench_memory.py)
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import RESULTS_DIR, read_json, save_figure, write_json  # noqa: E402

DEFAULT_NETS = "resnet18,resnet34,resnet50,resnet101,bert-base"
TARGETS = {"build_compile": 2.0, "rss_after_compile": 1.35}
FREQUENCY = 2


def _rss_gb() -> float:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024 ** 2
    return 0.0


def _bert_case(args: argparse.Namespace):
    """A BERT encoder with its masked-LM loss, and one generated batch."""
    import numpy as np
    from mindspore import Tensor

    from model_zoo.bert.bert_model import BertForMaskedLM, BertPretrainingLoss, get_config

    config = get_config("tiny" if args.quick else "base", args.vocab, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    net = BertForMaskedLM(config)
    rng = np.random.default_rng(0)
    batch, seq, masked = args.batch, args.seq_length, max(1, args.seq_length // 8)
    data = (rng.integers(0, args.vocab, (batch, seq)).astype(np.int32), np.ones((batch, seq), np.int32),
            np.zeros((batch, seq), np.int32), np.sort(rng.integers(0, seq, (batch, masked))).astype(np.int32),
            rng.integers(0, args.vocab, (batch, masked)).astype(np.int32), np.ones((batch, masked), np.float32))
    return net, BertPretrainingLoss(net), tuple(Tensor(d) for d in data)


def child_main(args: argparse.Namespace) -> None:
    """Build, compile and train one (net, optimizer); print one JSON line."""
    import resource

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from ms_optim import release_freed_memory

    start = time.perf_counter()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    if args.net.startswith("bert"):
        net, train_net, inputs = _bert_case(args)
    else:
        from model_zoo.resnet.src.resnet import build_resnet

        net = build_resnet(args.net, class_num=1001, width=4 if args.quick else 64)
        rng = np.random.default_rng(0)
        inputs = (Tensor(rng.normal(size=(args.batch, 3, args.image, args.image)).astype(np.float32)),
                  Tensor(rng.integers(0, 1001, size=(args.batch,)).astype(np.int32)))
        train_net = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    lr = Tensor(np.full((args.steps,), 0.01, np.float32))
    layers = 0
    if args.optimizer == "thor":
        from ms_optim.nn import thor

        opt = thor(net, lr, Tensor(np.full((args.steps,), 0.03, np.float32)), 0.9, weight_decay=1e-4,
                   batch_size=args.batch, frequency=FREQUENCY)
        layers = opt.num_layers
    else:
        opt = nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=1e-4)
    train = nn.TrainOneStepCell(train_net, opt)
    train.set_train(True)
    built = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    train.compile(*inputs)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    compiled = time.perf_counter()
    release_freed_memory()
    rss_compiled = _rss_gb()
    steps = []
    for _ in range(args.steps):
        tick = time.perf_counter()
        train(*inputs).asnumpy()
        steps.append((time.perf_counter() - tick) * 1e3)
    flops = _flops(opt, train_net, inputs) if args.optimizer == "thor" else None
    print("RESULT " + json.dumps({
        "thor_layers": layers, "flops": flops, "build_s": built - start, "compile_s": compiled - built,
        "build_compile_s": compiled - start,
        "compile_cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        "rss_after_compile_gb": rss_compiled,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, "step_ms": steps}),
        flush=True)


def _flops(opt, train_net, inputs) -> Dict[str, float]:
    """THOR's extra FLOPs per step against the step's (``benchmarks/_thor_flops.py``), from one PYNATIVE
    forward pass that records the rows each THOR layer sees (run after the measured steps)."""
    import mindspore as ms

    from benchmarks._thor_flops import layer_rows, step_flops

    ms.set_context(mode=ms.PYNATIVE_MODE)
    train_net.set_train(False)
    layers = layer_rows(opt, lambda: train_net(*inputs))
    return step_flops(layers, opt.block_size if opt.inverse == "blocked" else None)


def run_child(net: str, optimizer: str, args: argparse.Namespace) -> Dict:
    """One child process; its measurements with the step medians (step 0 left out)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--nets", net, "--optimizer", optimizer,
           "--batch", str(args.batch), "--image", str(args.image), "--steps", str(args.steps),
           "--seq-length", str(args.seq_length), "--vocab", str(args.vocab)] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"failed": True, "returncode": proc.returncode}
    record = json.loads(lines[-1][len("RESULT "):])
    later = list(enumerate(record["step_ms"]))[1:]
    if optimizer == "thor":
        record["thor_step_ms"] = statistics.median([t for i, t in later if i % FREQUENCY == 0])
        record["non_thor_step_ms"] = statistics.median([t for i, t in later if i % FREQUENCY != 0])
    else:
        record["step_ms_median"] = statistics.median([t for _, t in later])
    record["failed"] = False
    return record


#: figures of a child taken as their median over ``--repeats`` runs
_MEDIAN_KEYS = ("build_s", "compile_s", "build_compile_s", "compile_cpu_s", "rss_after_compile_gb", "peak_rss_gb",
                "thor_step_ms", "non_thor_step_ms", "step_ms_median")


def _median_record(records: List[Dict]) -> Dict:
    """One child's record from ``records`` (runs of the same child): each figure's median, every run's
    build+compile seconds under ``runs_build_compile_s``, the other fields from the first run."""
    if any(r["failed"] for r in records):
        return next(r for r in records if r["failed"])
    merged = dict(records[0])
    for key in _MEDIAN_KEYS:
        if key in merged:
            merged[key] = statistics.median(r[key] for r in records)
    merged["runs_build_compile_s"] = [r["build_compile_s"] for r in records]
    return merged


def run_net(net: str, args: argparse.Namespace) -> Dict:
    """Momentum then THOR, ``--repeats`` times alternating, and the ratios of their medians."""
    result: Dict = {"net": net}
    runs: Dict[str, List[Dict]] = {"momentum": [], "thor": []}
    for _ in range(args.repeats):
        for optimizer in ("momentum", "thor"):
            runs[optimizer].append(run_child(net, optimizer, args))
    for optimizer, records in runs.items():
        result[optimizer] = _median_record(records)
    mom, th = result["momentum"], result["thor"]
    if mom["failed"] or th["failed"]:
        print(f"{net}: a child failed", flush=True)
        return result
    result["thor_layers"] = th["thor_layers"]
    result["ratios"] = {
        "build_compile": th["build_compile_s"] / mom["build_compile_s"],
        "compile_cpu": th["compile_cpu_s"] / mom["compile_cpu_s"],
        "rss_after_compile": th["rss_after_compile_gb"] / mom["rss_after_compile_gb"],
        "peak_rss": th["peak_rss_gb"] / mom["peak_rss_gb"],
        "thor_step": th["thor_step_ms"] / mom["step_ms_median"],
        "non_thor_step": th["non_thor_step_ms"] / mom["step_ms_median"]}
    result["overhead"] = {"build_compile_s": th["build_compile_s"] - mom["build_compile_s"],
                          "rss_after_compile_gb": th["rss_after_compile_gb"] - mom["rss_after_compile_gb"]}
    r = result["ratios"]
    print(f"{net:10s} {th['thor_layers']:4d} THOR layers | build+compile {mom['build_compile_s']:6.1f} s vs "
          f"{th['build_compile_s']:6.1f} s = {r['build_compile']:.2f}x (target <= {TARGETS['build_compile']}; "
          f"compile CPU {r['compile_cpu']:.2f}x) | resident after compile {mom['rss_after_compile_gb']:.2f} vs "
          f"{th['rss_after_compile_gb']:.2f} GiB = {r['rss_after_compile']:.2f}x (target <= "
          f"{TARGETS['rss_after_compile']}) | peak {r['peak_rss']:.2f}x | THOR step {r['thor_step']:.2f}x, "
          f"other steps {r['non_thor_step']:.2f}x", flush=True)
    flops = th.get("flops")
    if flops:
        print(f"{'':10s} FLOPs per step: training {flops['train'] / 1e9:.2f} G (THOR layers' products); THOR adds "
              f"preconditioning {flops['precondition'] / 1e9:.2f} G every step (+{flops['non_thor_extra']:.2f}x), "
              f"factors {flops['factors'] / 1e9:.2f} G and inversions {flops['inversion'] / 1e9:.2f} G on THOR "
              f"steps (+{flops['thor_extra']:.2f}x in all)", flush=True)
    return result


def plot(path: str, results: List[Dict]) -> str:
    """THOR's overhead (build+compile seconds, resident GiB) and ratios against the number of THOR layers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = sorted((r for r in results if "ratios" in r), key=lambda r: r["thor_layers"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = [r["thor_layers"] for r in done]
    axes[0].plot(x, [r["overhead"]["build_compile_s"] for r in done], "o-", label="THOR - Momentum, seconds")
    axes[0].plot(x, [r["momentum"]["build_compile_s"] for r in done], "s--", label="Momentum, seconds")
    axes[0].set_ylabel("build + compile (s)")
    axes[1].plot(x, [r["ratios"]["build_compile"] for r in done], "o-", label="build+compile")
    axes[1].plot(x, [r["ratios"]["rss_after_compile"] for r in done], "s-", label="resident after compile")
    axes[1].plot(x, [r["ratios"]["peak_rss"] for r in done], "^-", label="peak RSS")
    axes[1].axhline(TARGETS["build_compile"], color="gray", ls=":", lw=1, label="target, build+compile")
    axes[1].axhline(TARGETS["rss_after_compile"], color="gray", ls="--", lw=1, label="target, resident")
    axes[1].set_ylabel("THOR / Momentum")
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['net']}\n{r['thor_layers']}" for r in done], fontsize=7)
        ax.set_xlabel("net and its number of THOR layers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2)  # off the curves
    fig.suptitle("THOR at depth (GRAPH_MODE, CPU, one process per run)", fontsize=10)
    return save_figure(fig, path)


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the overhead and ratio curves of a record of this benchmark beside its JSON; returns the PNG."""
    return [plot(os.path.splitext(json_path)[0] + ".png", record["results"])]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", default=DEFAULT_NETS, help=f"comma-separated nets (default {DEFAULT_NETS})")
    parser.add_argument("--batch", type=int, default=2, help="batch size (default 2: compile dominates)")
    parser.add_argument("--image", type=int, default=32, help="ResNet input height and width (default 32)")
    parser.add_argument("--seq-length", type=int, default=32, help="BERT sequence length (default 32)")
    parser.add_argument("--vocab", type=int, default=30522, help="BERT vocabulary size (default 30522)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per process (default 5)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each child, Momentum and THOR alternating; medians reported (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one child may take (default 1800)")
    parser.add_argument("--quick", action="store_true", help="smoke run: ResNet-18 width 4 and a tiny BERT")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bench_compile[_quick].json)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--optimizer", default="thor", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.net = args.nets
        child_main(args)
        return 0
    if args.quick and args.nets == DEFAULT_NETS:
        args.nets, args.vocab = "resnet18,bert-tiny", 512
    stem = "bench_compile_quick" if args.quick else "bench_compile"
    out = args.out or os.path.join(RESULTS_DIR, stem + ".json")
    results = [run_net(net.strip(), args) for net in args.nets.split(",") if net.strip()]
    payload = {"benchmark": "bench_compile", "batch": args.batch, "image": args.image, "seq_length": args.seq_length,
               "vocab": args.vocab, "steps": args.steps, "repeats": args.repeats, "frequency": FREQUENCY,
               "quick": args.quick, "targets": TARGETS, "results": results}
    (png,) = plot_record(read_json(write_json(out, payload)), out)
    print(f"wrote {out} and {png}")
    return 0 if all("ratios" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
