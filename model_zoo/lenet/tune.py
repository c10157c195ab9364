"""Choose every optimizer's learning rate the same way: a small grid search on a validation split.

Protocol (one rule for all five optimizers):
  * data: the quickstart's training split (80% of scikit-learn's digits, split seed 0), split again
    80/20 (stratified, seed 0) into a tuning-train set and a validation set; the quickstart's test
    set is never looked at;
  * budget: 3 epochs at batch 32, seed 1 (shorter than the quickstart's 5 epochs, to keep the search
    cheap: an lr that learns within 3 epochs learns within 5), the recipe of ``train.py``
    (``THOR_DEFAULTS``: THOR with its polynomial lr decay over the run, damping 0.01, frequency 20,
    per-tensor clipping, no KL clipping, factor convention "auto"; recorded as ``recipe`` in the JSON);
  * grid: half-decade steps (1, 3, 10, 30, ... x 10^k); each optimizer family gets a window of three
    points of it around its natural scale: Momentum around 0.03; ASGD around 0.3 (plain SGD steps
    without momentum, so about 1/(1-0.9) = 10x Momentum's); Lamb around 0.01 (a trust-ratio step of
    size lr*||w||); THOR around 0.1; LARS around 10 (LARS multiplies lr by coefficient*||w||/||g||
    with coefficient 1e-3, so its useful lr is about two decades above Momentum's);
  * choice: the highest validation accuracy at the end of the budget (a diverged run scores 0; ties
    go to the lower final training loss). When the best is on an edge of the window, the next ladder
    point beyond it is run too (at most twice per optimizer); a choice still on the edge is flagged.
    Runs already recorded in the output JSON with the same budget and recipe are reused, not repeated.

The result goes to ``tuned_lr.json`` (read by ``train.py``, ``compare.py`` and the quickstart);
``--show`` prints the recorded table without training. CPU heavy (15 runs and the extensions): run it once, niced.

    nice -n 10 python model_zoo/lenet/tune.py
    python model_zoo/lenet/tune.py --show
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

from model_zoo.lenet.train import EPOCHS, LABELS, OPTIMIZERS, TUNED_LR_FILE, run, thor_recipe  # noqa: E402

TUNE_EPOCHS = 3
LADDER = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0]  # half-decade steps
MAX_EXTENSIONS = 2
GRID: Dict[str, List[float]] = {
    "thor": [0.03, 0.1, 0.3],
    "momentum": [0.01, 0.03, 0.1],
    "lamb": [0.003, 0.01, 0.03],
    "lars": [3.0, 10.0, 30.0],
    "asgd": [0.1, 0.3, 1.0],
}


def recipe(name: str) -> Optional[Dict]:
    """The settings besides lr that ``name`` is tuned with: train.py's THOR recipe for THOR, None otherwise."""
    return thor_recipe() if name == "thor" else None


def measure(name: str, lr: float, epochs: int, data) -> Dict:
    """One tuning run: validation accuracy and final training loss after ``epochs`` epochs."""
    res = run(name, epochs=epochs, lr=lr, data=data, quiet=True, **(recipe(name) or {}))
    print(f"[tune] {LABELS[name]} lr {lr:g}: validation accuracy {res['test_accuracy']:.4f}, "
          f"final loss {res['final_loss']:.4f}" + (" (diverged)" if res["diverged"] is not None else ""), flush=True)
    return {"lr": lr, "val_accuracy": res["test_accuracy"], "final_loss": res["final_loss"],
            "diverged": res["diverged"], "train_seconds": round(res["train_seconds"], 1)}


def next_outward(best: float, grid: List[float]) -> Optional[float]:
    """The ladder point beyond ``best`` when it is an edge of ``grid`` (None when it is inside)."""
    i = LADDER.index(best)
    if best == grid[-1] and i + 1 < len(LADDER):
        return LADDER[i + 1]
    if best == grid[0] and i > 0:
        return LADDER[i - 1]
    return None


