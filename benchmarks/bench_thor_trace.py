"""THOR's trace rule against the fixed schedule: inversions, THOR-step time and time to 97% on digits.

LeNet5 (``model_zoo/lenet``, default) or model_zoo's ResNet-18 (``--net resnet18``, first stage ``--width``
channels, the grey digit repeated over three channels; ``--inverse full`` makes inversion most of its THOR
step) on scikit-learn digits (32x32, 20% held out), GRAPH_MODE on CPU, THOR with
the model zoo's recipe (lr 0.1 as in ``bench_thor.py``'s recorded run, decayed polynomially (power 2) to
0 over ``--epochs``, damping 0.01, weight decay 1e-4, per-tensor clipping, batch 32). For every
``--frequencies`` f, two runs from the same initial weights over the same batches: the fixed schedule
(every layer re-inverted on every THOR step, ``trace_thresholds=None``) and THOR's trace rule
(``trace_thresholds=(omega_1, omega_2)``, ``--thresholds``; the rule is in ``ms_optim/_thor/trace.py``).
Every training step is one call of a ``TrainOneStepCell`` timed on its own; the held-out accuracy is
measured every ``--eval-every`` steps with the clock paused. A run stops at the target accuracy or at
the epoch cap.

Reported per run and per epoch: steps, THOR steps, inversions performed (layer refreshes: A and G of one
layer count as one; the fixed schedule performs ``layers x THOR steps``), the seconds spent in THOR
steps and in the other steps, and the training seconds and steps to the target. Ratios (trace / fixed,
same frequency, same process, runs interleaved per frequency): inversions, THOR-step seconds, seconds
to target. Goal: fewer than half the inversions at the same time to accuracy or better.

    python benchmarks/bench_thor_trace.py            # f = 20 and 5, 6 epochs (a few minutes on 2 cores)
    python benchmarks/bench_thor_trace.py --quick    # smoke run: f = 5, 1 epoch
    python benchmarks/bench_thor_trace.py --net resnet18 --width 16 --inverse full --frequencies 5 20 \
        --seeds 1 2 --step-nets resnet18 --repeats 7 --name bench_thor_trace_resnet18   # about 10 minutes
Writes ``benchmarks/results/<--name>[_quick].json`` and ``<--name>[_quick]_tta.png`` (``--name`` default
``bench_thor_trace``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Optional

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports").
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    interleaved_medians,
    read_json,
    save_figure,
    set_thor_state,
    write_json,
)

GOAL = {"inversions_trace_vs_fixed": 0.5, "tta_trace_vs_fixed": 1.0}
LR, LR_POWER, DAMPING, WEIGHT_DECAY, BATCH = 0.1, 2.0, 0.01, 1e-4, 32


def build_net(name: str, width: int):
    """``(net, input shape)``: LeNet5 on 1x32x32, or model_zoo's ResNet-18 (ImageNet stem, 10 classes, first
    stage ``width`` channels) on 3x32x32 (the grey digit repeated over the three channels)."""
    if name == "lenet":
        from model_zoo.lenet.lenet import LeNet5

        return LeNet5(), (1, 32, 32)
    from model_zoo.resnet.src.resnet import resnet18

    return resnet18(class_num=10, width=width), (3, 32, 32)


def net_data(name: str, data):
    """The digits arrays in the net's input layout (three channels for ResNet-18)."""
    import numpy as np

    if name == "lenet":
        return data
    x_tr, y_tr, x_te, y_te = data
    return np.repeat(x_tr, 3, axis=1), y_tr, np.repeat(x_te, 3, axis=1), y_te


