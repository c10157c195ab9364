"""Recipe transfer: the published ResNet-50 THOR recipes, each under its own factor convention and under "kfc".

MindSpore's model zoo publishes two ResNet-50 THOR recipes (``official/cv/ResNet/config/
resnet50_imagenet2012_{GPU,Ascend}_Thor_config.yaml``; here ``model_zoo/resnet/configs/
resnet50_imagenet2012_thor_{gpu,ascend}.yaml``): lr and damping schedules (``lr_init``, ``lr_decay``,
``lr_end_epoch``, ``decay_epochs``, ``damping_init``, ``damping_decay``), ``frequency`` 834, batch 32,
loss scale 128, momentum 0.9, weight decay 5e-4, ``split_indices=[26, 53]``. Each was tuned on
MindSpore's THOR of its device, whose numbers ``factor_convention="gpu"``/``"ascend"`` reproduce. This
benchmark trains ``model_zoo/resnet``'s ResNet-50 with each recipe under its own convention and, in
the same run and from the same initial weights and batches, under ``"kfc"``.

Scale (so that a 2-core CPU trains it in minutes): ResNet-50 (bottleneck 3-4-6-3, 54 THOR layers) at
``--width`` (16: a quarter of the channels), ``--image-size`` 32 with the CIFAR stem, generated data
(one fixed random pattern per class, ``--classes`` 10, plus noise), ``--steps`` steps of batch 32.
The schedules are the recipes' own per-epoch curves with ``--steps-per-epoch`` steps standing for one
epoch (ImageNet on 8 devices: 5004), and the frequency scaled alike: ``max(2, round(834 *
steps_per_epoch / 5004))`` (2 by default: THOR steps every other step). No label smoothing.

Output: ``benchmarks/results/bench_thor_recipes.json`` (per run: the recipe, convention, loss per
step, ``nan_count`` = steps whose loss is not finite (NaN or inf), the first such step, final
held-out accuracy, seconds; per recipe the ratio of the final loss of its own convention to kfc's)
and ``bench_thor_recipes.png`` (the loss curves, one panel per recipe).

    nice python benchmarks/bench_thor_recipes.py                 # both recipes, 4 runs
    nice python benchmarks/bench_thor_recipes.py --recipes gpu --steps 6
    python benchmarks/bench_thor_recipes.py --replot                # redraw the PNG from the JSON
"""
from __future__ import annotations

import argparse
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

from benchmarks._common import RESULTS_DIR, plotted_from, read_json, save_figure, write_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = {name: os.path.join(ROOT, "model_zoo", "resnet", "configs", f"resnet50_imagenet2012_thor_{name}.yaml")
           for name in ("gpu", "ascend")}
IMAGENET_STEPS_PER_EPOCH = 5004  # 1281167 images / (32 per device x 8 devices), the recipes' epoch


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _recipes(text: str) -> List[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in RECIPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"recipes must be among {sorted(RECIPES)}, got {text!r}")
    return names


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", type=_recipes, default=list(RECIPES), help="comma list of gpu, ascend")
    parser.add_argument("--steps", type=_positive_int, default=30, help="training steps per run (default 30)")
    parser.add_argument("--steps-per-epoch", type=_positive_int, default=3,
                        help="steps standing for one epoch of the recipes' schedules (default 3)")
    parser.add_argument("--width", type=_positive_int, default=16, help="ResNet-50 base width (default 16; 64 = full)")
    parser.add_argument("--image-size", type=_positive_int, default=32, help="generated image side (default 32)")
    parser.add_argument("--classes", type=_positive_int, default=10, help="classes of the generated data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "bench_thor_recipes"),
                        help="output path without extension (JSON and PNG)")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON at --out")
    return parser.parse_args(argv)


def recipe(name: str, steps: int, steps_per_epoch: int) -> Dict:
    """The recipe's numbers at this scale: lr and damping per step, frequency and the fixed settings."""
    from model_zoo.resnet.src.config import load_config
    from model_zoo.resnet.src.lr_schedule import thor_schedules

    config = load_config(RECIPES[name])
    lr, damping = thor_schedules(config, steps_per_epoch)
    frequency = max(2, round(config["frequency"] * steps_per_epoch / IMAGENET_STEPS_PER_EPOCH))
    return dict(name=name, convention=config["factor_convention"], lr=lr[:steps], damping=damping[:steps],
                frequency=frequency, batch_size=config["batch_size"], loss_scale=float(config["loss_scale"]),
                momentum=config["momentum"], weight_decay=config["weight_decay"],
                split_indices=list(config["split_indices"]), net=config["net"])


