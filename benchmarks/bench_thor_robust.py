"""THOR robustness grid: does a plausible recipe train, or does it end in NaN? With and without ``kl_clip``.

For every cell of the grid learning rate x damping x frequency (default {0.01, 0.03, 0.1} x {0.01, 0.03,
0.1} x {10, 50}), every factor convention ``thor`` accepts (``factor_convention=``, detected from its
signature; a ``thor`` without the argument runs its one convention, labelled ``default``) and every
``kl_clip`` (default None and 1e-3), one short training run from the same initial weights, on:

* ``lenet``: LeNet5 on scikit-learn's digits (32x32, 20% held out), ``model_zoo/lenet``'s net and data
  loading, batch 32, ``--lenet-epochs`` epochs (44 steps each);
* ``resnet``: ``model_zoo/resnet``'s ``build_resnet("resnet18", width=--resnet-width, stem="cifar")`` on
  generated CIFAR-style data (3x16x16 images: one fixed random pattern per class, 10 classes, plus
  noise), batch 32, ``--resnet-steps`` steps.

The recipe is what a new user writes: constant learning rate and damping, momentum 0.9, no weight
decay, no gradient clipping, ``TrainOneStepCell``. A run is marked NaN as soon as its loss is not
finite (it stops there); its final test accuracy is measured on the held-out set otherwise.

Output: ``benchmarks/results/bench_thor_robust.json`` (every run, the NaN counts per model,
convention and kl_clip, the best configuration per model) and ``bench_thor_robust_<model>.png`` (per
model, heatmaps of final test accuracy, lr x damping per panel, a row per convention and a column per
kl_clip/frequency; NaN runs drawn as a red "NaN" cell). Runs are sequential in one process (run it niced); ``--combine``
merges the outputs of several such processes (e.g. one per model) into one JSON and heatmap.

    nice python benchmarks/bench_thor_robust.py                      # the whole grid
    nice python benchmarks/bench_thor_robust.py --models lenet --lrs 0.1 --dampings 0.01 --frequencies 10
"""
from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports").
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import RESULTS_DIR, float_list, read_json, save_figure, write_json  # noqa: E402

MODELS = ("lenet", "resnet")


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _kl_clips(text: str) -> List[Optional[float]]:
    return [None if x.strip().lower() == "none" else float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default="lenet,resnet", help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--lrs", type=float_list, default=[0.01, 0.03, 0.1], help="learning rates (comma-separated)")
    parser.add_argument("--dampings", type=float_list, default=[0.01, 0.03, 0.1], help="dampings (comma-separated)")
    parser.add_argument("--frequencies", type=_ints, default=[10, 50], help="THOR frequencies (comma-separated)")
    parser.add_argument("--kl-clips", type=_kl_clips, default=[None, 1e-3],
                        help="kl_clip values, 'none' for no clipping (comma-separated)")
    parser.add_argument("--conventions", default="all",
                        help="factor conventions to run (comma-separated), or 'all' for every one thor accepts")
    parser.add_argument("--lenet-epochs", type=int, default=2, help="LeNet5 epochs on digits (44 steps each)")
    parser.add_argument("--resnet-steps", type=int, default=40, help="ResNet training steps")
    parser.add_argument("--resnet-width", type=int, default=4, help="ResNet-18 width (64 for the published net)")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights, the data and the batch order")
    parser.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                        help="train nothing: merge the runs of these earlier outputs into one JSON and heatmap")
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "bench_thor_robust"),
                        help="output path without extension (.json and .png are written)")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown or not args.models:
        parser.error(f"--models must be a subset of {','.join(MODELS)}, got {unknown or 'nothing'}")
    if min(args.lrs + args.dampings, default=0) < 0 or not args.lrs or not args.dampings:
        parser.error("--lrs and --dampings need at least one value each, all >= 0")
    if not args.frequencies or min(args.frequencies) < 2:
        parser.error("--frequencies need at least one value, all >= 2")
    if any(k is not None and not k > 0 for k in args.kl_clips) or not args.kl_clips:
        parser.error("--kl-clips need at least one value; each 'none' or > 0")
    if args.lenet_epochs < 1 or args.resnet_steps < 1 or args.resnet_width < 1:
        parser.error("--lenet-epochs, --resnet-steps and --resnet-width must be >= 1")
    return args