def train_run(frequency: int, thresholds, epochs: int, eval_every: int, target: float, seed: int,
              data, net_name: str = "lenet", width: int = 16, inverse: str = "blocked") -> Dict:
    """One THOR run (fixed schedule when ``thresholds`` is None); see the module docstring."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from model_zoo.lenet.train import thor_lr_schedule
    from ms_optim.nn import thor

    x_tr, y_tr, x_te, y_te = net_data(net_name, data)
    steps_per_epoch = len(y_tr) // BATCH
    total = epochs * steps_per_epoch
    ms.set_seed(seed)
    net, _ = build_net(net_name, width)
    opt = thor(net, Tensor(thor_lr_schedule(LR, LR_POWER, total)), Tensor(np.full((total,), DAMPING, np.float32)),
               0.9, weight_decay=WEIGHT_DECAY, batch_size=BATCH, frequency=frequency, enable_clip_grad=True,
               inverse=inverse, trace_thresholds=thresholds)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
    x_test = Tensor(x_te)
    layers = opt.num_layers

    def inversions() -> int:
        if opt.trace is None:
            return layers * (-(-int(opt.global_step.asnumpy().reshape(-1)[0]) // frequency))
        return int(opt.trace.inversion_counts().sum())

    def accuracy() -> float:
        net.set_train(False)
        acc = float(np.mean(np.argmax(net(x_test).asnumpy(), axis=1) == y_te))
        net.set_train(True)
        return acc

    t0 = time.perf_counter()
    cell.compile(Tensor(x_tr[:BATCH]), Tensor(y_tr[:BATCH]))  # compile outside the timed steps
    compile_seconds = time.perf_counter() - t0
    history, per_epoch = [], []
    seconds, step, hit = 0.0, 0, None
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(y_tr))
        record = {"epoch": epoch + 1, "steps": 0, "thor_steps": 0, "inversions": 0, "thor_step_seconds": 0.0,
                  "other_step_seconds": 0.0}
        start_inv = inversions()
        for b in range(steps_per_epoch):
            idx = order[b * BATCH:(b + 1) * BATCH]
            x, y = Tensor(x_tr[idx]), Tensor(y_tr[idx])
            is_thor = step % frequency == 0
            t0 = time.perf_counter()
            cell(x, y).asnumpy()
            dt = time.perf_counter() - t0
            seconds += dt
            step += 1
            record["steps"] += 1
            record["thor_steps"] += int(is_thor)
            record["thor_step_seconds" if is_thor else "other_step_seconds"] += dt
            if step % eval_every == 0 or step == total:
                acc = accuracy()
                history.append({"step": step, "seconds": seconds, "test_accuracy": acc})
                if acc >= target and hit is None:
                    hit = (seconds, step)
                    break
        record["inversions"] = inversions() - start_inv
        per_epoch.append(record)
        if hit is not None:
            break
    per_layer = (opt.trace.inversion_counts().tolist() if opt.trace is not None
                 else [-(-step // frequency)] * layers)
    return {"net": net_name, "width": width if net_name == "resnet18" else None, "inverse": inverse,
            "schedule": "fixed" if thresholds is None else "trace", "frequency": frequency, "seed": seed,
            "trace_thresholds": None if thresholds is None else list(thresholds), "layers": layers,
            "steps": step, "thor_steps": -(-step // frequency), "inversions": inversions(),
            "inversions_per_layer": per_layer,
            "thor_step_seconds": sum(r["thor_step_seconds"] for r in per_epoch),
            "train_seconds": seconds, "compile_seconds": compile_seconds,
            "seconds_to_target": None if hit is None else hit[0],
            "steps_to_target": None if hit is None else hit[1], "final_test_accuracy": history[-1]["test_accuracy"],
            "per_epoch": per_epoch, "history": history}


def thor_step_times(net_name: str, repeats: int, warmup: int, width: int = 16, inverse: str = "blocked") -> Dict:
    """Median time of one THOR step (global_step 0, flags on) of three optimizers on the same net and batch:
    the fixed schedule, the trace rule refreshing every layer (thresholds 0) and refreshing none
    (thresholds 1e30, after its first step): what a skipped inversion saves and what the decision costs."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from ms_optim.nn import thor

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.default_rng(0)
    cells, opts = {}, {}
    for label, th in (("fixed", None), ("trace_all_refresh", 0.0), ("trace_none_refresh", 1e30)):
        ms.set_seed(0)
        net, shape = build_net(net_name, width)
        opt = thor(net, Tensor(np.float32(0.01)), Tensor(np.float32(0.03)), 0.9, batch_size=BATCH, frequency=10**6,
                   inverse=inverse, trace_thresholds=th)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        cells[label] = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        opts[label] = opt
    x = Tensor(rng.normal(size=(BATCH,) + shape).astype(np.float32))
    y = Tensor(rng.integers(0, 10, size=(BATCH,)).astype(np.int32))

    def prepare(label):
        return lambda: set_thor_state(opts[label], 0)

    timings = interleaved_medians({k: (lambda c=c: c(x, y).asnumpy()) for k, c in cells.items()},
                                  repeats=repeats, warmup=warmup, prepare={k: prepare(k) for k in cells})
    med = {k: v["median_ms"] for k, v in timings.items()}
    none = opts["trace_none_refresh"].trace.inversion_counts().tolist()
    every = opts["trace_all_refresh"].trace.inversion_counts().tolist()
    calls = warmup + repeats
    if none != [1] * len(none) or every != [calls] * len(every):  # each timed call must be a THOR step
        raise RuntimeError(f"the timed calls were not the THOR steps intended: inversions per layer {every} "
                           f"(refresh all, {calls} calls) and {none} (refresh none, 1 expected)")
    return {"net": net_name, "width": width if net_name == "resnet18" else None, "inverse": inverse,
            "layers": opts["fixed"].num_layers, "repeats": repeats, "timings_ms": timings,
            "none_refresh_inversions_per_layer": none, "all_refresh_inversions_per_layer": every,
            "all_refresh_vs_fixed": med["trace_all_refresh"] / med["fixed"],
            "none_refresh_vs_fixed": med["trace_none_refresh"] / med["fixed"]}


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def plot(runs: List[Dict], path: str, target: float, title: str) -> None:
    """Accuracy against training seconds (colour: schedule, line style: frequency) and the inversions of each
    (frequency, seed) pair, fixed and trace side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fixed": "#4C72B0", "trace": "#DD8452"}
    frequencies = sorted({r["frequency"] for r in runs}, reverse=True)
    styles = dict(zip(frequencies, ("-", "--", ":", "-.")))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    labelled = set()
    for r in runs:
        key = (r["schedule"], r["frequency"])
        ax.plot([h["seconds"] for h in r["history"]], [h["test_accuracy"] for h in r["history"]],
                styles.get(r["frequency"], "-"), color=colours[r["schedule"]], linewidth=1.3, alpha=0.85,
                label=None if key in labelled else f"{r['schedule']}, frequency {r['frequency']}")
        labelled.add(key)
    lowest = min((h["test_accuracy"] for r in runs for h in r["history"][1:]), default=0.0)
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0.5 if lowest > 0.5 else 0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", title=f"each seed a line; target {target:g} dotted", title_fontsize=8)
    ax.set_title(title, fontsize=10)
    pairs = sorted({(r["frequency"], r["seed"]) for r in runs}, key=lambda p: (-p[0], p[1]))
    for offset, schedule in ((-0.2, "fixed"), (0.2, "trace")):
        for i, pair in enumerate(pairs):
            run = next((r for r in runs if (r["frequency"], r["seed"]) == pair and r["schedule"] == schedule), None)
            if run is None:
                continue
            bar = bx.bar(i + offset, run["inversions"], 0.4, color=colours[schedule],
                         label=schedule if i == 0 else None)[0]
            bx.annotate(f"{run['inversions']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    bx.set_xticks(range(len(pairs)))
    bx.set_xticklabels([f"f={f}\nseed {seed}" for f, seed in pairs], fontsize=8)
    bx.set_ylabel("layer inversions until the target (or the cap)")
    bx.set_title("inversions performed", fontsize=10)
    bx.legend(fontsize=8)
    save_figure(fig, path)


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the accuracy curves and inversion counts of a record of this benchmark beside its JSON
    (``<stem>_tta.png``; nothing without training runs); returns the PNG's path."""
    if not record.get("runs"):
        return []
    title = "LeNet5" if record["net"] == "lenet" else f"ResNet-18 (width {record['width']})"
    path = os.path.splitext(json_path)[0] + "_tta.png"
    plot(record["runs"], path, record["target"],
         f"{title} on digits, CPU, inverse={record['inverse']!r}: accuracy vs time")
    return [path]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: f = 5, 1 epoch")
    parser.add_argument("--frequencies", type=int, nargs="+", default=None, help="THOR frequencies (default 20 5)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[10.0, 0.95],
                        help="trace_thresholds: omega (one number) or omega_1 omega_2")
    parser.add_argument("--epochs", type=int, default=None, help="epoch cap and lr-decay length (default 6)")
    parser.add_argument("--eval-every", type=int, default=11, help="steps between accuracy measurements")
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="initial weights and batch order")
    parser.add_argument("--net", choices=("lenet", "resnet18"), default="lenet", help="net of the training runs")
    parser.add_argument("--width", type=int, default=16, help="ResNet-18 first-stage channels (64 = published)")
    parser.add_argument("--inverse", choices=("blocked", "full"), default="blocked", help="thor(..., inverse=)")
    parser.add_argument("--step-nets", nargs="*", choices=("lenet", "resnet18"), default=None,
                        help="nets for the THOR-step timing (default lenet; none with --quick unless given)")
    parser.add_argument("--repeats", type=int, default=10, help="timing rounds of the THOR-step timing")
    parser.add_argument("--skip-tta", action="store_true", help="skip the training runs")
    parser.add_argument("--name", default="bench_thor_trace", help="file stem of the JSON and PNG")
    parser.add_argument("--out", default=RESULTS_DIR, help="folder for the JSON and PNG files")
    args = parser.parse_args(argv)
    if len(args.thresholds) not in (1, 2):
        parser.error("--thresholds takes omega or omega_1 omega_2")
    thresholds = tuple(args.thresholds) if len(args.thresholds) == 2 else (args.thresholds[0],) * 2
    freqs = args.frequencies or ([5] if args.quick else [20, 5])
    epochs = args.epochs or (1 if args.quick else 6)
    suffix = "_quick" if args.quick else ""

    import mindspore as ms

    from model_zoo.lenet.dataset import load_digits_32
    from ms_optim._bridge import prime_numpy_bridge

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    prime_numpy_bridge()
    data = load_digits_32(seed=0)
    step_times = []
    for name in (args.step_nets if args.step_nets is not None else ([] if args.quick else ["lenet"])):
        res = thor_step_times(name, args.repeats, 2, args.width, args.inverse)
        med = {k: v["median_ms"] for k, v in res["timings_ms"].items()}
        print(f"THOR step, {name}: fixed {med['fixed']:.1f} ms, trace refreshing all {med['trace_all_refresh']:.1f} ms "
              f"({res['all_refresh_vs_fixed']:.2f}x), refreshing none {med['trace_none_refresh']:.1f} ms "
              f"({res['none_refresh_vs_fixed']:.2f}x)", flush=True)
        step_times.append(res)
    runs, comparisons = [], []
    for f, seed in [(f, seed) for f in ([] if args.skip_tta else freqs) for seed in args.seeds]:
        pair = []
        for th in (None, thresholds):
            r = train_run(f, th, epochs, args.eval_every, args.target, seed, data, args.net, args.width, args.inverse)
            hit = r["seconds_to_target"]
            reached = "not reached" if hit is None else f"at {hit:.2f}s / step {r['steps_to_target']}"
            print(f"f={f:<3d} seed {seed} {r['schedule']:5s}: {r['inversions']:4d} inversions in "
                  f"{r['thor_steps']} THOR steps "
                  f"(per layer {r['inversions_per_layer']}), THOR steps {r['thor_step_seconds']:.2f}s of "
                  f"{r['train_seconds']:.2f}s, {args.target:.0%} "
                  f"{reached} "
                  f"(acc {r['final_test_accuracy']:.3f})", flush=True)
            runs.append(r)
            pair.append(r)
        fixed, trace = pair
        cmp = {"frequency": f, "seed": seed,
               "inversions_trace_vs_fixed": _ratio(trace["inversions"], fixed["inversions"]),
               "thor_step_seconds_per_thor_step_trace_vs_fixed": _ratio(
                   trace["thor_step_seconds"] / max(trace["thor_steps"], 1),
                   fixed["thor_step_seconds"] / max(fixed["thor_steps"], 1)),
               "tta_trace_vs_fixed": _ratio(trace["seconds_to_target"], fixed["seconds_to_target"]),
               "steps_to_target_trace_vs_fixed": _ratio(trace["steps_to_target"], fixed["steps_to_target"])}
        cmp["goal_met"] = (cmp["inversions_trace_vs_fixed"] is not None and cmp["tta_trace_vs_fixed"] is not None
                           and cmp["inversions_trace_vs_fixed"] < GOAL["inversions_trace_vs_fixed"]
                           and cmp["tta_trace_vs_fixed"] <= GOAL["tta_trace_vs_fixed"])
        comparisons.append(cmp)
        print("  trace/fixed: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in cmp.items() if k not in ("frequency", "seed")), flush=True)
    path = write_json(os.path.join(args.out, f"{args.name}{suffix}.json"),
                      {"quick": args.quick, "net": args.net, "width": args.width, "inverse": args.inverse,
                       "goal": GOAL, "epochs_cap": epochs, "target": args.target,
                       "trace_thresholds": list(thresholds), "recipe": {"lr": LR, "lr_power": LR_POWER,
                       "damping": DAMPING, "weight_decay": WEIGHT_DECAY, "batch": BATCH, "clip": True},
                       "thor_step_times": step_times, "comparisons": comparisons, "runs": runs})
    plot_record(read_json(path), path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