def validation_split(split_seed: int = 0):
    """(x_fit, y_fit, x_val, y_val): the quickstart's training split, split again 80/20 (stratified)."""
    from sklearn.model_selection import train_test_split

    from model_zoo.lenet.dataset import load_digits_32

    x_tr, y_tr, _, _ = load_digits_32(seed=split_seed)
    x_fit, x_val, y_fit, y_val = train_test_split(x_tr, y_tr, test_size=0.2, random_state=0, stratify=y_tr)
    return x_fit, y_fit, x_val, y_val


def choose(rows: List[Dict]) -> Dict:
    """The row with the highest validation accuracy (diverged: 0), ties to the lower final loss."""
    def key(r):
        acc = 0.0 if r["diverged"] is not None else r["val_accuracy"]
        loss = r["final_loss"] if r["diverged"] is None else float("inf")
        return (-acc, loss)

    return min(rows, key=key)


def table(record: Dict) -> str:
    """Markdown table: validation accuracy per grid point, the choice in bold."""
    lines = ["| optimizer | lr grid: validation accuracy after the budget | chosen lr |", "|---|---|---|"]
    for name, rows in record["results"].items():
        cells = []
        for r in rows:
            text = "diverged" if r["diverged"] is not None else f"{r['val_accuracy']:.3f}"
            cell = f"{r['lr']:g}: {text}"
            cells.append(f"**{cell}**" if r["lr"] == record["lr"][name] else cell)
        edge = " (edge of the grid)" if name in record.get("at_edge", []) else ""
        lines.append(f"| {LABELS[name]} | {', '.join(cells)} | {record['lr'][name]:g}{edge} |")
    return "\n".join(lines)


def save(record: Dict, path: str, epochs: int) -> None:
    """Write the record (protocol, grid, chosen lr, edge flags, every run) atomically."""
    record["protocol"] = ("grid search on a validation split of the training set (tune.py docstring); "
                          f"budget {epochs} epochs at batch 32, seed 1; highest validation accuracy wins")
    record["grid"] = {n: [r["lr"] for r in rows] for n, rows in record["results"].items()}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({k: record[k] for k in ("protocol", "epochs", "recipe", "grid", "lr", "at_edge", "results")}, f,
                  indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS),
                        help="optimizers to tune (others keep their recorded lr); default: all")
    parser.add_argument("--epochs", type=int, default=TUNE_EPOCHS,
                        help=f"budget per run (default {TUNE_EPOCHS}; the quickstart trains {EPOCHS})")
    parser.add_argument("--output", default=TUNED_LR_FILE, help="JSON to write (default: tuned_lr.json)")
    parser.add_argument("--show", action="store_true", help="print the recorded table and exit (no training)")
    args = parser.parse_args(argv)
    if args.show:
        with open(args.output, encoding="utf-8") as f:
            print(table(json.load(f)))
        return 0
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    record = {"lr": {}, "results": {}, "at_edge": [], "recipe": {}}
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as f:
            record.update(json.load(f))
    data = validation_split()
    started = time.perf_counter()
    for name in args.optimizers:
        same = record.get("epochs") == args.epochs and record["recipe"].get(name) == recipe(name)
        known = {r["lr"]: r for r in record["results"].get(name, [])} if same else {}
        rows: List[Dict] = []
        grid = list(GRID[name])
        extensions = 0
        while True:
            for lr in grid:
                if lr not in {r["lr"] for r in rows}:
                    rows.append(known.get(lr) or measure(name, lr, args.epochs, data))
            rows.sort(key=lambda r: r["lr"])
            best = choose(rows)
            outward = next_outward(best["lr"], grid)
            if outward is None or extensions == MAX_EXTENSIONS:
                break
            grid = sorted(grid + [outward])  # the best is on an edge: one more ladder point beyond it
            extensions += 1
        record["results"][name] = rows
        record["lr"][name] = best["lr"]
        record["at_edge"] = [n for n in record["at_edge"] if n != name]
        if best["lr"] in (grid[0], grid[-1]):
            record["at_edge"].append(name)
        record["epochs"] = args.epochs
        record["recipe"][name] = recipe(name)
        save(record, args.output, args.epochs)  # after each optimizer: an interrupted run keeps its results
    print(table(record))
    print(f"\n[tune] wrote {args.output} ({time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
