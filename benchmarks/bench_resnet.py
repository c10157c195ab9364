"""Training throughput of the ResNet zoo's networks: THOR (frequency 834 and 100) against Momentum.

Two workloads, each trained with MindSpore's ``nn.Momentum`` and with ms_optim's ``nn.thor`` on the
same network and synthetic data (no input pipeline: this measures the training step itself):

- ResNet-50 v1.5, 1001 classes, batch 32, 224x224 (the published THOR recipe's per-device step);
- ResNet-18 (3x3 CIFAR stem), 10 classes, batch 32, 32x32.

Steps are ``TrainOneStepCell(WithLossCell(net, loss), optimizer)`` in GRAPH_MODE with loss scale 128
as in the recipe. THOR is run with ``frequency=2``, so its steps alternate between a THOR step
(factors + inverses) and an ordinary step; every round times one Momentum step, one THOR step and one
ordinary THOR step (medians over rounds). A THOR run at frequency f costs on average

    t(f) = (t_thor_step + (f - 1) * t_other_step) / f,

reported for f = 834 (the published ImageNet setting: one THOR step per epoch-ish of 8x32 images)
and f = 100, as images/s and as the ratio to Momentum's images/s. On a GPU or Ascend device the
script also prints ms/step next to the published per-step times (MindSpore model zoo, ResNet-50
THOR, 8 x Ascend 910: 20.4 ms/step; the published THOR GPU figure: 76 ms/step).

    python benchmarks/bench_resnet.py                 # full run (many minutes on a 2-core CPU)
    python benchmarks/bench_resnet.py --quick         # smoke run: small images and batches, 2 rounds
    python benchmarks/bench_resnet.py --device_target GPU

Writes bench_resnet.json and bench_resnet.png (``--quick``: bench_resnet_quick.*; ``--only NET`` adds
``_NET``) into ``--out-dir``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

# Bootstrap, identical in every benchmark (model_zoo/README.md, "Imports"): run as a file, this folder
# would be sys.path[0] and its modules importable under bare names; the repository root takes its
# place, so each module has one name (benchmarks._common, model_zoo....) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks._common import RESULTS_DIR, bar_plot, read_json, write_json  # noqa: E402

PUBLISHED_MS_PER_STEP = {"Ascend 910 (MindSpore zoo, ResNet-50 THOR, batch 32)": 20.4,
                         "GPU (published THOR figure, ResNet-50, batch 32)": 76.0}
FREQUENCIES = (834, 100)


def parse_args(argv: List[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--device_target", default="CPU", choices=["CPU", "GPU", "Ascend"],
                        help="backend (default CPU)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds per workload; each round = 1 Momentum + 2 THOR steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed rounds first, compilation included (default 2)")
    parser.add_argument("--only", choices=["resnet50", "resnet18"], default=None, help="run one workload only")
    parser.add_argument("--resnet50_batch", type=int, default=32,
                        help="ResNet-50 batch (default 32, the recipe's per-device batch). On CPU, THOR at batch 32 "
                             "and 224x224 needs more than 21 GB of host memory in GRAPH_MODE")
    parser.add_argument("--resnet50_size", type=int, default=224, help="ResNet-50 image side (default 224)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: ResNet-50 batch 4 at 64x64, ResNet-18 batch 8 at 32x32, width 16, "
                             "2 rounds, 1 warm-up; results as bench_resnet_quick.*")
    parser.add_argument("--out-dir", default=RESULTS_DIR, help="where to write the JSON and PNG")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 1:
        parser.error("--rounds and --warmup must be >= 1")
    if args.resnet50_batch < 1 or args.resnet50_size < 32:
        parser.error("--resnet50_batch must be >= 1 and --resnet50_size >= 32")
    if args.quick:
        args.rounds, args.warmup = 2, 1
    return args


def workloads(quick: bool, resnet50_batch: int = 32, resnet50_size: int = 224) -> List[Dict]:
    if quick:
        return [dict(name="resnet50", classes=1001, batch=4, size=64, width=16, stem="imagenet"),
                dict(name="resnet18", classes=10, batch=8, size=32, width=16, stem="cifar")]
    return [dict(name="resnet50", classes=1001, batch=resnet50_batch, size=resnet50_size, width=64, stem="imagenet"),
            dict(name="resnet18", classes=10, batch=32, size=32, width=64, stem="cifar")]


def build_step(work: Dict, optimizer: str):
    """A compiled-on-first-call training step closure for ``optimizer`` in {'momentum', 'thor'}."""
    import mindspore as ms
    from mindspore import Tensor
    from mindspore import nn as ms_nn

    from model_zoo.resnet.src.resnet import build_resnet

    ms.set_seed(1)
    net = build_resnet(work["name"], class_num=work["classes"], width=work["width"], stem=work["stem"])
    loss = ms_nn.CrossEntropyLoss(label_smoothing=0.1)
    steps = 10_000
    lr = Tensor(np.full(steps, 0.01, np.float32))
    if optimizer == "momentum":
        opt = ms_nn.Momentum(net.trainable_params(), lr, 0.9, weight_decay=5e-4, loss_scale=128.0)
    else:
        from ms_optim import nn as thor_nn

        layers = sum(1 for _, c in net.cells_and_names() if isinstance(c, (ms_nn.Conv2d, ms_nn.Dense)))
        opt = thor_nn.thor(net, lr, Tensor(np.full(steps, 0.03, np.float32)), 0.9, 5e-4, 128.0, work["batch"],
                           split_indices=[layers // 2, layers - 1], frequency=2)
    train = ms_nn.TrainOneStepCell(ms_nn.WithLossCell(net, loss), opt, sens=128.0)
    train.set_train()
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((work["batch"], 3, work["size"], work["size"])).astype(np.float32))
    y = Tensor(rng.integers(0, work["classes"], work["batch"]).astype(np.int32))

    def step():
        out = train(x, y)
        return float(out.asnumpy())  # waits for the step on every backend

    return step


def measure(work: Dict, rounds: int, warmup: int) -> Dict:
    momentum = build_step(work, "momentum")
    thor = build_step(work, "thor")  # frequency 2: calls alternate THOR step, ordinary step
    t0 = time.perf_counter()
    for _ in range(warmup):
        momentum()
        thor()
        thor()
    compile_s = time.perf_counter() - t0
    samples = {"momentum": [], "thor_step": [], "other_step": []}
    for r in range(rounds):
        order = ["momentum", "thor"] if r % 2 == 0 else ["thor", "momentum"]
        for name in order:
            if name == "momentum":
                start = time.perf_counter()
                momentum()
                samples["momentum"].append(time.perf_counter() - start)
            else:  # the THOR step (even global step) then the ordinary one
                start = time.perf_counter()
                thor()
                mid = time.perf_counter()
                thor()
                samples["thor_step"].append(mid - start)
                samples["other_step"].append(time.perf_counter() - mid)
    ms_ = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
    batch = work["batch"]
    result = {"workload": work, "rounds": rounds, "warmup_and_compile_s": compile_s,
              "median_ms": ms_, "all_ms": {k: [1e3 * s for s in v] for k, v in samples.items()},
              "images_per_s": {"Momentum": 1e3 * batch / ms_["momentum"]}}
    for f in FREQUENCIES:
        amortized = (ms_["thor_step"] + (f - 1) * ms_["other_step"]) / f
        result["median_ms"][f"thor_f{f}_amortized"] = amortized
        result["images_per_s"][f"THOR f={f}"] = 1e3 * batch / amortized
    result["ratio_to_momentum"] = {k: v / result["images_per_s"]["Momentum"]
                                   for k, v in result["images_per_s"].items() if k != "Momentum"}
    return result


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the throughput bars of a record of this benchmark beside its JSON; returns the PNG's path."""
    labels, values = [], []
    for res in record["results"]:
        for name, ips in res["images_per_s"].items():
            labels.append(f"{res['workload']['name']} {name}")
            values.append(ips)
    return [bar_plot(os.path.splitext(json_path)[0] + ".png", labels, values, "images/s",
                     f"ResNet training throughput on {record['device_target']} (higher is better)")]


