"""Whether a learning rate too large can blow up ``damping="adaptive"``: ``bench_thor_adaptive.py --lr-multiples``.

Per task (``_adaptive_tasks``; every run from the same initial weights, on the same batches): THOR over the grid
``--lrs`` x ``--dampings`` and Momentum over ``--lrs`` (constant, momentum 0.9), as in the main benchmark; then,
at the best grid THOR's learning rate ``lr*`` (damping ``d*``) times each of ``--lr-multiples``:

* ``damping``: ``thor(net, lr* m, "adaptive", 0.9)``, every other setting at its default: the user's learning
  rate, the damping THOR's own (a step that failed is taken back and the damping rises);
* ``thor``: the same learning rate with the fixed damping ``d*`` (for the multiples above 1), what the rule
  saves a user from.

Reported per task and multiple: the final held-out figure, whether the run went non-finite (it stops at the
first non-finite loss), the steps taken back, the median step; the goals, met or not: no ``damping`` run
non-finite; at 3x within 2 points (0.02) of the best grid THOR; at 10x above the best grid Momentum; and the
``damping`` step's cost beside the best grid THOR's (median ms/step of the same run, its extra forward pass
included).

Output: ``--out``'s ``.json`` (every run with its curve, the table, the goals) and ``.png`` (per task, the final
figure against the multiple: ``damping="adaptive"`` and the fixed damping, a cross where a run went non-finite;
the best grid THOR and Momentum as lines).
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Callable, Dict, List, Optional, Sequence

#: "within 2 points" of a figure in [0, 1]
POINTS = 0.02


def _best(runs: List[Dict]) -> Optional[Dict]:
    finite = [r for r in runs if not r["nan"]]
    return max(finite, key=lambda r: r["final"]) if finite else None


def summarise_multiples(runs: List[Dict], tasks: Sequence[str], multiples: Sequence[float]) -> Dict:
    """The table (one row per task and multiple) and the goals (module docstring)."""
    table, goals = [], {"never_nan": True, "within_2_points_at_3x": {}, "above_momentum_at_10x": {},
                        "step_cost_vs_thor": {}}
    for name in tasks:
        mine = [r for r in runs if r["task"] == name]
        grid = [r for r in mine if r["kind"] == "thor" and r.get("multiple") is None]
        thor, momentum = _best(grid), _best([r for r in mine if r["kind"] == "momentum"])
        for multiple in multiples:
            run = next((r for r in mine if r["kind"] == "damping" and r["multiple"] == multiple), None)
            if run is None:
                continue
            fixed = next((r for r in mine if r["kind"] == "thor" and r.get("multiple") == multiple), None)
            table.append({"task": name, "multiple": multiple, "lr": run["lr"], "final": run["final"],
                          "nan": run["nan"], "rejected_steps": run.get("rejected_steps"),
                          "median_step_ms": run["median_step_ms"], "steps": run["steps"],
                          "fixed_damping_final": None if fixed is None else fixed["final"],
                          "fixed_damping_nan": None if fixed is None else fixed["nan"],
                          "best_thor": None if thor is None else thor["final"],
                          "best_momentum": None if momentum is None else momentum["final"]})
            goals["never_nan"] &= not run["nan"]
            if multiple == 3 and thor is not None:
                goals["within_2_points_at_3x"][name] = bool(not run["nan"] and run["final"] >= thor["final"] - POINTS)
            if multiple == 10 and momentum is not None:
                goals["above_momentum_at_10x"][name] = bool(not run["nan"] and run["final"] > momentum["final"])
            if multiple == 1 and thor is not None:
                goals["step_cost_vs_thor"][name] = run["median_step_ms"] / thor["median_step_ms"]
    goals["met"] = {"never_nan": goals["never_nan"],
                    "within_2_points_at_3x": all(goals["within_2_points_at_3x"].values()),
                    "above_momentum_at_10x": all(goals["above_momentum_at_10x"].values())}
    return {"table": table, "goals": goals}


def print_multiples(table: List[Dict]) -> None:
    from benchmarks._adaptive_summary import fmt

    print(f"{'task':7s} {'x lr*':>5s} {'lr':>7s} {'final':>6s} {'non-finite':>10s} {'taken back':>10s} "
          f"{'ms/step':>8s} {'fixed d*':>9s} {'best THOR':>9s} {'best Mom.':>9s}")
    for row in table:
        fixed = "NaN" if row["fixed_damping_nan"] else fmt(row["fixed_damping_final"])
        print(f"{row['task']:7s} {row['multiple']:5g} {row['lr']:7.3g} {fmt(row['final']):>6s} "
              f"{str(row['nan']):>10s} {fmt(row['rejected_steps'], 'd'):>10s} {row['median_step_ms']:8.1f} "
              f"{fixed:>9s} {fmt(row['best_thor']):>9s} {fmt(row['best_momentum']):>9s}")


def plot_multiples(path: str, record: Dict) -> None:
    """Per task: the final figure against the multiple (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks._adaptive_tasks import TASKS
    from benchmarks._common import save_figure

    table = record["table"]
    tasks = [t for t in record["settings"]["tasks"] if any(r["task"] == t for r in table)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 3.6), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        rows = [r for r in table if r["task"] == name]
        xs = [r["multiple"] for r in rows]
        ax.plot(xs, [math.nan if r["nan"] else r["final"] for r in rows], marker="o", color="#C44E52",
                label='damping="adaptive"')
        for x, r in zip(xs, rows):
            if r["nan"]:
                ax.plot([x], [0.0], marker="x", color="#C44E52", linestyle="none")
        fixed = [(r["multiple"], r["fixed_damping_final"], r["fixed_damping_nan"]) for r in rows
                 if r["fixed_damping_nan"] is not None]
        finite = [f for f in fixed if not f[2]]
        if finite:
            ax.plot([f[0] for f in finite], [f[1] for f in finite], marker="s", color="#DD8452", linestyle="none",
                    label="fixed damping d*")
        nans = [f[0] for f in fixed if f[2]]
        if nans:
            ax.plot(nans, [0.0] * len(nans), marker="x", color="#DD8452", linestyle="none", markersize=9,
                    label="fixed damping d*: non-finite")
        if rows[0]["best_thor"] is not None:
            ax.axhline(rows[0]["best_thor"], color="#DD8452", linestyle="--", linewidth=1, label="best grid THOR")
        if rows[0]["best_momentum"] is not None:
            ax.axhline(rows[0]["best_momentum"], color="#4C72B0", linestyle=":", linewidth=1,
                       label="best grid Momentum")
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:g}x" for x in xs])
        ax.set_ylim(-0.03, 1.02)
        ax.set_xlabel("learning rate (multiple of the best grid THOR's)")
        ax.set_ylabel(f"final held-out {TASKS[name]}")
        ax.set_title(name, fontsize=9)
    legend = {}  # one legend above the panels, where it hides no point
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.tight_layout()
    fig.legend(list(legend.values()), list(legend), loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=len(legend), fontsize=8, frameon=False)
    fig.suptitle('damping="adaptive" at the best grid THOR learning rate and above', fontsize=9, y=1.12)
    save_figure(fig, path, tight=False)


