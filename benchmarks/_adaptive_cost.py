"""What recipe-free THOR's step costs beside THOR's: ``bench_thor_adaptive.py --cost``.

For one task (``_adaptive_tasks``), from the same initial weights and on the same batches, five compiled cells take
turns step by step, so the machine's state is shared by all of them: THOR (``--lrs[0]``, ``--dampings[0]``),
adaptive THOR (``thor(net, "adaptive", "adaptive", 0.9)``) and THOR with the adaptive damping only (``thor(net,
--lrs[0], "adaptive", 0.9)``: every step measured too), each stepped by ``ms_optim.nn.TrainOneStepCell``
with ``--frequency``, and the network's loss and gradients without an optimizer, every weight then written (by
zero, as the trial writes them), once as they are and once followed by the second forward pass the adaptive
step runs: their difference is that extra pass, the floor of the adaptive step's cost beside THOR's. Reported:
the median of each over ``--cost-steps`` steps (the first, which compiles, left out; a whole number of THOR
periods, so THOR steps and the others are in their proportion), the ratios of the adaptive steps to THOR's, the
extra forward pass as a share of THOR's step, and the ratio without it; then, with MindSpore's profiler over one
THOR period of each cell, the kernels launched per step and their compute time (in all and per op type): the
extra pass's share of THOR's kernel time is the same floor without the launches (a convolution's compute time
still varies from cell to cell on LeNet5), and THOR's costliest op types say what that floor is made of.
"""
from __future__ import annotations

import csv
import glob
import os
import statistics
import tempfile
import time
from typing import Dict, List


class _Gradients:
    """``(loss, grads)`` of a network (``twice``: then its loss again, as the adaptive step's extra pass)."""

    def __new__(cls, net_with_loss, twice: bool):
        from mindspore import ParameterTuple, nn, ops
        from mindspore.ops import composite

        _touch = composite.MultitypeFuncGraph("touch")

        @_touch.register("Tensor", "Tensor")
        def _touch_tensor(weight, grad):
            return ops.assign_add(weight, ops.zeros_like(weight) * ops.reduce_sum(grad) * 0.0)

        class Cell(nn.Cell):
            def __init__(self):
                super().__init__()
                self.network = net_with_loss
                self.weights = ParameterTuple(net_with_loss.trainable_params())
                self.hyper_map = ops.HyperMap()

            def construct(self, *inputs):
                loss, grads = ops.value_and_grad(self.network, None, self.weights)(*inputs)
                loss = ops.depend(loss, grads)  # the backward pass runs, as in a training step
                # every weight written (by zero), as the trial writes them: the second forward reads them anew
                # rather than reusing the first one's results
                moved = ops.depend(inputs[0], self.hyper_map(_touch, self.weights, grads))
                if twice:
                    loss = loss + ops.value_and_grad(self.network, None, self.weights)(moved, *inputs[1:])[0]
                return ops.depend(loss, moved)

        return Cell().set_train()


