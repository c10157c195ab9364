"""THOR benchmark: step time against MindSpore's Momentum, and time-to-accuracy on digits.

Part 1, step time (GRAPH_MODE, CPU; ResNet-18 at 32x32 batch 32 and LeNet5 at 32x32 batch 32).
ResNet-18 is model_zoo/resnet's, 10 classes, with its standard (ImageNet) stem by default; ``--stem
cifar`` (3x3/1 stem, no pooling: 16x more convolution work) takes about 100 s per step on a 2-core
CPU with MindSpore 2.10's CPU convolutions, so it is for bigger machines.
Both nets start from the same weights; the Momentum net keeps MindSpore's plain layers and
``mindspore.nn.Momentum``, the THOR net is converted by ``ms_optim.nn.thor``. Every round times, in a
rotated order, one call of each of these (medians over rounds, so machine noise hits all alike):

* ``momentum``     -- a full training step with Momentum (the baseline);
* ``thor_step``    -- a full THOR training step at a THOR step (factors collected, inverses recomputed);
* ``non_thor``     -- a full THOR training step between THOR steps (stored inverses reused);
* ``collect_only`` -- a THOR training step that collects the factors but does not invert them;
* ``invert_only``  -- a THOR training step that inverts the stored factors but collects none.

The THOR/non-THOR state is set before each call (``global_step`` 0 or 1 and the layers' ``thor_flag``),
outside the timed region. Reported: ``non_thor / momentum`` (target <= 1.15), the amortised step at
frequency 100, ``(thor_step + 99 * non_thor) / 100 / momentum`` (target <= 1.3), and the THOR step's
split into factor collection (``collect_only - non_thor``) and inversion (``invert_only - non_thor``).

Part 2, time to accuracy (LeNet5 on scikit-learn digits, 32x32, 20% held out; ``model_zoo/lenet``):
wall time of training until the held-out accuracy first reaches 97% (measured every few steps with
the clock paused), the best THOR run (model_zoo/lenet's recipe at lr {0.03, 0.1, 0.3}) against the best
Momentum run (lr {0.01, 0.03, 0.1, 0.3}); target THOR <= 0.7x. Plot: test accuracy against training seconds.

    python benchmarks/bench_thor.py            # full run (about 10-15 minutes on 2 cores)
    python benchmarks/bench_thor.py --quick    # smoke run (LeNet only, few repeats, short runs)
Writes ``benchmarks/results/bench_thor[_quick].json`` and ``..._steps.png`` / ``..._tta.png``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

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
    interleaved_medians,
    read_json,
    save_figure,
    set_thor_state,
    write_json,
)  # noqa: E402

TARGETS = {"non_thor_vs_momentum": 1.15, "amortised_f100_vs_momentum": 1.3, "tta_thor_vs_best_momentum": 0.7}
MOMENTUM_LRS = (0.01, 0.03, 0.1, 0.3)
THOR_LRS = (0.03, 0.1, 0.3)  # tune.py's THOR grid without 1.0 (which never reaches the target)


# ----------------------------------------------------------------------------------------- nets
def _build_net(name: str, stem: str):
    if name == "lenet":
        from model_zoo.lenet.lenet import LeNet5

        return LeNet5(), (1, 32, 32)
    from model_zoo.resnet.src.resnet import resnet18

    return resnet18(class_num=10, stem=stem), (3, 32, 32)


def _copy_weights(src, dst) -> None:
    from mindspore import Tensor

    values = {p.name: p.asnumpy() for p in src.get_parameters()}
    for p in dst.get_parameters():
        if p.name in values:
            p.set_data(Tensor(values[p.name]))


def step_benchmark(net_name: str, batch: int, repeats: int, warmup: int, stem: str) -> Dict:
    """Time Momentum and THOR steps (and the THOR step's parts) on one net; return medians and ratios."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from ms_optim.nn import thor

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    plain, shape = _build_net(net_name, stem)
    ms.set_seed(0)
    net, _ = _build_net(net_name, stem)
    _copy_weights(plain, net)
    rng = np.random.default_rng(0)
    x = Tensor(rng.normal(size=(batch,) + shape).astype(np.float32))
    y = Tensor(rng.integers(0, 10, size=(batch,)).astype(np.int32))

    def loss_fn():
        return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    mom = nn.Momentum(plain.trainable_params(), 0.01, 0.9)
    mom_step = nn.TrainOneStepCell(nn.WithLossCell(plain, loss_fn()), mom)
    steps = 1 << 20
    opt = thor(net, Tensor(np.full((steps,), 0.01, np.float32)), Tensor(np.full((steps,), 0.03, np.float32)), 0.9,
               weight_decay=1e-4, batch_size=batch, frequency=100)
    loss_net = nn.WithLossCell(net, loss_fn())
    thor_step = nn.TrainOneStepCell(loss_net, opt)

    def state(step: int, flags: bool):
        return lambda: set_thor_state(opt, step, flags)

    mom_step.set_train(True)
    thor_step.set_train(True)
    call_mom = lambda: mom_step(x, y)  # noqa: E731
    call_thor = lambda: thor_step(x, y)  # noqa: E731
    # one compiled THOR training cell; the step's state selects what it does
    candidates = {"momentum": call_mom, "thor_step": call_thor, "non_thor": call_thor,
                  "collect_only": call_thor, "invert_only": call_thor}
    prepare = {"thor_step": state(0, True),       # factors collected and inverted (a THOR step)
               "non_thor": state(1, False),       # stored inverses reused
               "collect_only": state(1, True),    # factors collected, no inversion
               "invert_only": state(0, False)}    # inversion of the stored factors, no collection
    timings = interleaved_medians(candidates, repeats=repeats, warmup=warmup, prepare=prepare)
    med = {k: v["median_ms"] for k, v in timings.items()}
    amortised = (med["thor_step"] + 99 * med["non_thor"]) / 100
    collection = med["collect_only"] - med["non_thor"]
    inversion = med["invert_only"] - med["non_thor"]
    return {
        "net": net_name, "batch": batch, "input": list(shape), "stem": stem if net_name == "resnet18" else None,
        "thor_layers": opt.num_layers, "repeats": repeats, "timings_ms": timings,
        "non_thor_vs_momentum": med["non_thor"] / med["momentum"],
        "amortised_f100_ms": amortised,
        "amortised_f100_vs_momentum": amortised / med["momentum"],
        "thor_step_vs_momentum": med["thor_step"] / med["momentum"],
        "thor_step_split_ms": {
            "factor_collection": collection,
            "inversion": inversion,
            "non_thor_step": med["non_thor"],
            "unexplained": med["thor_step"] - med["non_thor"] - collection - inversion,
        },
    }


# ----------------------------------------------------------------------------------- time to accuracy
def tta_benchmark(epochs: int, max_seconds: float, eval_every: int, target: float, lrs, seed: int,
                  thor_epochs: int = 6, thor_lrs=THOR_LRS) -> Dict:
    """THOR at each of ``thor_lrs`` vs Momentum at each of ``lrs`` on LeNet5 + digits, the best run of
    each compared; each run stops at ``target`` or the caps.

    THOR uses model_zoo/lenet's recipe (lr decayed polynomially (power 2) to 0 over ``thor_epochs``,
    damping 0.01, frequency 20, per-tensor clipping); Momentum (momentum 0.9) a constant lr, up to
    ``epochs`` epochs. Both get a grid: a single tuned lr can miss the target on one seed (tune.py
    picks the best validation accuracy after 3 epochs, not the fastest to 97%)."""
    from model_zoo.lenet.train import run

    runs = []
    plan = [("thor", lr) for lr in thor_lrs] + [("momentum", lr) for lr in lrs]
    for name, lr in plan:
        result = run(name, epochs=thor_epochs if name == "thor" else epochs, lr=lr, seed=seed,
                     eval_every=eval_every, target=target,
                     stop_at_target=True, quiet=True, max_seconds=max_seconds)
        hit = result["seconds_to_target"]
        print(f"  {name:9s} lr {result['lr']:<5g} -> {'not reached' if hit is None else f'{hit:.1f}s'} "
              f"(acc {result['test_accuracy']:.3f} after {result['steps']} steps, {result['train_seconds']:.1f}s)",
              flush=True)
        runs.append(result)
    def fastest(name):
        reached = [r for r in runs if r["optimizer"] == name and r["seconds_to_target"] is not None]
        return min(reached, key=lambda r: r["seconds_to_target"]) if reached else None

    thor_run, best = fastest("thor"), fastest("momentum")
    ratio = None
    if best is not None and thor_run is not None:
        ratio = thor_run["seconds_to_target"] / best["seconds_to_target"]
    # The first measurement interval holds the graph compilation (THOR's graph is larger): also give
    # the time from the first measurement on, and the steps, which no compiler or load changes.
    def after_first(r):
        return None if r["seconds_to_target"] is None else r["seconds_to_target"] - r["history"][0]["seconds"]

    def steps_to(r):
        return next((h["step"] for h in r["history"] if h["test_accuracy"] >= target), None)

    extra = {}
    if best is not None and thor_run is not None:
        extra = {"tta_after_first_measurement_ratio": after_first(thor_run) / after_first(best),
                 "steps_to_target_ratio": steps_to(thor_run) / steps_to(best)}
    return {**extra, "target": target, "epochs_cap": epochs, "thor_epochs": thor_epochs, "seconds_cap": max_seconds,
            "eval_every": eval_every,
            "seed": seed, "thor_lrs": list(thor_lrs), "momentum_lrs": list(lrs),
            "best_thor_lr": thor_run["lr"] if thor_run else None,
            "thor_seconds": thor_run["seconds_to_target"] if thor_run else None,
            "best_momentum_lr": best["lr"] if best else None,
            "best_momentum_seconds": best["seconds_to_target"] if best else None,
            "tta_thor_vs_best_momentum": ratio, "runs": runs}


def tta_plot(tta: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in tta["runs"]:
        xs = [h["seconds"] for h in r["history"]]
        ys = [h["test_accuracy"] for h in r["history"]]
        style = {"linewidth": 2.4, "color": "black"} if r["optimizer"] == "thor" else {"linewidth": 1.2}
        ax.plot(xs, ys, marker=".", label=f"{'THOR' if r['optimizer'] == 'thor' else 'Momentum'} lr {r['lr']:g}",
                **style)
    ax.axhline(tta["target"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("LeNet5 on digits (32x32), CPU: time to accuracy", fontsize=10)
    save_figure(fig, path)


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the step bars (``<stem>_steps.png``) and the accuracy curves (``<stem>_tta.png``) of a record of
    this benchmark beside its JSON; returns the PNGs' paths."""
    stem, written = os.path.splitext(json_path)[0], []
    if record.get("steps"):
        labels, values = [], []
        for res in record["steps"]:
            t = res["timings_ms"]
            for key, label in (("momentum", "Momentum"), ("non_thor", "THOR non-THOR step"),
                               ("thor_step", "THOR step")):
                labels.append(f"{res['net']}: {label}")
                values.append(t[key]["median_ms"])
            labels.append(f"{res['net']}: THOR amortised f=100")
            values.append(res["amortised_f100_ms"])
        written.append(bar_plot(stem + "_steps.png", labels, values, "ms per step (median)",
                                "THOR vs MindSpore Momentum, CPU, GRAPH_MODE, batch 32"))
    if record.get("time_to_accuracy"):
        tta_plot(record["time_to_accuracy"], stem + "_tta.png")
        written.append(stem + "_tta.png")
    return written


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: LeNet only, few repeats, short runs")
    parser.add_argument("--nets", nargs="+", choices=("resnet18", "lenet"), default=None,
                        help="nets for the step benchmark (default resnet18 lenet; lenet with --quick)")
    parser.add_argument("--stem", choices=("cifar", "imagenet"), default="imagenet",
                        help="ResNet-18 stem at 32x32: cifar (3x3/1 conv) or imagenet (7x7/2 + max pool)")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds (default 15, 3 with --quick)")
    parser.add_argument("--skip-steps", action="store_true", help="skip the step-time part")
    parser.add_argument("--skip-tta", action="store_true", help="skip the time-to-accuracy part")
    parser.add_argument("--tta-epochs", type=int, default=None, help="epoch cap per run (default 20, 2 quick)")
    parser.add_argument("--tta-seconds", type=float, default=None, help="time cap per run (default 150, 20 quick)")
    parser.add_argument("--eval-every", type=int, default=11, help="steps between accuracy measurements")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=RESULTS_DIR, help="folder for the JSON and PNG files")
    args = parser.parse_args(argv)
    nets = args.nets or (["lenet"] if args.quick else ["resnet18", "lenet"])
    repeats = args.repeats or (3 if args.quick else 15)
    suffix = "_quick" if args.quick else ""
    payload: Dict = {"targets": TARGETS, "quick": args.quick}

    if not args.skip_steps:
        payload["steps"] = []
        for name in nets:
            print(f"step time: {name} (batch 32, GRAPH_MODE, {repeats} interleaved rounds)", flush=True)
            res = step_benchmark(name, 32, repeats, 1 if args.quick else 2, args.stem)
            t = res["timings_ms"]
            print(f"  momentum {t['momentum']['median_ms']:.1f} ms | "
                  f"THOR non-THOR step {t['non_thor']['median_ms']:.1f} ms "
                  f"({res['non_thor_vs_momentum']:.2f}x, target <= 1.15) | "
                  f"THOR step {t['thor_step']['median_ms']:.1f} ms "
                  f"| amortised f=100 {res['amortised_f100_ms']:.1f} ms ({res['amortised_f100_vs_momentum']:.2f}x, "
                  f"target <= 1.3)", flush=True)
            split = res["thor_step_split_ms"]
            print(f"  THOR step = non-THOR step {split['non_thor_step']:.1f} ms + factor collection "
                  f"{split['factor_collection']:.1f} ms + inversion {split['inversion']:.1f} ms "
                  f"{split['unexplained']:+.1f} ms unexplained (the parts overlap)", flush=True)
            payload["steps"].append(res)

    if not args.skip_tta:
        epochs = args.tta_epochs or (2 if args.quick else 20)
        seconds = args.tta_seconds or (20.0 if args.quick else 150.0)
        lrs = (0.03,) if args.quick else MOMENTUM_LRS
        thor_lrs = (0.1,) if args.quick else THOR_LRS
        print(f"time to 97%: LeNet5 on digits, THOR lr {list(thor_lrs)} vs Momentum lr {list(lrs)} "
              f"(caps: {epochs} epochs, {seconds:g}s)",
              flush=True)
        tta = tta_benchmark(epochs, seconds, args.eval_every, 0.97, lrs, args.seed, min(6, epochs), thor_lrs)
        payload["time_to_accuracy"] = tta
        ratio = tta["tta_thor_vs_best_momentum"]
        print(f"  best THOR (lr {tta['best_thor_lr']}) {tta['thor_seconds']}s vs best Momentum "
              f"(lr {tta['best_momentum_lr']}) {tta['best_momentum_seconds']}s -> ratio "
              f"{'n/a' if ratio is None else f'{ratio:.2f}'} (target <= 0.7)")

    path = write_json(os.path.join(args.out, f"bench_thor{suffix}.json"), payload)
    plot_record(read_json(path), path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