def main(argv: List[str] = None) -> int:
    args = parse_args(argv)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target=args.device_target)
    results = []
    for work in workloads(args.quick, args.resnet50_batch, args.resnet50_size):
        if args.only and work["name"] != args.only:
            continue
        print(f"[bench_resnet] {work['name']} batch {work['batch']} {work['size']}x{work['size']} width "
              f"{work['width']} on {args.device_target}: {args.warmup} warm-up + {args.rounds} rounds", flush=True)
        res = measure(work, args.rounds, args.warmup)
        results.append(res)
        med = res["median_ms"]
        print(f"  step ms (median): Momentum {med['momentum']:.1f}, THOR step {med['thor_step']:.1f}, "
              f"ordinary THOR step {med['other_step']:.1f} (warm-up incl. compile {res['warmup_and_compile_s']:.0f} s)")
        for name, ips in res["images_per_s"].items():
            ratio = res["ratio_to_momentum"].get(name)
            extra = f"  ratio to Momentum {ratio:.3f}" if ratio is not None else ""
            print(f"  {name:>12}: {ips:8.2f} images/s{extra}", flush=True)
        if args.device_target != "CPU" and work["name"] == "resnet50" and (work["batch"], work["size"]) == (32, 224):
            print(f"  ms/step here: THOR f=834 {med['thor_f834_amortized']:.1f}, Momentum {med['momentum']:.1f}; "
                  + "; ".join(f"published {k}: {v} ms/step" for k, v in PUBLISHED_MS_PER_STEP.items()))
    stem = ("bench_resnet_quick" if args.quick else "bench_resnet") + (f"_{args.only}" if args.only else "")
    payload = {"device_target": args.device_target, "frequencies": list(FREQUENCIES),
               "published_ms_per_step": PUBLISHED_MS_PER_STEP, "results": results,
               "method": "GRAPH_MODE TrainOneStepCell on fixed synthetic batches; THOR run at frequency 2, "
                         "t(f) = (t_thor + (f-1) t_other) / f"}
    json_path = write_json(os.path.join(args.out_dir, stem + ".json"), payload)
    (png_path,) = plot_record(read_json(json_path), json_path)
    print(f"[bench_resnet] wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
