"""THOR with its inversions shared across 2 data-parallel ranks (distribute_inverses) against every rank inverting all.

Launches 2 CPU workers with ``msrun`` (127.0.0.1, mccl), data parallel with ``gradients_mean=True``.
Each worker builds model_zoo/resnet's ResNet-18 (10 classes, ImageNet stem, ``--width`` channels in
the first stage, ``--image`` x ``--image`` inputs, ``--batch`` samples per rank) twice from the same
weights: one THOR optimizer with ``distribute_inverses=False`` (every rank inverts every layer) and
one with ``distribute_inverses=True`` (each layer inverted by one rank, the inverses shared by a
summing AllReduce; ``ms_optim._thor.inversion.owners``), both with ``inverse="full"`` (whole-matrix inverses,
so inversion dominates the THOR step). Every round times, in a rotated order, one training step of:

* ``unshared_thor`` / ``shared_thor``: a THOR step (factors collected, all-reduced, inverted, shared);
* ``unshared_non_thor`` / ``shared_non_thor``: a step between THOR steps (stored inverses reused);
* ``factor_allreduce`` / ``factor_allreduce_unordered`` / ``inverse_share``: the communication alone,
  on zeros of the real shapes: the shared optimizer's ``FactorAllReduce`` cells on every A and G (issued
  strictly in layer order, as sharing requires), the unshared optimizer's (no order imposed), and the
  ``InverseSharing`` AllReduce on every inverse (what sharing adds).

The step state (``global_step`` 0 or 1 and the layers' ``thor_flag``) is set before each call,
outside the timed region; both ranks run the same sequence. Reported per candidate: each rank's
median and the slowest rank's (the collectives make a step as slow as its slowest rank); the ratio
``unshared_thor / shared_thor`` (speed-up of the THOR step), the same for the THOR-step overhead
``thor - non_thor`` (factor work + inversion + communication), the ideal inversion speed-up
``sum of costs / largest rank load`` of the assignment, and each rank's ``inversion_count``.

    python benchmarks/bench_thor_shared.py           # ResNet-18 width 16, 32x32, batch 8 per rank, 7 rounds
    python benchmarks/bench_thor_shared.py --quick   # width 4, 2 rounds: a smoke run
Writes ``benchmarks/results/<--name>[_quick].json`` and ``.png`` (``--name`` default ``bench_thor_shared``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports").
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
    set_thor_state,
    write_json,
)

CANDIDATES = ("unshared_thor", "shared_thor", "unshared_non_thor", "shared_non_thor")
# the communication alone, on zeros of the real shapes
COMM = ("factor_allreduce", "factor_allreduce_unordered", "inverse_share")


# ----------------------------------------------------------------------------------------- worker
def worker(args) -> None:
    """One rank: build both optimizers, time the candidates, write ``rank<r>.json`` into ``args.partial``."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn
    from mindspore.communication import get_group_size, get_rank, init

    from ms_optim._bridge import prime_numpy_bridge

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    prime_numpy_bridge()  # before init(): see ms_optim._bridge
    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)

    from model_zoo.resnet.src.resnet import resnet18
    from ms_optim.nn import thor

    ms.set_seed(0)
    reference = resnet18(class_num=10, width=args.width)
    weights = {p.name: p.asnumpy() for p in reference.get_parameters()}
    rng = np.random.default_rng(rank)
    x = Tensor(rng.normal(size=(args.batch, 3, args.image, args.image)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, size=(args.batch,)).astype(np.int32))
    steps = 1 << 20
    cells, opts = {}, {}
    for shared in (False, True):
        net = resnet18(class_num=10, width=args.width)
        for p in net.get_parameters():
            p.set_data(Tensor(weights[p.name]))
        opt = thor(net, Tensor(np.full((steps,), 0.01, np.float32)), Tensor(np.full((steps,), 0.03, np.float32)),
                   0.9, weight_decay=1e-4, batch_size=args.batch, frequency=100, inverse="full",
                   distribute_inverses=shared)
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        key = "shared" if shared else "unshared"
        cells[key] = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt).set_train()
        opts[key] = opt

    def state(key: str, step: int, flags: bool):
        return lambda: set_thor_state(opts[key], step, flags)

    candidates, prepare = {}, {}
    for name in CANDIDATES:
        key, thor_step = name.split("_")[0], not name.endswith("_non_thor")
        candidates[name] = lambda k=key: cells[k](x, y)
        prepare[name] = state(key, 0 if thor_step else 1, thor_step)  # step 0 inverts, step 1 reuses
    shared_opt = opts["shared"]
    a_cov = tuple(ms.ops.zeros_like(p) for p in shared_opt.matrix_a_cov)
    g_cov = tuple(ms.ops.zeros_like(p) for p in shared_opt.matrix_g_cov)
    a_inv = tuple(ms.ops.zeros_like(p) for p in shared_opt.matrix_a_inv)
    g_inv = tuple(ms.ops.zeros_like(p) for p in shared_opt.matrix_g_inv)
    anchor = Tensor(np.zeros((1,), np.float32))
    unshared_opt = opts["unshared"]
    shared_inversion, unshared_inversion = shared_opt.inversion, unshared_opt.inversion
    candidates["factor_allreduce"] = lambda: (shared_inversion.reduce_a(a_cov), shared_inversion.reduce_g(g_cov))
    candidates["factor_allreduce_unordered"] = lambda: (unshared_inversion.reduce_a(a_cov),
                                                        unshared_inversion.reduce_g(g_cov))
    candidates["inverse_share"] = lambda: shared_opt.sharing(a_inv, g_inv, anchor)
    timings = interleaved_medians(candidates, repeats=args.repeats, warmup=args.warmup, prepare=prepare)
    sharing = opts["shared"].sharing
    record = {"rank": rank, "size": size, "timings_ms": timings, "thor_layers": opts["shared"].num_layers,
              "owners": list(sharing.owners), "costs": list(sharing.costs), "rank_loads": list(sharing.rank_loads()),
              "inversion_count": sharing.inversion_count.asnumpy().tolist(),
              "thor_step_calls": args.warmup + args.repeats}
    with open(os.path.join(args.partial, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    print(f"rank {rank}/{size}: " + ", ".join(f"{k} {v['median_ms']:.0f} ms" for k, v in timings.items()), flush=True)


# ----------------------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarise(ranks: List[Dict]) -> Dict:
    """Slowest-rank medians, the speed-ups and the inversion accounting from the per-rank records."""
    slowest = {name: max(r["timings_ms"][name]["median_ms"] for r in ranks) for name in CANDIDATES + COMM}
    overhead = {key: slowest[f"{key}_thor"] - slowest[f"{key}_non_thor"] for key in ("unshared", "shared")}
    costs, loads = ranks[0]["costs"], ranks[0]["rank_loads"]
    return {
        "slowest_rank_median_ms": slowest,
        "thor_step_overhead_ms": overhead,
        "thor_step_speedup": slowest["unshared_thor"] / slowest["shared_thor"],
        "thor_overhead_speedup": overhead["unshared"] / overhead["shared"] if overhead["shared"] > 0 else None,
        "ideal_inversion_speedup": sum(costs) / max(loads),
        "owners_agree": all(r["owners"] == ranks[0]["owners"] for r in ranks),
        "inversion_count_per_rank": [r["inversion_count"] for r in ranks],
        "layers_inverted_per_rank": [sum(1 for c in r["inversion_count"] if c > 0) for r in ranks],
    }


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the step and communication bars of a record of this benchmark beside its JSON; returns the PNG."""
    ranks, slow, names = record["ranks"], record["slowest_rank_median_ms"], CANDIDATES + COMM
    errors = [[slow[n] - max(r["timings_ms"][n]["p25_ms"] for r in ranks) for n in names],
              [max(r["timings_ms"][n]["p75_ms"] for r in ranks) - slow[n] for n in names]]
    errors = [[max(0.0, e) for e in side] for side in errors]
    labels = ["THOR step, every rank inverts all", "THOR step, inversions shared", "non-THOR step, unshared",
              "non-THOR step, shared", "factor AllReduce alone (ordered)", "factor AllReduce alone (unordered)",
              "inverse sharing alone"]
    title = (f"ResNet-18 (width {record['width']}, {record['image']}px, inverse='full'), 2 msrun CPU ranks: "
             f"{record['thor_step_speedup']:.2f}x")
    return [bar_plot(os.path.splitext(json_path)[0] + ".png", labels, [slow[n] for n in names],
                     "ms (slowest rank's median)", title, errors=errors)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: width 4, 2 rounds, 1 warm-up call")
    parser.add_argument("--width", type=int, default=None, help="ResNet-18 first-stage channels (default 16, 4 quick)")
    parser.add_argument("--image", type=int, default=32, help="input height and width")
    parser.add_argument("--batch", type=int, default=8, help="samples per rank")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds (default 7, 2 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per candidate (default 1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the msrun job is abandoned")
    parser.add_argument("--name", default="bench_thor_shared", help="file stem of the JSON and PNG")
    parser.add_argument("--out", default=RESULTS_DIR, help="folder for the JSON and PNG files")
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--partial", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.width = args.width or (4 if args.quick else 16)
    args.repeats = args.repeats or (2 if args.quick else 7)
    args.warmup = args.warmup or 1
    if args.as_rank:  # inside msrun (the name must not abbreviate an msrun option)
        worker(args)
        return 0

    suffix = "_quick" if args.quick else ""
    with tempfile.TemporaryDirectory() as partial:
        cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", "--join=True", f"--log_dir={os.path.join(partial, 'logs')}",
               os.path.abspath(__file__), "--as-rank", "--partial", partial, "--width", str(args.width),
               "--image", str(args.image), "--batch", str(args.batch), "--repeats", str(args.repeats),
               "--warmup", str(args.warmup)]
        print(f"msrun, 2 ranks: ResNet-18 width {args.width}, {args.image}x{args.image}, batch {args.batch}/rank, "
              f"inverse='full', {args.repeats} interleaved rounds", flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if run.returncode != 0:
            for r in range(2):
                log = os.path.join(partial, "logs", f"worker_{r}.log")
                if os.path.exists(log):
                    with open(log, encoding="utf-8", errors="replace") as handle:
                        sys.stderr.write("".join(handle.readlines()[-30:]))
            sys.stderr.write(run.stdout[-2000:] + run.stderr[-2000:])
            return 1
        ranks = []
        for r in range(2):
            with open(os.path.join(partial, f"rank{r}.json"), encoding="utf-8") as handle:
                ranks.append(json.load(handle))
    summary = summarise(ranks)
    payload = {"quick": args.quick, "net": "resnet18", "width": args.width, "image": args.image,
               "batch_per_rank": args.batch, "ranks_n": 2, "inverse": "full", "repeats": args.repeats,
               "thor_layers": ranks[0]["thor_layers"], "costs": ranks[0]["costs"], "owners": ranks[0]["owners"],
               "rank_loads": ranks[0]["rank_loads"], **summary, "ranks": ranks}
    slow = summary["slowest_rank_median_ms"]
    for name in CANDIDATES:
        print(f"  {name:26s} {slow[name]:9.1f} ms (slowest rank's median)")
    for name in COMM:
        print(f"  {name:26s} {slow[name]:9.1f} ms (communication alone)")
    print(f"  THOR step: {summary['thor_step_speedup']:.2f}x faster shared; THOR-step overhead "
          f"{summary['thor_step_overhead_ms']['unshared']:.0f} -> {summary['thor_step_overhead_ms']['shared']:.0f} ms; "
          f"ideal inversion speed-up of the assignment {summary['ideal_inversion_speedup']:.2f}x; "
          f"layers inverted per rank {summary['layers_inverted_per_rank']}")
    path = write_json(os.path.join(args.out, f"{args.name}{suffix}.json"), payload)
    plot_record(read_json(path), path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