def multiples_main(args: argparse.Namespace, build_task: Callable, train_once: Callable) -> int:
    """``--lr-multiples``: the runs, the JSON and the PNG (module docstring)."""
    from benchmarks._common import read_json, write_json

    wall = time.perf_counter()
    runs: List[Dict] = []

    def save(complete: bool = False) -> Dict:
        tasks = [t for t in args.tasks if any(r["task"] == t for r in runs)]
        summary = summarise_multiples(runs, tasks, args.lr_multiples)
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        path = write_json(args.out + ".json", {"settings": settings, "complete": complete,
                                               "wall_seconds": time.perf_counter() - wall, **summary,
                                               "runs": runs})
        if summary["table"]:
            plot_multiples(args.out + ".png", read_json(path))
        return summary

    def run(task, kind, lr, damping, multiple=None) -> Dict:
        result = dict(train_once(task, kind, lr, damping, 0.9, args), multiple=multiple)
        runs.append(result)
        save()
        outcome = f"non-finite at step {result['nan_step']}" if result["nan"] else f"final {result['final']:.3f}"
        back = f", {result['rejected_steps']} steps taken back" if result.get("rejected_steps") is not None else ""
        print(f"{task['name']:6s} {kind:8s} lr={lr:<8.3g} damping={str(damping):8s} -> {outcome}{back}, "
              f"{result['median_step_ms']:.1f} ms/step, {result['wall_seconds']:.0f} s wall", flush=True)
        return result

    for name in args.tasks:
        task = build_task(name, args)
        grid = [run(task, "thor", lr, d) for lr in args.lrs for d in args.dampings]
        for lr in args.lrs:
            run(task, "momentum", lr, None)
        best = _best(grid)
        if best is None:
            raise SystemExit(f"{name}: every grid THOR run went non-finite: widen --lrs/--dampings")
        for multiple in args.lr_multiples:
            run(task, "damping", best["lr"] * multiple, "adaptive", multiple)
            if multiple != 1:
                run(task, "thor", best["lr"] * multiple, best["damping"], multiple)
    summary = save(complete=True)
    print_multiples(summary["table"])
    print(f"goals: {summary['goals']['met']}; damping step / THOR step: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in summary["goals"]["step_cost_vs_thor"].items())
          + f"; {time.perf_counter() - wall:.0f} s wall for {len(runs)} runs")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0