def _cells(task: Dict, args) -> Dict:
    """The cells of the comparison, each from the task's initial weights."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor

    from ms_optim import nn as ms_nn

    cells = {}
    for kind in ("thor", "adaptive", "damping", "gradients", "gradients_and_forward"):
        ms.set_seed(args.seed)
        _, net_with_loss = task["build"]()
        if kind.startswith("gradients"):
            cells[kind] = _Gradients(net_with_loss, kind != "gradients")
            continue
        if kind == "thor":
            opt = ms_nn.thor(net_with_loss, Tensor(np.float32(args.lrs[0])), Tensor(np.float32(args.dampings[0])),
                             0.9, batch_size=task["batch"], frequency=args.frequency)
        elif kind == "damping":
            opt = ms_nn.thor(net_with_loss, Tensor(np.float32(args.lrs[0])), "adaptive", 0.9,
                             batch_size=task["batch"], frequency=args.frequency)
        else:
            opt = ms_nn.thor(net_with_loss, "adaptive", "adaptive", 0.9, batch_size=task["batch"],
                             frequency=args.frequency)
        cells[kind] = ms_nn.TrainOneStepCell(net_with_loss, opt).set_train()
    return cells


def _profile(cell, batches, steps: int) -> Dict:
    """Kernels launched per step by ``cell`` over ``steps`` steps, and their compute milliseconds per step, in all
    and per op type (MindSpore's profiler, CPU op statistics)."""
    from mindspore import Profiler

    folder = tempfile.mkdtemp(prefix="ms_optim_kernels_")
    profiler = Profiler(output_path=folder)
    for i in range(steps):
        cell(*batches[i % len(batches)]).asnumpy()
    profiler.stop()
    profiler.analyse()
    launched, by_type = 0, {}
    for path in glob.glob(os.path.join(folder, "**", "cpu_op_type_info_*.csv"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                launched += int(row["type_occurrences"])
                by_type[row["op_type"]] = by_type.get(row["op_type"], 0.0) + float(row["total_compute_time"])
    by_type = {op: value / steps for op, value in sorted(by_type.items(), key=lambda item: -item[1])}
    return {"kernels": launched / steps, "kernel_ms": sum(by_type.values()), "kernel_ms_by_type": by_type}


def measure_cost(task: Dict, args) -> Dict:
    """The cost record of one task (module docstring)."""
    from mindspore import Tensor

    batches = [tuple(Tensor(x) for x in batch) for batch in task["batches"]]
    cells = _cells(task, args)
    times: Dict[str, List[float]] = {kind: [] for kind in cells}
    periods = max(1, args.cost_steps // args.frequency)
    for i in range(periods * args.frequency + 1):
        batch = batches[i % len(batches)]
        for kind, cell in cells.items():
            start = time.perf_counter()
            out = cell(*batch)
            out.asnumpy()
            times[kind].append(time.perf_counter() - start)
    median = {kind: statistics.median(values[1:]) for kind, values in times.items()}
    forward = max(0.0, median["gradients_and_forward"] - median["gradients"])
    profiles = {kind: _profile(cell, batches, args.frequency) for kind, cell in cells.items()}
    kernels = {kind: profiles[kind]["kernels"] for kind in ("thor", "adaptive", "damping")}
    kernel_ms = {kind: profile["kernel_ms"] for kind, profile in profiles.items()}
    forward_kernels = max(0.0, kernel_ms["gradients_and_forward"] - kernel_ms["gradients"])
    thor_types = profiles["thor"]["kernel_ms_by_type"]
    return {"task": task["name"], "steps": len(times["thor"]) - 1,
            "step_ms": {**{kind: 1e3 * value for kind, value in median.items()}, "forward": 1e3 * forward},
            "adaptive_vs_thor": median["adaptive"] / median["thor"],
            "damping_vs_thor": median["damping"] / median["thor"],
            "forward_share_of_thor": forward / median["thor"],
            "adaptive_vs_thor_without_forward": (median["adaptive"] - forward) / median["thor"],
            "kernels_per_step": kernels,
            # the profiler's compute time of the kernels alone (no launches)
            "kernel_ms_per_step": kernel_ms,
            "forward_kernel_share_of_thor": forward_kernels / kernel_ms["thor"],
            "thor_kernel_ms_by_type": {op: thor_types[op] for op in list(thor_types)[:6]}}


def cost_main(args, build_task) -> int:
    """``--cost``: adaptive THOR's step against THOR's on every task (``_adaptive_cost.py``), JSON and PNG."""
    from benchmarks._common import write_json

    wall = time.perf_counter()
    records = []
    for name in args.tasks:
        record = measure_cost(build_task(name, args), args)
        records.append(record)
        ms_ = record["step_ms"]
        print(f"{name:6s} THOR {ms_['thor']:7.2f} ms, adaptive {ms_['adaptive']:7.2f} ms "
              f"({record['adaptive_vs_thor']:.2f}x), its extra forward pass {ms_['forward']:6.2f} ms "
              f"({100 * record['forward_share_of_thor']:.0f}% of THOR's step; without it "
              f"{record['adaptive_vs_thor_without_forward']:.2f}x); damping='adaptive' only "
              f"{ms_['damping']:7.2f} ms ({record['damping_vs_thor']:.2f}x); kernels per step: THOR "
              f"{record['kernels_per_step']['thor']:.0f}, adaptive {record['kernels_per_step']['adaptive']:.0f}, "
              f"damping only {record['kernels_per_step']['damping']:.0f}; the extra forward pass's kernels "
              f"{100 * record['forward_kernel_share_of_thor']:.0f}% of THOR's kernel time; THOR's costliest "
              f"kernels: " + ", ".join(f"{op} {value:.1f} ms" for op, value
                                       in list(record["thor_kernel_ms_by_type"].items())[:3]),
              flush=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    write_json(args.out + ".json", {"settings": settings, "wall_seconds": time.perf_counter() - wall,
                                    "tasks": records})
    plot_cost(args.out + ".png", records, args)
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


def plot_cost(path: str, records: List[Dict], args) -> None:
    """Bars per task, each step as a multiple of THOR's (so a 16 ms step and a 1 s one read alike): THOR's, the
    adaptive step split into its extra forward pass and the rest, and the damping-only step; the median
    milliseconds written under each task's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks._common import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    xs = list(range(len(records)))
    thor = [r["step_ms"]["thor"] for r in records]
    forward = [r["step_ms"]["forward"] / t for r, t in zip(records, thor)]
    rest = [r["step_ms"]["adaptive"] / t - f for r, t, f in zip(records, thor, forward)]
    damping = [r["step_ms"].get("damping", 0.0) / t for r, t in zip(records, thor)]
    ax.bar([x - 0.27 for x in xs], [1.0] * len(xs), 0.27, label="THOR step", color="#DD8452")
    ax.bar(xs, rest, 0.27, label="adaptive step without its extra forward", color="#C44E52")
    ax.bar(xs, forward, 0.27, bottom=rest, label="its extra forward pass", color="#E8A0A2")
    ax.bar([x + 0.27 for x in xs], damping, 0.27, label="damping='adaptive' only (forward included)",
           color="#8172B2")
    for x, r, d, f in zip(xs, records, damping, forward):
        ax.text(x, r["adaptive_vs_thor"], f"{r['adaptive_vs_thor']:.2f}x", ha="center", va="bottom", fontsize=8)
        if f <= 0.0:  # the gradients-only cells did not tell the extra pass apart: no split is drawn
            ax.text(x, 0.5 * r["adaptive_vs_thor"], "extra\nforward\nnot\nresolved", ha="center", va="center",
                    fontsize=6, color="white")
        if d:
            ax.text(x + 0.27, d, f"{d:.2f}x", ha="center", va="bottom", fontsize=8)
    names = [f"{r['task']}\nTHOR {r['step_ms']['thor']:.0f} ms\nadaptive {r['step_ms']['adaptive']:.0f} ms"
             for r in records]
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_ylim(0, 1.2 * max([r["adaptive_vs_thor"] for r in records] + damping))
    ax.set_ylabel("median step / THOR's")
    ax.set_title(f"adaptive THOR's step against THOR's (frequency {args.frequency}, {records[0]['steps']} steps)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=2, bbox_to_anchor=(0.5, -0.3), frameon=False)
    save_figure(fig, path)