def available_conventions() -> List[Optional[str]]:
    """The factor conventions ``thor`` accepts: [None] if it has no ``factor_convention`` argument."""
    from ms_optim import nn as ms_nn

    params = inspect.signature(ms_nn.thor).parameters
    if "factor_convention" not in params:
        return [None]
    return ["kfc", "gpu", "ascend"]


# ----------------------------------------------------------------------------------- data and nets
def lenet_task(seed: int, epochs: int):
    """(make_net, batches, x_test, y_test) for LeNet5 on digits (model_zoo/lenet's data and net)."""
    import numpy as np

    from model_zoo.lenet.dataset import load_digits_32
    from model_zoo.lenet.lenet import LeNet5

    x_tr, y_tr, x_te, y_te = load_digits_32(seed=0)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(epochs):
        order = rng.permutation(len(y_tr))
        for start in range(0, len(order) - 31, 32):
            idx = order[start:start + 32]
            batches.append((x_tr[idx], y_tr[idx]))
    return LeNet5, batches, x_te, y_te


def resnet_task(seed: int, steps: int, width: int):
    """(make_net, batches, x_test, y_test): model_zoo/resnet's ResNet-18 (cifar stem) on generated data."""
    import numpy as np

    from model_zoo.resnet.src.resnet import build_resnet

    rng = np.random.default_rng(1000 + seed)
    classes, size = 10, 16
    patterns = rng.standard_normal((classes, 3, size, size)).astype(np.float32)

    def sample(n):
        labels = rng.integers(0, classes, n).astype(np.int32)
        images = patterns[labels] + 1.5 * rng.standard_normal((n, 3, size, size)).astype(np.float32)
        return images.astype(np.float32), labels

    batches = [sample(32) for _ in range(steps)]
    x_te, y_te = sample(320)
    return (lambda: build_resnet("resnet18", class_num=classes, width=width, stem="cifar")), batches, x_te, y_te


