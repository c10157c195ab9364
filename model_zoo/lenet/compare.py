"""Compare optimizers on LeNet5 + digits: a table (final loss, test accuracy, time, time to 85%) and a plot.

Every optimizer trains the same LeNet5 (same seed, same batches) for ``--epochs`` epochs, or until
``--max-seconds`` of training, with its learning rate from ``tuned_lr.json`` (chosen by ``tune.py``,
the same grid search for every optimizer) unless ``--lr`` overrides it; THOR trains with train.py's
recipe (``THOR_DEFAULTS``, the one tune.py tuned its lr with) unless ``--kl-clip`` or
``--factor-convention`` overrides it; ``thor_adaptive`` makes THOR's call with ``learning_rate`` and
``damping`` ``"adaptive"`` (no learning rate from any grid). The held-out accuracy is measured every
``--eval-every`` steps (the clock is paused while measuring); progress shows while training (a bar on an
interactive terminal, one line per epoch otherwise). A row below ``--min-accuracy`` says why in the table's last
column. The plot shows test accuracy against training seconds.

    python model_zoo/lenet/compare.py --optimizers thor thor_adaptive momentum --epochs 4 --plot lenet_digits.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Dict, List, Optional

# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

from model_zoo.common.cli import OneLineArgumentParser, run_main  # noqa: E402
from model_zoo.lenet.train import (  # noqa: E402
    ADAPTIVE,
    ALL_OPTIMIZERS,
    EPOCHS,
    EVAL_EVERY,
    FACTOR_CONVENTIONS,
    LABELS,
    OPTIMIZERS,
    THOR_ADAPTIVE,
    THOR_DEFAULTS,
    THOR_KINDS,
    check_output_path,
    format_lr,
    parse_kl_clip,
    run,
    thor_recipe,
    tuned_lr,
)


def note(r: Dict, min_accuracy: float) -> str:
    """Why a row is below ``min_accuracy`` (empty when it is not), read from its accuracy history.

    The held-out accuracy of a run at a constant learning rate moves between evaluations; the note says
    which of these it is: the run got there and fell back (it swings), it was still climbing when the
    budget ended (too few steps at this lr), or it levelled off below (the lr's plateau).
    """
    if "error" in r:
        return f"failed: {r['error']}"
    if r["diverged"] is not None:
        return f"diverged at step {r['diverged']} (non-finite loss or state)"
    if r["test_accuracy"] >= min_accuracy:
        return ""
    at = "with adaptive steps" if r.get("lr") == ADAPTIVE else "at the tuned lr"  # recipe-free THOR: no lr
    if r["stopped_by_time_cap"]:
        return f"below {min_accuracy:.0%}: stopped by the time cap after {r['steps']} steps (machine busy?)"
    history = r.get("history") or []
    if not history:
        return f"below {min_accuracy:.0%} within the budget ({r['steps']} steps {at})"
    best = max(history, key=lambda h: h["test_accuracy"])
    recent = [h["test_accuracy"] for h in history[-5:]]
    if best["test_accuracy"] >= min_accuracy:
        return (f"reached {best['test_accuracy']:.1%} at step {best['step']}, ended at {r['test_accuracy']:.1%}: "
                f"accuracy swings between evaluations{'' if r.get('lr') == ADAPTIVE else ' at this constant lr'} "
                f"(last {len(recent)}: "
                f"{min(recent):.1%} to {max(recent):.1%})")
    first_half = max(h["test_accuracy"] for h in history[:max(1, len(history) // 2)])
    if any(h is best for h in history[-max(1, len(history) // 4):]):  # its best came in the last quarter
        return (f"still climbing when the budget ended ({r['steps']} steps; best {best['test_accuracy']:.1%} at "
                f"step {best['step']}, {first_half:.1%} in the first half): slow start {at}")
    return (f"levelled off below {min_accuracy:.0%} (best {best['test_accuracy']:.1%} at step {best['step']}, "
            f"{r['steps']} steps {at})")


def format_table(results: List[Dict], target: float, min_accuracy: float = 0.9) -> str:
    """Markdown table of the runs (failed and diverged runs shown as rows too)."""
    head = (f"| optimizer | lr | steps | final loss | test accuracy | train time (s) | time to {target:.0%} (s) "
            "| note |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        label = LABELS[r["optimizer"]]
        if "error" in r:
            lines.append(f"| {label} | | | | | | | {note(r, min_accuracy)} |")
            continue
        hit = r["seconds_to_target"]
        lines.append(f"| {label} | {format_lr(r['lr'])} | {r['steps']} | {r['final_loss']:.4f} "
                     f"| {r['test_accuracy']:.4f} | {r['train_seconds']:.1f} "
                     f"| {'not reached' if hit is None else f'{hit:.1f}'} | {note(r, min_accuracy)} |")
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
        ax.plot(xs, ys, marker=".", label=f"{LABELS[r['optimizer']]} (lr {format_lr(r['lr'])})")
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
    parser = OneLineArgumentParser(prog="compare.py", description=__doc__.splitlines()[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", choices=ALL_OPTIMIZERS, default=["thor", "momentum"],
                        help=f"{THOR_ADAPTIVE}: THOR with learning_rate and damping '{ADAPTIVE}'")
    parser.add_argument("--lr", nargs="*", default=[], metavar="NAME=LR",
                        help="learning-rate overrides, e.g. momentum=0.03 (default: tuned_lr.json)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--max-seconds", type=float, default=None, help="cap on each run's training time")
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument("--target", type=float, default=0.85,
                        help="accuracy of the 'time to' column and the plot's line (one every optimizer reaches)")
    parser.add_argument("--min-accuracy", type=float, default=0.9, help="rows below this say why in the table")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kl-clip", type=parse_kl_clip, default=THOR_DEFAULTS["kl_clip"], metavar="C|none",
                        help="THOR's KL clipping: a float > 0, or 'none' (train.py --help)")
    parser.add_argument("--factor-convention", choices=FACTOR_CONVENTIONS, default=THOR_DEFAULTS["factor_convention"],
                        help="THOR's factor normalisation (train.py --help)")
    parser.add_argument("--plot", default="lenet_digits.png", help="PNG of test accuracy vs seconds")
    parser.add_argument("--json", default=None, help="also write all results to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress while training")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.eval_every < 1:
        parser.error(f"--epochs and --eval-every must be >= 1, got {args.epochs} and {args.eval_every}")
    if args.max_seconds is not None and not args.max_seconds > 0:
        parser.error(f"--max-seconds must be > 0, got {args.max_seconds}")
    try:
        lrs = tuned_lr()
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot read the tuned learning rates ({exc!r}): run model_zoo/lenet/tune.py")
    for item in args.lr:
        name, _, value = item.partition("=")
        try:
            lrs[name] = float(value)
        except ValueError:
            lrs[name] = float("nan")
        if name not in OPTIMIZERS or not lrs[name] > 0 or lrs[name] == float("inf"):
            parser.error(f"--lr expects NAME=LR with NAME in {OPTIMIZERS} and a finite LR > 0, got {item!r}")
    check_output_path(parser, "--plot", args.plot)
    check_output_path(parser, "--json", args.json)

    recipe = thor_recipe(kl_clip=args.kl_clip, factor_convention=args.factor_convention)
    results = []
    for name in args.optimizers:
        lr = ADAPTIVE if name == THOR_ADAPTIVE else lrs[name]
        print(f"=== {LABELS[name]} (lr {format_lr(lr)}) ===", flush=True)
        try:
            results.append(run(name, epochs=args.epochs, lr=lr, seed=args.seed, eval_every=args.eval_every,
                               target=args.target, quiet=args.quiet, max_seconds=args.max_seconds,
                               label=LABELS[name], **(recipe if name in THOR_KINDS else {})))
        except Exception as exc:  # an extra row failing must not hide the others
            traceback.print_exc()
            results.append({"optimizer": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"})
    print()
    print(format_table(results, args.target, args.min_accuracy))
    plot(results, args.plot, args.target)
    print(f"\nplot of test accuracy vs seconds: {os.path.abspath(args.plot)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 1 if all("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "compare.py"))
