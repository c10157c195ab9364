"""Compare optimizers on LeNet5 + digits: a table (final loss, test accuracy, time, time to 97%) and a plot.

Every optimizer trains the same LeNet5 (same seed, same batches) for ``--epochs`` epochs, or until
``--max-seconds`` of training, and the held-out accuracy is measured every ``--eval-every`` steps
(the clock is paused while measuring). The plot shows test accuracy against training seconds.

    python model_zoo/lenet/compare.py --optimizers thor momentum --epochs 4 --plot lenet_digits.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from model_zoo.lenet.train import DEFAULT_LR, OPTIMIZERS, run  # noqa: E402

LABELS = {"thor": "THOR", "momentum": "Momentum", "lamb": "Lamb", "lars": "LARS(Momentum)", "asgd": "ASGD"}


def format_table(results: List[Dict], target: float) -> str:
    """Markdown table of the runs (errors shown as a row too)."""
    head = f"| optimizer | lr | final loss | test accuracy | train time (s) | time to {target:.0%} (s) |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {LABELS[r['optimizer']]} | | failed: {r['error']} | | | |")
            continue
        hit = r["seconds_to_target"]
        lines.append(f"| {LABELS[r['optimizer']]} | {r['lr']:g} | {r['final_loss']:.4f} | {r['test_accuracy']:.4f} | "
                     f"{r['train_seconds']:.1f} | {'not reached' if hit is None else f'{hit:.1f}'} |")
    return "\n".join(lines)


def plot(results: List[Dict], path: str, target: float) -> None:
    """Test accuracy against training seconds, one line per optimizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        if "error" in r or not r["history"]:
            continue
        xs = [h["seconds"] for h in r["history"]]
        ys = [h["test_accuracy"] for h in r["history"]]
        ax.plot(xs, ys, marker=".", label=f"{LABELS[r['optimizer']]} (lr {r['lr']:g})")
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"{target:.0%}")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel("held-out test accuracy")
    ax.set_title("LeNet5 on scikit-learn digits (32x32), CPU")
    ax.set_ylim(0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=["thor", "momentum"])
    parser.add_argument("--lr", nargs="*", default=[], metavar="NAME=LR",
                        help="learning-rate overrides, e.g. momentum=0.03 (defaults: " +
                             ", ".join(f"{k}={v}" for k, v in DEFAULT_LR.items()) + ")")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=None, help="cap on each run's training time")
    parser.add_argument("--eval-every", type=int, default=11)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", default="lenet_digits.png", help="PNG of test accuracy vs seconds")
    parser.add_argument("--json", default=None, help="also write all results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no per-evaluation progress lines")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.lr:
        name, _, value = item.partition("=")
        if name not in OPTIMIZERS or not value:
            parser.error(f"--lr expects NAME=LR with NAME in {OPTIMIZERS}, got {item!r}")
        overrides[name] = float(value)

    results = []
    for name in args.optimizers:
        print(f"=== {LABELS[name]} ===", flush=True)
        try:
            results.append(run(name, epochs=args.epochs, lr=overrides.get(name), seed=args.seed,
                               eval_every=args.eval_every, target=args.target, quiet=args.quiet,
                               max_seconds=args.max_seconds))
        except Exception as exc:  # an extra row failing must not hide the others
            traceback.print_exc()
            results.append({"optimizer": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"})
    print()
    print(format_table(results, args.target))
    plot(results, args.plot, args.target)
    print(f"\nplot of test accuracy vs seconds: {os.path.abspath(args.plot)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 1 if all("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