# ----------------------------------------------------------------------------------- one run
def train_once(make_net, batches, x_test, y_test, lr: float, damping: float, frequency: int,
               kl_clip: Optional[float], convention: Optional[str], seed: int) -> Dict:
    """One run of THOR from the weights ``seed`` gives; returns accuracy, loss, NaN flag and seconds."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    from mindspore import nn as mnn

    from ms_optim import nn as ms_nn

    ms.set_seed(seed)
    net = make_net()
    extra = {} if convention is None else {"factor_convention": convention}
    opt = ms_nn.thor(net, Tensor(np.float32(lr)), Tensor(np.float32(damping)), 0.9, batch_size=len(batches[0][1]),
                     frequency=frequency, kl_clip=kl_clip, **extra)
    loss_fn = mnn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = mnn.TrainOneStepCell(mnn.WithLossCell(net, loss_fn), opt).set_train()
    start = time.perf_counter()
    loss, nan_step = float("nan"), None
    for step, (x, y) in enumerate(batches):
        loss = float(cell(Tensor(x), Tensor(y)).asnumpy())
        if not math.isfinite(loss):
            nan_step = step
            break
    finite = nan_step is None and all(np.all(np.isfinite(p.asnumpy())) for p in net.trainable_params())
    accuracy = float("nan")
    if finite:
        net.set_train(False)
        predictions = np.argmax(net(Tensor(x_test)).asnumpy(), axis=1)
        accuracy = float(np.mean(predictions == y_test))
    return {"final_loss": loss, "test_accuracy": accuracy, "nan": not finite, "nan_step": nan_step,
            "steps": len(batches) if nan_step is None else nan_step + 1, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------- summary and plot
def _label(value) -> str:
    return "none" if value is None else f"{value:g}"


def summarise(runs: List[Dict]) -> Dict:
    """NaN counts per model/convention/kl_clip and the best configuration per model and kl_clip."""
    nan_counts: Dict[str, Dict] = {}
    best: Dict[str, Dict] = {}
    for run in runs:
        key = f"{run['model']}/{run['convention'] or 'default'}/kl_clip={_label(run['kl_clip'])}"
        entry = nan_counts.setdefault(key, {"nan": 0, "runs": 0, "mean_accuracy_finite": []})
        entry["runs"] += 1
        entry["nan"] += int(run["nan"])
        if not run["nan"]:
            entry["mean_accuracy_finite"].append(run["test_accuracy"])
        best_key = f"{run['model']}/kl_clip={_label(run['kl_clip'])}"
        if not run["nan"] and run["test_accuracy"] > best.get(best_key, {}).get("test_accuracy", -1.0):
            best[best_key] = {k: run[k] for k in ("convention", "lr", "damping", "frequency", "kl_clip",
                                                  "test_accuracy", "final_loss")}
    for entry in nan_counts.values():
        accs = entry["mean_accuracy_finite"]
        entry["mean_accuracy_finite"] = sum(accs) / len(accs) if accs else None
    return {"nan_counts": nan_counts, "best": best}


def plot(stem: str, runs: List[Dict]) -> List[str]:
    """One heat-map figure per model, ``<stem>_<model>.png``: a row per convention, a column per (kl_clip,
    frequency), each panel the final test accuracy over the (lr, damping) grid, red where the run went NaN."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    for model in sorted({r["model"] for r in runs}):
        mine = [r for r in runs if r["model"] == model]
        lrs, dampings = _axis(mine, "lr"), _axis(mine, "damping")
        rows = sorted({r["convention"] or "default" for r in mine})
        cols = sorted({(_label(r["kl_clip"]), r["frequency"]) for r in mine})
        index = {(r["convention"] or "default", _label(r["kl_clip"]), r["frequency"], r["lr"], r["damping"]): r
                 for r in mine}
        fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.2 * len(cols) + 1.6, 2.0 * len(rows) + 0.9),
                                 squeeze=False, sharex=True, sharey=True)
        image = None
        for i, conv in enumerate(rows):
            for j, (kl, freq) in enumerate(cols):
                ax = axes[i][j]
                grid = np.full((len(lrs), len(dampings)), np.nan)
                for a, lr in enumerate(lrs):
                    for b, damping in enumerate(dampings):
                        run = index.get((conv, kl, freq, lr, damping))
                        if run is None:
                            continue
                        if run["nan"]:
                            ax.add_patch(plt.Rectangle((b - 0.5, a - 0.5), 1, 1, color="tab:red"))
                            ax.text(b, a, "NaN", ha="center", va="center", color="white", fontsize=9, weight="bold")
                        else:
                            grid[a, b] = run["test_accuracy"]
                            ax.text(b, a, f"{run['test_accuracy']:.2f}", ha="center", va="center", fontsize=9,
                                    color="white" if run["test_accuracy"] < 0.5 else "black")
                image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower")
                ax.set_xticks(range(len(dampings)), [f"{d:g}" for d in dampings], fontsize=8)
                ax.set_yticks(range(len(lrs)), [f"{x:g}" for x in lrs], fontsize=8)
                if i == 0:
                    ax.set_title(f"kl_clip {kl}\nfrequency {freq}", fontsize=9)
                if j == 0:
                    ax.set_ylabel(f"{conv}\nlr", fontsize=9)
                if i == len(rows) - 1:
                    ax.set_xlabel("damping", fontsize=9)
        if image is not None:
            fig.colorbar(image, ax=axes, shrink=0.7, label="final test accuracy")
        fig.suptitle(f"THOR on {model}: final test accuracy per convention (rows) and setting (columns); red: NaN",
                     fontsize=10)
        written.append(save_figure(fig, f"{stem}_{model}.png", tight=False))
    return written


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the heat-maps of a record of this benchmark beside its JSON; returns the PNGs' paths."""
    return plot(os.path.splitext(json_path)[0], record["runs"])


