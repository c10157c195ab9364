"""The summary of ``bench_thor_adaptive``: runs of several seeds averaged per setting, the table (a grid as
its best setting) and the goals."""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence

POINT = 0.01  # "within 1 point" of a figure in [0, 1]
_SETTING = ("task", "kind", "lr", "damping", "momentum")


def _mean_curve(curves: List[List]) -> List:
    """The curves' pointwise mean (seconds and figure) where they evaluated at the same steps, else the first."""
    if any([c[0] for c in curve] != [c[0] for c in curves[0]] for curve in curves):
        return curves[0]
    return [[points[0][0], statistics.fmean(p[1] for p in points), statistics.fmean(p[2] for p in points)]
            for points in zip(*curves)]


def average_seeds(runs: List[Dict]) -> List[Dict]:
    """One run per setting (task, kind, lr, damping, momentum), in order of first appearance. A setting run
    with one seed is that run; with several, its final figure, final loss, times and ms/step are the means
    over the seeds (``finals``: each seed's), NaN where any seed went NaN; its time to target the mean where
    every seed reached the target (else none); its curve the pointwise mean."""
    groups: Dict[tuple, List[Dict]] = {}
    for run in runs:
        groups.setdefault(tuple(run.get(k) for k in _SETTING), []).append(run)
    averaged = []
    for group in groups.values():
        if len(group) == 1:
            averaged.append(group[0])
            continue
        nan = any(r["nan"] for r in group)
        reached = [r["seconds_to_target"] for r in group]
        mean = statistics.fmean
        averaged.append({
            **{k: group[0].get(k) for k in _SETTING}, "seeds": [r.get("seed") for r in group],
            "finals": [r["final"] for r in group], "nan": nan,
            "nan_step": next((r["nan_step"] for r in group if r["nan"]), None),
            "final": float("nan") if nan else mean(r["final"] for r in group),
            "final_loss": mean(r["final_loss"] for r in group),
            "seconds_to_target": None if None in reached else mean(reached),
            "train_seconds": mean(r["train_seconds"] for r in group),
            "median_step_ms": mean(r["median_step_ms"] for r in group),
            "wall_seconds": sum(r["wall_seconds"] for r in group),
            "curve": _mean_curve([r["curve"] for r in group if not r["nan"]] or [group[0]["curve"]])})
    return averaged


def best_run(runs: List[Dict], by_time: bool = False) -> Optional[Dict]:
    finite = [r for r in runs if not r["nan"]]
    if not finite:
        return None
    inf = float("inf")
    if by_time:
        return min(finite, key=lambda r: (r["seconds_to_target"] or inf, -r["final"]))
    return min(finite, key=lambda r: (-r["final"], r["seconds_to_target"] or inf))


def summarise(runs: List[Dict], tasks: Sequence[str]) -> Dict:
    """The table (one row per task and run kind, grids as their best setting, adaptive THOR once per momentum)
    and the goals, met or not, over the runs averaged per setting (:func:`average_seeds`); the goals judge
    the first adaptive run (the first momentum)."""
    runs = average_seeds(runs)
    table, goals = [], {"never_nan": True, "within_1_point": {}, "beats_momentum_time": {}}
    for name in tasks:
        mine = [r for r in runs if r["task"] == name]
        for kind in ("adaptive", "recipe", "thor", "momentum", "lamb"):
            group = [r for r in mine if r["kind"] == kind]
            if not group:
                continue
            # (the row's run, the runs it stands for): adaptive THOR per momentum, a grid as its best setting
            rows = [(r, [r]) for r in group] if kind == "adaptive" else [(best_run(group) or group[0], group)]
            for best, members in rows:
                table.append({**{k: best.get(k) for k in ("task", "kind", "lr", "damping", "momentum", "final",
                                                          "final_loss", "seconds_to_target", "train_seconds",
                                                          "nan", "median_step_ms")},
                              "finals": best.get("finals", [best["final"]]),
                              "nan_runs": sum(r["nan"] for r in members), "runs": len(members),
                              "wall_seconds": sum(r["wall_seconds"] for r in members)})
        adaptive = next((r for r in mine if r["kind"] == "adaptive"), None)
        thor, momentum = best_run([r for r in mine if r["kind"] == "thor"]), \
            best_run([r for r in mine if r["kind"] == "momentum"], by_time=True)
        if adaptive is None:
            continue
        goals["never_nan"] &= not adaptive["nan"]
        goals["within_1_point"][name] = bool(thor is None or (not adaptive["nan"]
                                                              and adaptive["final"] >= thor["final"] - POINT))
        mine_t = adaptive["seconds_to_target"] if not adaptive["nan"] else None
        theirs = momentum["seconds_to_target"] if momentum else None
        goals["beats_momentum_time"][name] = bool(mine_t is not None and (theirs is None or mine_t < theirs))
        if thor is not None:  # the cost of the adaptive step (its extra forward pass included) per step
            goals.setdefault("step_cost_vs_thor", {})[name] = adaptive["median_step_ms"] / thor["median_step_ms"]
    goals["met"] = {"never_nan": goals["never_nan"],
                    "within_1_point_every_task": all(goals["within_1_point"].values()),
                    "beats_momentum_time_2_of_3": sum(goals["beats_momentum_time"].values()) >= 2}
    return {"table": table, "goals": goals}


def fmt(value, spec: str = ".3f") -> str:
    if isinstance(value, str):
        return value
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(table: List[Dict]) -> None:
    """The table; with several seeds a setting's final figure is their mean, followed by each seed's."""
    print(f"{'task':7s} {'run':9s} {'lr':>6s} {'damp':>6s} {'mom':>8s} {'final':>6s} {'loss':>8s} "
          f"{'to target s':>11s} {'train s':>8s} {'ms/step':>8s} {'NaN runs':>8s} {'wall s':>7s}  seeds' finals")
    for row in table:
        finals = row.get("finals", [])
        each = " ".join(fmt(f) for f in finals) if len(finals) > 1 else ""
        print(f"{row['task']:7s} {row['kind']:9s} {fmt(row['lr'], 'g'):>6s} {fmt(row['damping'], 'g'):>6s} "
              f"{fmt(row.get('momentum'), 'g'):>8s} {fmt(row['final']):>6s} {fmt(row['final_loss'], '.4f'):>8s} "
              f"{fmt(row['seconds_to_target'], '.1f'):>11s} {fmt(row['train_seconds'], '.1f'):>8s} "
              f"{fmt(row['median_step_ms'], '.1f'):>8s} "
              f"{row['nan_runs']}/{row['runs']:<6d} {row['wall_seconds']:7.0f}  {each}")