def data(args) -> tuple:
    """``args.steps`` training batches of 32 and 320 held-out samples: class pattern + noise."""
    import numpy as np

    rng = np.random.default_rng(1000 + args.seed)
    size = args.image_size
    patterns = rng.standard_normal((args.classes, 3, size, size)).astype(np.float32)

    def sample(n):
        labels = rng.integers(0, args.classes, n).astype(np.int32)
        return (patterns[labels] + 1.5 * rng.standard_normal((n, 3, size, size))).astype(np.float32), labels

    return [sample(32) for _ in range(args.steps)], sample(320)


def train_once(spec: Dict, convention: str, batches, test, args) -> Dict:
    """One run of ``spec`` under ``convention``; returns the loss per step, NaN count, accuracy, seconds."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    from mindspore import nn as mnn

    from model_zoo.resnet.src.resnet import build_resnet
    from ms_optim import nn as ms_nn

    ms.set_seed(args.seed)
    net = build_resnet(spec["net"], class_num=args.classes, width=args.width, stem="cifar")
    opt = ms_nn.thor(net, Tensor(spec["lr"]), Tensor(spec["damping"]), spec["momentum"], spec["weight_decay"],
                     spec["loss_scale"], spec["batch_size"], split_indices=spec["split_indices"],
                     frequency=spec["frequency"], factor_convention=convention)
    loss_fn = mnn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    cell = mnn.TrainOneStepCell(mnn.WithLossCell(net, loss_fn), opt, sens=spec["loss_scale"]).set_train()
    start = time.perf_counter()
    losses = [float(cell(Tensor(x), Tensor(y)).asnumpy()) for x, y in batches]
    seconds = time.perf_counter() - start
    nans = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    finite = all(np.all(np.isfinite(p.asnumpy())) for p in net.trainable_params())
    accuracy = float("nan")
    if finite:
        net.set_train(False)
        accuracy = float(np.mean(np.argmax(net(Tensor(test[0])).asnumpy(), axis=1) == test[1]))
    return {"recipe": spec["name"], "convention": convention, "losses": losses, "nan_count": len(nans),
            "first_nan_step": nans[0] if nans else None, "finite_weights": bool(finite),
            "test_accuracy": accuracy, "seconds": seconds}


def plot(path: str, runs: List[Dict], recipes: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(recipes), figsize=(5.5 * len(recipes), 4), squeeze=False)
    for ax, name in zip(axes[0], recipes):
        for run in (r for r in runs if r["recipe"] == name):
            label = f'{run["convention"]} (non-finite loss steps {run["nan_count"]}, acc {run["test_accuracy"]:.2f})'
            ax.plot(range(len(run["losses"])), run["losses"], marker=".", label=label)
        ax.set_title(f"ResNet-50, published {name.upper()} THOR recipe")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.legend()
    save_figure(fig, path + ".png")


def plot_record(record: Dict, json_path: str) -> List[str]:
    """Draw the loss curves of a record of this benchmark beside its JSON; returns the PNG's path."""
    stem = os.path.splitext(json_path)[0]
    plot(stem, record["runs"], record["args"]["recipes"])
    return [stem + ".png"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.replot:
        saved = read_json(args.out + ".json")
        with plotted_from(saved):
            plot_record(saved, args.out + ".json")
        return 0
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    batches, test = data(args)
    runs, specs = [], {}
    for name in args.recipes:
        spec = recipe(name, args.steps, args.steps_per_epoch)
        specs[name] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in spec.items()}
        for convention in (spec["convention"], "kfc"):
            run = train_once(spec, convention, batches, test, args)
            print(f'{name} recipe, {convention}: final loss {run["losses"][-1]:.4f}, NaN steps {run["nan_count"]}, '
                  f'held-out accuracy {run["test_accuracy"]:.3f}, {run["seconds"]:.1f} s', flush=True)
            runs.append(run)
    ratios = {}
    for name in args.recipes:
        own, kfc = (next(r for r in runs if r["recipe"] == name and r["convention"] == c)
                    for c in (specs[name]["convention"], "kfc"))
        ratios[name] = own["losses"][-1] / kfc["losses"][-1] if kfc["losses"][-1] else float("nan")
    payload = {"args": dict(vars(args)), "recipes": specs,
               "runs": runs, "final_loss_ratio_own_convention_over_kfc": ratios,
               "nan_counts": {f'{r["recipe"]}/{r["convention"]}': r["nan_count"] for r in runs}}
    plot_record(read_json(write_json(args.out + ".json", payload)), args.out + ".json")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