def _axis(runs: List[Dict], key: str) -> List:
    return sorted({run[key] for run in runs})


def combine(paths: Sequence[str], out: str) -> int:
    """Merge the runs of several outputs (e.g. one process per model) into one JSON and heatmap."""
    import json

    runs: List[Dict] = []
    parts = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            part = json.load(handle)
        runs += part["runs"]
        parts.append({"path": path, "command": part.get("command"), "wall_seconds": part.get("wall_seconds")})
    summary = summarise(runs)
    path = write_json(out + ".json", {"combined_from": parts,
                                      "wall_seconds": sum(p["wall_seconds"] or 0 for p in parts), **summary,
                                      "runs": runs})
    plot_record(read_json(path), path)
    print(f"wrote {out}.json and its plots ({len(runs)} runs)")
    return 0


# ----------------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    import mindspore as ms

    from ms_optim._bridge import prime_numpy_bridge

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    prime_numpy_bridge()
    accepted = available_conventions()
    if args.conventions == "all":
        conventions = accepted
    else:
        conventions = [c.strip() for c in args.conventions.split(",") if c.strip()]
        if accepted == [None] and conventions != ["default"]:
            print(f"thor has no factor_convention argument: running its one convention, not {conventions}")
            conventions = [None]
        elif accepted != [None] and any(c not in accepted for c in conventions):
            raise SystemExit(f"--conventions must be among {accepted}, got {conventions}")
    tasks = {"lenet": lambda: lenet_task(args.seed, args.lenet_epochs),
             "resnet": lambda: resnet_task(args.seed, args.resnet_steps, args.resnet_width)}
    runs: List[Dict] = []
    wall = time.perf_counter()
    for model in args.models:
        make_net, batches, x_test, y_test = tasks[model]()
        for convention in conventions:
            for kl_clip in args.kl_clips:
                for frequency in args.frequencies:
                    for lr in args.lrs:
                        for damping in args.dampings:
                            result = train_once(make_net, batches, x_test, y_test, lr, damping, frequency, kl_clip,
                                                convention, args.seed)
                            run = {"model": model, "convention": convention, "kl_clip": kl_clip, "lr": lr,
                                   "damping": damping, "frequency": frequency, **result}
                            runs.append(run)
                            outcome = (f"NaN at step {run['nan_step']}" if run["nan"]
                                       else f"acc {run['test_accuracy']:.3f}")
                            print(f"{model:6s} {convention or 'default':7s} kl_clip={_label(kl_clip):6s} "
                                  f"f={frequency:<3d} lr={lr:<5g} damping={damping:<5g} -> {outcome} "
                                  f"({run['seconds']:.1f}s)", flush=True)
    wall = time.perf_counter() - wall
    summary = summarise(runs)
    for key, entry in summary["nan_counts"].items():
        mean = entry["mean_accuracy_finite"]
        print(f"{key}: {entry['nan']}/{entry['runs']} NaN runs, mean accuracy of the finite ones "
              f"{'-' if mean is None else f'{mean:.3f}'}")
    for key, entry in summary["best"].items():
        print(f"best {key}: {entry}")
    print(f"wall time {wall:.0f}s for {len(runs)} runs")
    path = write_json(args.out + ".json", {"settings": {k: v for k, v in vars(args).items() if k != "out"},
                                           "conventions": conventions, "wall_seconds": wall, **summary,
                                           "runs": runs})
    plot_record(read_json(path), path)
    print(f"wrote {path} and its plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
