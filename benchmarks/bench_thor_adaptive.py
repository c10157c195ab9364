r"""Adaptive THOR against tuned baselines: THOR recipes, lr/damping grids, Momentum and Lamb, on three tasks.

Tasks (every run of a task starts from the same initial weights and sees the same batches; GRAPH_MODE, CPU):

* ``lenet``: the quickstart's LeNet5 on scikit-learn digits (32x32, 20% held out; ``bench_thor_robust``'s
  loader), batch 32, ``--lenet-epochs`` epochs of 44 steps. Figure: held-out accuracy; target 0.90.
* ``resnet``: ``model_zoo/resnet``'s ResNet-18 (CIFAR stem, 32x32, ``--resnet-width`` channels in its first
  stage; 64 is the published net) on CIFAR-10-format data from the zoo's generator
  (``model_zoo.resnet.src.synthetic``: a colour per class plus noise), read by the zoo's own CIFAR-10 pipeline
  (padded random crop, flip, normalisation), ``--resnet-images`` training images per epoch, batch 32,
  ``--resnet-epochs`` epochs, read once; 320 held-out images. Figure: held-out accuracy; target 0.90.
* ``bert``: ``model_zoo/bert``'s tiny BERT (2 layers, hidden 64, no dropout) pretrained with masked LM on a
  generated corpus (480 sentences "the ADJ NOUN VERB PREP the ADJ NOUN ." whose verb is fixed by its noun),
  with a vocabulary of its words (the same ids in every process) read by the zoo's WordPiece tokenizer
  (``model_zoo.bert.bert_data``), sequence length 32, batch 16, masked afresh every epoch, ``--bert-epochs``
  epochs of 9 steps. Figure: masked-token accuracy on a held-out corpus of 480 sentences; target 0.50.

Runs per task, every one with ``ms_optim.nn.TrainOneStepCell``, momentum 0.9 and no per-task tuning:

* ``adaptive``: ``thor(net, "adaptive", "adaptive", 0.9, frequency=--frequency)``, every other setting at
  its default (momentum 0.9: each step 0.9 times the last plus 0.1 times the calibrated model's step;
  ``--adaptive-momentum adaptive``: the 2x2 solve for step size and momentum; a comma list such as
  ``0.9,0.8``: one adaptive run per momentum, each its own table row and curve, the goals judging the
  first: how much the one number a user still passes matters). ``--adaptive`` names what is
  adaptive: ``damping,lr`` (the default: ``learning_rate="adaptive"`` too), ``damping`` (lr then
  ``--adaptive-lr``, constant) or ``lr`` (damping then ``--adaptive-damping``, constant).
* ``recipe``: THOR with the model zoo's recipe for that model, its lr and damping schedules spread over the
  run: LeNet ``model_zoo/lenet`` (tuned lr, damping 0.01, weight decay 1e-4, per-tensor clipping, lr decayed
  to 0), ResNet ``configs/resnet18_cifar10_thor.yaml`` (MindSpore's ImageNet THOR settings: lr 0.05 decay
  4, damping 0.03 decay 0.5, weight decay 5e-4, loss scale 128; one epoch = the run's epoch, no label
  smoothing), BERT ``model_zoo/bert/train.py``'s THOR defaults (lr 0.01 decayed linearly, damping 0.05
  decayed to half, weight decay 0.01 off LayerNorm and biases). Frequency: LeNet's own (20); ResNet and
  BERT ``--frequency`` (theirs, 100, are for epochs of thousands of steps).
* ``thor``: THOR over the grid ``--lrs`` x ``--dampings`` (constant, no weight decay, no clipping).
* ``momentum``: ``mindspore.nn.Momentum`` over ``--lrs``; for BERT also ``lamb``: ``ms_optim.nn.Lamb`` over
  ``--lrs``.
The best of a grid is its run with the best final figure (ties: the shorter time to target).
``--seeds N`` runs every setting with N seeds (each its own initial weights, data and batch order); the
table, the goals and the plot then take each setting's mean over the seeds (NaN if any seed went NaN; a time
to target only where every seed reached it), so a grid's best is the setting with the best mean.

Reported per run (``step_sizes``: the adaptive learning rate's ``alpha`` of every step, 0 where a trial was
rejected): time to target (training seconds until the first evaluation at or above the target; the
first step's call, which compiles the graph, counts as one median step and its extra is reported as
``compile_seconds``; evaluations every ``--eval-every`` steps with the clock paused), the final figure, the
final loss, the NaN flag (the run stops at the first non-finite loss), NaN runs per grid and wall time.
The adaptive run's extra forward pass is inside its steps, so its time includes it; the table's ms/step
and ``goals.step_cost_vs_thor`` (adaptive's median step over the best grid THOR's) say what it costs.
Goals, reported met or not: adaptive THOR never goes NaN; its final figure is within 1 point (0.01) of the
best grid THOR on every task; its time to target beats the best (fastest) grid Momentum's on at least two of
the three tasks (a run that never reaches the target loses to one that does).

Output: ``benchmarks/results/bench_thor_adaptive[_quick].json`` (every run with its curve, the table, the
goals) and ``.png`` (held-out figure against training seconds per task: adaptive, recipe, best grid THOR,
best Momentum, best Lamb; the target dashed), both rewritten after every run (``complete`` false until the
last). Defaults: 36 runs (small data, small grids: a benchmark of the method, not of converged accuracy),
each task long enough for its best baseline to reach the target (LeNet 3 epochs of 44 steps, ResNet 3 of 15,
BERT 120 of 9); LeNet and BERT take minutes, ResNet-18 most of the time (graph compilation and the steps of
a conv net: a few minutes per run on 2 cores);
``--quick`` is a smoke run of a few steps per run (about a minute per task, mostly graph compilation).

    nice python benchmarks/bench_thor_adaptive.py                          # the full benchmark
    python benchmarks/bench_thor_adaptive.py --quick --tasks lenet         # smoke run
    nice python benchmarks/bench_thor_adaptive.py --adaptive damping       # a constant learning rate
    nice python benchmarks/bench_thor_adaptive.py --tasks lenet,bert --seeds 3 --adaptive-momentum 0.9,0.7,0.8 \
        --lrs 0.03 --dampings 0.1 --out benchmarks/results/x             # adaptive THOR's momentum, 3 seeds
    nice python benchmarks/bench_thor_adaptive.py --adaptive-momentum adaptive \
        --out benchmarks/results/bench_thor_adaptive_2x2                    # the 2x2 solve (momentum too)
    python benchmarks/bench_thor_adaptive.py --tasks bert --adaptive lr --out benchmarks/results/x
                                                          # adaptive lr, damping constant (--adaptive-damping)
    nice python benchmarks/bench_thor_adaptive.py --lr-multiples 1,3,10   # damping="adaptive" at 1x, 3x and 10x
                                                          # the best grid THOR's lr (_adaptive_multiples.py)
    nice python benchmarks/bench_thor_adaptive.py --cost  # the steps' cost (_adaptive_cost.py)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
import time
from typing import Dict, List, Optional, Sequence

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports").
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._adaptive_summary import average_seeds, best_run, fmt, print_table, summarise  # noqa: E402
from benchmarks._adaptive_tasks import TARGETS, TASKS, build_task, recipe_optimizer  # noqa: E402
from benchmarks._common import (  # noqa: E402
    RESULTS_DIR,
    float_list,
    plotted_from,
    read_json,
    save_figure,
    write_json,
)

ADAPTIVE = ("damping", "lr")
#: the momentum of every THOR grid and Momentum run (and adaptive THOR's default)
MOMENTUM = 0.9


def _adaptive(text: str) -> List[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in ADAPTIVE for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"must be 'damping,lr', 'damping' or 'lr', got {text!r}")
    return names


def _momentum(text: str):
    if text == "adaptive":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a float in [0, 1) or 'adaptive', got {text!r}")
    return value


def _momenta(text: str) -> list:
    values = [_momentum(x.strip()) for x in text.split(",") if x.strip()]
    if not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"must be distinct floats in [0, 1) or 'adaptive', got {text!r}")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--tasks", default=",".join(TASKS), help=f"comma list of {','.join(TASKS)} (default all)")
    add("--adaptive", type=_adaptive, default=["damping", "lr"],
        help="what adaptive THOR adapts: 'damping,lr' (default: learning_rate='adaptive' too), 'damping' or "
        "'lr' (learning_rate='adaptive' with a constant damping)")
    add("--adaptive-lr", type=float, default=0.1,
        help="adaptive THOR's constant lr without 'lr' (default 0.1)")
    add("--adaptive-momentum", type=_momenta, default=[MOMENTUM],
        help="adaptive THOR's momentum: a float in [0, 1) or 'adaptive' (the 2x2 solve; needs 'lr' in "
        "--adaptive), or a comma list of them: one adaptive run each, the goals judge the first (default 0.9)")
    add("--adaptive-damping", type=float, default=0.01,
        help="adaptive THOR's constant damping without 'damping' (default 0.01)")
    add("--lrs", type=float_list, default=[0.01, 0.03, 0.1], help="lr grid of THOR, Momentum, Lamb (default "
        "0.01,0.03,0.1)")
    add("--dampings", type=float_list, default=[0.01, 0.1], help="THOR damping grid (default 0.01,0.1)")
    add("--frequency", type=int, default=10, help="THOR frequency of every THOR run (default 10)")
    add("--lenet-epochs", type=int, default=3, help="LeNet epochs of 44 steps (default 3)")
    add("--resnet-width", type=int, default=8, help="ResNet-18 first-stage width (default 8)")
    add("--resnet-images", type=int, default=480, help="ResNet training images per epoch (default 480)")
    add("--resnet-epochs", type=int, default=3, help="ResNet epochs (default 3)")
    add("--bert-epochs", type=int, default=120, help="BERT epochs of 9 steps (default 120)")
    add("--eval-every", type=int, default=5, help="steps between held-out evaluations (default 5)")
    add("--seed", type=int, default=1, help="seed of weights, data and batch order (default 1)")
    add("--seeds", type=int, default=1, help="run every setting with this many seeds, --seed, --seed + 1, ...; "
        "the table and the goals average each setting over them (default 1)")
    add("--quick", action="store_true", help="smoke run: one grid point, a few steps per run, tiny nets")
    add("--replot", action="store_true", help="train nothing: redraw the PNG from the JSON at --out")
    add("--cost", action="store_true", help="measure what adaptive THOR's step costs beside THOR's instead "
        "(benchmarks/_adaptive_cost.py: step times, the forward pass's share, kernels per step)")
    add("--cost-steps", type=int, default=40, help="steps timed per cell with --cost (default 40)")
    add("--lr-multiples", type=float_list, default=None,
        help="instead: damping='adaptive' at the best grid THOR's lr times each of these, e.g. 1,3,10, beside "
        "the fixed damping at the same lr (benchmarks/_adaptive_multiples.py)")
    add("--out", default=None, help="output path without extension (default benchmarks/results/"
        "bench_thor_adaptive[_quick])")
    args = parser.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks or any(t not in TASKS for t in args.tasks):
        parser.error(f"--tasks must be a comma list of {','.join(TASKS)}, got {args.tasks}")
    if not args.lrs or not args.dampings or min(args.lrs + args.dampings
                                                 + [args.adaptive_lr, args.adaptive_damping]) <= 0:
        parser.error("--lrs, --dampings, --adaptive-lr and --adaptive-damping need values > 0")
    if min(args.lenet_epochs, args.resnet_width, args.resnet_epochs, args.bert_epochs, args.eval_every,
           args.seeds) < 1 or args.frequency < 2 or args.resnet_images < 32:
        parser.error("epochs, --resnet-width, --eval-every and --seeds must be >= 1, --frequency >= 2, "
                     "--resnet-images >= 32")
    if "adaptive" in args.adaptive_momentum and "lr" not in args.adaptive:
        parser.error("--adaptive-momentum adaptive needs 'lr' in --adaptive (learning_rate='adaptive')")
    if args.quick:
        args.lrs, args.dampings = args.lrs[-1:], args.dampings[:1]
        args.lenet_epochs = args.resnet_epochs = args.bert_epochs = 1
        args.resnet_width, args.resnet_images, args.eval_every, args.frequency = 4, 64, 2, 2
    if args.cost:
        args.bert_epochs = min(args.bert_epochs, 10)  # the timed steps cycle through the batches
    if args.lr_multiples is not None and (args.cost or min(args.lr_multiples) <= 0):
        parser.error("--lr-multiples needs values > 0 and no --cost")
    if args.out is None:
        mode = "_cost" if args.cost else "_lr_multiples" if args.lr_multiples else ""
        args.out = os.path.join(RESULTS_DIR, "bench_thor_adaptive" + mode + ("_quick" if args.quick else ""))
    return args


# ----------------------------------------------------------------------------------- one run
def _optimizer(kind: str, lr, damping, momentum, task, net_with_loss, args):
    """The optimizer of a run (``kind`` adaptive, recipe, thor, momentum or lamb) and the loss scale."""
    import numpy as np
    from mindspore import Tensor
    from mindspore import nn as mnn

    from ms_optim import nn as ms_nn

    if kind == "adaptive":
        lr_arg = "adaptive" if "lr" in args.adaptive else Tensor(np.float32(lr))
        damping_arg = "adaptive" if "damping" in args.adaptive else Tensor(np.float32(args.adaptive_damping))
        return ms_nn.thor(net_with_loss, lr_arg, damping_arg, momentum, batch_size=task["batch"],
                          frequency=args.frequency), 1.0
    if kind == "damping":  # the user's learning rate, the damping adaptive
        return ms_nn.thor(net_with_loss, Tensor(np.float32(lr)), "adaptive", momentum, batch_size=task["batch"],
                          frequency=args.frequency), 1.0
    if kind == "recipe":
        return recipe_optimizer(task, net_with_loss, args.frequency)
    if kind == "thor":
        return ms_nn.thor(net_with_loss, Tensor(np.float32(lr)), Tensor(np.float32(damping)), momentum,
                          batch_size=task["batch"], frequency=args.frequency), 1.0
    params = net_with_loss.trainable_params()
    return (mnn.Momentum(params, lr, momentum) if kind == "momentum" else ms_nn.Lamb(params, lr)), 1.0


def train_once(task: Dict, kind: str, lr, damping, momentum, args) -> Dict:
    """One run from the task's initial weights over its batches; the curve, times, NaN flag, final figure
    (``momentum``: the run's, None for the recipe and Lamb, which set their own)."""
    import statistics

    import mindspore as ms
    from mindspore import Tensor

    from ms_optim import nn as ms_nn

    ms.set_seed(args.seed)
    net, net_with_loss = task["build"]()
    opt, scale = _optimizer(kind, lr, damping, momentum, task, net_with_loss, args)
    cell = ms_nn.TrainOneStepCell(net_with_loss, opt, sens=scale).set_train()
    target = TARGETS[task["name"]]
    steps, curve, nan_step, reached = [], [], None, None
    # learning_rate="adaptive": record its step sizes
    quadratic_step = opt.step_rule if getattr(opt, "config", None) and opt.config.lr_mode == "adaptive" else None
    step_sizes = []
    wall = time.perf_counter()
    for step, batch in enumerate(task["batches"]):
        start = time.perf_counter()
        loss = float(cell(*[Tensor(x) for x in batch]).asnumpy())
        steps.append(time.perf_counter() - start)
        if quadratic_step is not None:
            step_sizes.append(float(quadratic_step.step_size.asnumpy()))
        if not math.isfinite(loss):
            nan_step = step
            break
        if (step + 1) % args.eval_every == 0 or step + 1 == len(task["batches"]):
            figure = task["evaluate"](net)
            cell.set_train()
            median = statistics.median(steps[1:]) if len(steps) > 1 else steps[0]
            seconds = median + sum(steps[1:])
            curve.append((step + 1, seconds, figure))
            if reached is None and figure >= target:
                reached = seconds
    median = statistics.median(steps[1:]) if len(steps) > 1 else steps[0]
    finite = nan_step is None
    rule = getattr(opt, "damping_rule", None)
    rejected = getattr(rule, "rejected_steps", None)
    return {"rejected_steps": None if rejected is None else int(rejected.asnumpy()),
            "task": task["name"], "kind": kind, "lr": None if kind in ("adaptive", "recipe") and lr is None
            else lr, "damping": damping, "momentum": momentum, "nan": not finite, "nan_step": nan_step,
            "final": curve[-1][2] if finite and curve else float("nan"), "final_loss": loss,
            "seconds_to_target": reached, "train_seconds": median + sum(steps[1:]),
            "steps_to_target": next((c[0] for c in curve if c[2] >= target), None),
            "compile_seconds": steps[0] - median, "median_step_ms": 1e3 * median, "steps": len(steps),
            "wall_seconds": time.perf_counter() - wall, "curve": curve, "step_sizes": step_sizes}


def _nan_entry(ax, colour: str, label: str) -> None:
    """A legend entry (a cross, no curve) for runs that went NaN."""
    ax.plot([], [], marker="x", color=colour, linestyle="none", label=label)


def plot(path: str, runs: List[Dict], tasks: Sequence[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"adaptive": "#C44E52", "recipe": "#8172B2", "thor": "#DD8452", "momentum": "#4C72B0",
               "lamb": "#55A868"}
    runs = average_seeds(runs)
    adaptive_runs = max(sum(r["kind"] == "adaptive" for r in runs if r["task"] == name) for name in tasks)
    below = adaptive_runs > 2  # several momenta: the legend goes under the axes, off the curves
    # one task per row: the figure stays readable at the width of a page
    fig, axes = plt.subplots(len(tasks), 1, figsize=(7.5, (5.2 if below else 3.8) * len(tasks)), squeeze=False)
    for ax, name in zip(axes[:, 0], tasks):
        mine = [r for r in runs if r["task"] == name]
        for kind, colour in colours.items():
            group = [r for r in mine if r["kind"] == kind]
            run, nans = best_run(group), sum(r["nan"] for r in group)
            several = kind == "adaptive" and len(group) > 1  # one run per momentum of --adaptive-momentum
            if group and run is None and not several:  # every run of the kind went NaN: say so in the legend
                _nan_entry(ax, colour, f"{kind}: NaN at step {group[0]['nan_step']}" if len(group) == 1
                           else f"{kind}: {nans}/{len(group)} NaN")
            # adaptive: every momentum (the first bold, a NaN one in the legend); a grid: its best run
            for index, shown in enumerate(group if several else [run] if run else []):
                setting = "" if kind in ("adaptive", "recipe") else f" lr {shown['lr']:g}"
                setting += f" d {shown['damping']:g}" if kind == "thor" else ""
                setting += f" momentum {shown['momentum']}" if several else ""
                if several and shown["nan"]:
                    _nan_entry(ax, colour, f"{kind}{setting}: NaN at step {shown['nan_step']}")
                    continue
                if not shown["curve"]:
                    continue
                label = f"{kind}{setting}: {shown['final']:.3f}" + (f" ({nans}/{len(group)} NaN)"
                                                                  if nans and not several else "")
                bold = index == 0
                ax.plot([c[1] for c in shown["curve"]], [c[2] for c in shown["curve"]], marker="." if bold else None,
                        color=colour, alpha=1.0 if bold else 0.45, linewidth=2.2 if bold and kind == "adaptive"
                        else 1.2, label=label)
        ax.axhline(TARGETS[name], linestyle="--", linewidth=1, color="grey")
        ax.set_title(f"{name}: held-out {TASKS[name]} (target {TARGETS[name]:g} dashed)", fontsize=9)
        ax.set_xlabel("training seconds (compilation excluded)")
        ax.set_ylabel(TASKS[name])
        ax.set_ylim(0.0, 1.02)
        if below:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
        else:
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(textwrap.fill(title, 95), fontsize=9)
    save_figure(fig, path)


def _title(settings: Dict) -> str:
    momenta = settings.get("adaptive_momentum", MOMENTUM)
    momenta = ", ".join(str(m) for m in momenta) if isinstance(momenta, list) else momenta
    return (f"adaptive THOR ({','.join(settings['adaptive'])}, momentum {momenta}) against the best run of each grid "
            f"(lrs {settings['lrs']}, dampings {settings['dampings']}); frequency {settings['frequency']}"
            + (f"; mean of {settings['seeds']} seeds" if settings.get("seeds", 1) > 1 else ""))


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the plot of a record of this benchmark beside its JSON (the curves; or, of a ``--cost`` or
    ``--lr-multiples`` record, that mode's plot); returns the PNG's path."""
    path = os.path.splitext(json_path)[0] + ".png"
    settings = record["settings"]
    if settings.get("cost"):
        from benchmarks._adaptive_cost import plot_cost

        plot_cost(path, record["tasks"], argparse.Namespace(**settings))
    elif settings.get("lr_multiples"):
        from benchmarks._adaptive_multiples import plot_multiples

        plot_multiples(path, record)
    else:
        tasks = [t for t in settings["tasks"] if any(r["task"] == t for r in record["runs"])]
        plot(path, record["runs"], tasks, _title(settings))
    return [path]


# ----------------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.replot:
        saved = read_json(args.out + ".json")
        with plotted_from(saved):
            plot_record(saved, args.out + ".json")
        return 0
    import mindspore as ms

    from ms_optim._bridge import prime_numpy_bridge

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    prime_numpy_bridge()
    if args.cost:
        from benchmarks._adaptive_cost import cost_main

        return cost_main(args, build_task)
    if args.lr_multiples:
        from benchmarks._adaptive_multiples import multiples_main

        return multiples_main(args, build_task, train_once)
    runs: List[Dict] = []
    wall = time.perf_counter()
    for name, seed in [(name, args.seed + i) for name in args.tasks for i in range(args.seeds)]:
        seeded = argparse.Namespace(**{**vars(args), "seed": seed})
        task = build_task(name, seeded)
        adaptive = ("adaptive" if "lr" in args.adaptive else args.adaptive_lr,
                    "adaptive" if "damping" in args.adaptive else args.adaptive_damping)
        plan = [("adaptive", *adaptive, mu) for mu in args.adaptive_momentum] + [("recipe", None, None, None)]
        plan += [("thor", lr, d, MOMENTUM) for lr in args.lrs for d in args.dampings]
        plan += [(kind, lr, None, MOMENTUM if kind == "momentum" else None) for kind in task["baselines"]
                 for lr in args.lrs]
        for kind, lr, damping, momentum in plan:
            try:
                run = dict(train_once(task, kind, lr, damping, momentum, seeded), seed=seed)
            except (TypeError, ValueError) as exc:
                if kind == "adaptive":
                    refused = f"this ms_optim's thor refuses --adaptive {','.join(args.adaptive)}: {exc}"
                    raise SystemExit(refused) from None
                raise
            runs.append(run)
            save(args, runs, time.perf_counter() - wall)  # after every run: an interrupted run keeps its part
            outcome = f"NaN at step {run['nan_step']}" if run["nan"] else f"final {run['final']:.3f}"
            print(f"{name:6s} seed {seed} {kind:8s} lr={fmt(lr, 'g'):6s} damping={str(damping):8s} "
                  f"momentum={fmt(run['momentum'], 'g'):8s} -> {outcome}, "
                  f"to target "
                  f"{fmt(run['seconds_to_target'], '.1f')} s, {run['wall_seconds']:.0f} s wall", flush=True)
    summary = save(args, runs, time.perf_counter() - wall, complete=True)
    print_table(summary["table"])
    print(f"goals: {summary['goals']['met']}; {time.perf_counter() - wall:.0f} s wall for {len(runs)} runs")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


def save(args, runs: List[Dict], wall: float, complete: bool = False) -> Dict:
    """Write the JSON and the PNG of the runs so far (``complete``: every planned run is in)."""
    tasks = [t for t in args.tasks if any(r["task"] == t for r in runs)]
    summary = summarise(runs, tasks)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    path = write_json(args.out + ".json", {"settings": settings, "complete": complete,
                                           "targets": {t: TARGETS[t] for t in args.tasks},
                                           "wall_seconds": wall, **summary, "runs": runs})
    if tasks:
        plot_record(read_json(path), path)
    return summary


if __name__ == "__main__":
    sys.exit(main())
