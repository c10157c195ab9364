"""Train LeNet5 on scikit-learn's digits (32x32, held-out 20%) with THOR or a first-order optimizer.

Examples:
    python model_zoo/lenet/train.py --optimizer thor --epochs 5
    python model_zoo/lenet/train.py --optimizer momentum --lr 0.1 --epochs 5 --json out.json
    python model_zoo/lenet/train.py --optimizer lamb --checkpoint lenet_lamb.ckpt
    python model_zoo/lenet/train.py --optimizer thor_adaptive --epochs 5     # no learning rate to choose

The test accuracy is measured every ``--eval-every`` steps on the whole held-out set; the training
clock is paused while it is measured, so "time to X%" is training time only (graph compilation
included). Progress: a bar on an interactive terminal, one line per epoch otherwise. THOR runs
through ``ConvertModelUtils.convert_to_thor_model`` and the THOR model's dataset-sink loop; the other
optimizers through ``mindspore.train.Model``. The default learning rates are the ones chosen by
``tune.py`` (recorded in ``tuned_lr.json``); ``thor_adaptive`` is THOR's call with ``learning_rate`` and
``damping`` ``"adaptive"`` (recipe-free THOR: no learning rate, damping or schedule to choose). A run
whose loss or state becomes non-finite stops with a one-line error and exit code 1; ``--checkpoint`` is
only ever overwritten with finite state.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

from model_zoo.common.cli import OneLineArgumentParser, TrainingFailed, run_main  # noqa: E402

OPTIMIZERS = ("thor", "momentum", "lamb", "lars", "asgd")  # each with a tuned learning rate
#: THOR's call with learning_rate and damping "adaptive": no learning rate from any grid
THOR_ADAPTIVE = "thor_adaptive"
ALL_OPTIMIZERS = OPTIMIZERS + (THOR_ADAPTIVE,)
THOR_KINDS = ("thor", THOR_ADAPTIVE)
ADAPTIVE = "adaptive"
LABELS = {"thor": "THOR", "momentum": "Momentum", "lamb": "Lamb", "lars": "LARS(Momentum)", "asgd": "ASGD",
          THOR_ADAPTIVE: "THOR adaptive"}
# THOR's recipe (model_zoo/lenet/README.md, "Recipe"). The robustness grid's best LeNet5 cell (Ascend convention,
# kl_clip 1e-3, constant lr, no per-tensor clipping) was measured against it and did not beat it on validation.
THOR_DEFAULTS = {"damping": 0.01, "frequency": 20, "weight_decay": 1e-4, "clip": True, "lr_decay": 2.0,
                 "kl_clip": None, "factor_convention": "auto"}
FACTOR_CONVENTIONS = ("auto", "gpu", "ascend", "kfc")
FLOAT32_MAX = 3.4028234663852886e38  # thor() refuses a kl_clip its float32 state cannot hold
EPOCHS = 5          # the quickstart's budget per optimizer (and the tuning budget of tune.py)
EVAL_EVERY = 11     # 44 steps per epoch at batch 32: four measurements per epoch
TUNED_LR_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned_lr.json")


def thor_recipe(**overrides) -> Dict[str, Any]:
    """THOR's recipe as keyword arguments of :func:`run` (``THOR_DEFAULTS`` but the weight decay, which
    ``make_optimizer`` reads itself), with ``overrides`` applied: one recipe for train.py, compare.py and tune.py."""
    recipe = {k: v for k, v in THOR_DEFAULTS.items() if k != "weight_decay"}
    unknown = set(overrides) - set(recipe)
    if unknown:
        raise TypeError(f"thor_recipe: unknown THOR setting(s) {sorted(unknown)}")
    recipe.update(overrides)
    return recipe


def format_lr(lr) -> str:
    """A run's learning rate as tables and legends show it (``"adaptive"`` for recipe-free THOR)."""
    return lr if isinstance(lr, str) else f"{lr:g}"


def tuned_lr(path: str = TUNED_LR_FILE) -> Dict[str, float]:
    """The learning rate per optimizer chosen by ``tune.py`` (read from ``tuned_lr.json``)."""
    with open(path, encoding="utf-8") as f:
        return {name: float(lr) for name, lr in json.load(f)["lr"].items()}


def _finite(kind: str, low: float, strict: bool = True, high: Optional[float] = None):
    """argparse type: a float that is finite, above ``low`` (or equal when not strict), at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        above = value > low if strict else value >= low
        if not (math.isfinite(value) and above and (high is None or value <= high)):
            bound = f"{'>' if strict else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")
            raise argparse.ArgumentTypeError(f"{kind} must be finite and {bound}, got {text}")
        return value

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_kl_clip(text: str) -> Optional[float]:
    """argparse type of --kl-clip: "none" (no KL clipping) or a finite float > 0 that fits float32."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or 'none', got {text!r}") from None
    if not (math.isfinite(value) and 0.0 < value <= FLOAT32_MAX):
        raise argparse.ArgumentTypeError(f"kl-clip must be 'none' or finite, > 0 and <= {FLOAT32_MAX:g}, got {text}")
    return value


def check_output_path(parser: argparse.ArgumentParser, option: str, path: Optional[str]) -> None:
    """Refuse (before training) an output file whose directory does not exist or is a directory itself."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder):
        parser.error(f"{option}: cannot write {path!r} (not a file in an existing directory)")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="train.py", description=__doc__.splitlines()[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--optimizer", choices=ALL_OPTIMIZERS, default="thor",
                        help=f"optimizer to train with ({THOR_ADAPTIVE}: THOR with learning_rate and damping "
                             f"'adaptive', no --lr or --damping)")
    parser.add_argument("--epochs", type=_positive_int, default=EPOCHS,
                        help="training epochs (44 steps each at batch 32)")
    parser.add_argument("--batch-size", type=_positive_int, default=32, help="batch size")
    parser.add_argument("--lr", type=_finite("learning rate", 0.0), default=None,
                        help="learning rate (default: the optimizer's entry in tuned_lr.json)")
    parser.add_argument("--damping", type=_finite("damping", 0.0), default=None,
                        help=f"THOR damping (its scale depends on --factor-convention; default "
                             f"{THOR_DEFAULTS['damping']})")
    parser.add_argument("--frequency", type=_positive_int, default=THOR_DEFAULTS["frequency"],
                        help="THOR: recompute factors and inverses every this many steps (>= 2)")
    parser.add_argument("--lr-decay", type=_finite("lr-decay", 0.0, strict=False), default=THOR_DEFAULTS["lr_decay"],
                        help="THOR: power of the polynomial decay of lr to 0 over the run (0: constant lr)")
    parser.add_argument("--clip", action=argparse.BooleanOptionalAction, default=THOR_DEFAULTS["clip"],
                        help="THOR: per-tensor gradient clipping (enable_clip_grad)")
    parser.add_argument("--kl-clip", type=parse_kl_clip, default=THOR_DEFAULTS["kl_clip"], metavar="C|none",
                        help="THOR: KL clipping, every preconditioned gradient v scaled by "
                             "min(1, sqrt(C / (lr^2 |sum v.g|))); C a float > 0, or 'none' for no KL clipping")
    parser.add_argument("--factor-convention", choices=FACTOR_CONVENTIONS, default=THOR_DEFAULTS["factor_convention"],
                        help="THOR: normalisation of the factors A, G and the damping: MindSpore's GPU or Ascend "
                             "THOR, or ms_optim's KFC formulas; auto = the device target's (kfc on CPU)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights and the batch order")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the train/test split")
    parser.add_argument("--eval-every", type=_positive_int, default=EVAL_EVERY,
                        help="steps between test-accuracy measurements")
    parser.add_argument("--target", type=_finite("target", 0.0, high=1.0), default=0.97,
                        help="accuracy whose time-to-reach is reported")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    parser.add_argument("--stop-at-target", action="store_true", help="stop as soon as --target is reached")
    parser.add_argument("--max-seconds", type=_finite("max-seconds", 0.0), default=None,
                        help="stop once training took this long")
    parser.add_argument("--json", default=None, help="write the result (history included) to this JSON file")
    parser.add_argument("--checkpoint", default=None,
                        help="checkpoint file rewritten after each measurement (parameters and optimizer state, "
                             "finite only)")
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    args = parser.parse_args(argv)
    if args.frequency < 2:
        parser.error(f"argument --frequency: must be >= 2, got {args.frequency}")
    check_output_path(parser, "--json", args.json)
    check_output_path(parser, "--checkpoint", args.checkpoint)
    if args.optimizer == THOR_ADAPTIVE:
        if args.lr is not None or args.damping is not None:
            parser.error(f"--optimizer {THOR_ADAPTIVE} chooses its own learning rate and damping: "
                         f"give no --lr or --damping")
        args.lr = ADAPTIVE
    if args.damping is None:
        args.damping = THOR_DEFAULTS["damping"]
    if args.lr is None:
        try:
            args.lr = tuned_lr()[args.optimizer]
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"no --lr given and no tuned lr for {args.optimizer} in {TUNED_LR_FILE} ({exc!r}): "
                         "run model_zoo/lenet/tune.py")
    return args


def thor_lr_schedule(lr: float, power: float, total_steps: int):
    """Per-step THOR learning rate: lr * (1 - (s+1)/total_steps)**power (power 0: constant)."""
    import numpy as np

    steps = np.arange(1, total_steps + 1, dtype=np.float64)
    return (lr * np.clip(1.0 - steps / total_steps, 0.0, None) ** power).astype(np.float32)


def make_optimizer(name: str, net, lr: float, total_steps: int, batch_size: int,
                   damping: float = THOR_DEFAULTS["damping"], frequency: int = THOR_DEFAULTS["frequency"],
                   clip: bool = THOR_DEFAULTS["clip"], lr_decay: float = THOR_DEFAULTS["lr_decay"],
                   kl_clip: Optional[float] = THOR_DEFAULTS["kl_clip"],
                   factor_convention: str = THOR_DEFAULTS["factor_convention"]):
    """Build the optimizer ``name`` for ``net`` (THOR gets per-step lr and damping Tensors, ``kl_clip`` and
    ``factor_convention``; the first-order optimizers ignore the THOR arguments)."""
    import numpy as np
    from mindspore import Tensor

    from ms_optim import nn

    params = net.trainable_params()
    if name in THOR_KINDS:  # thor_adaptive: the same call, with no lr or damping schedule
        lr_t = Tensor(thor_lr_schedule(lr, lr_decay, total_steps)) if name == "thor" else ADAPTIVE
        damping_t = Tensor(np.full((total_steps,), damping, np.float32)) if name == "thor" else ADAPTIVE
        return nn.thor(net, lr_t, damping_t, 0.9, weight_decay=THOR_DEFAULTS["weight_decay"],
                       batch_size=batch_size, frequency=frequency, enable_clip_grad=clip, kl_clip=kl_clip,
                       factor_convention=factor_convention)
    if name == "momentum":
        return nn.Momentum(params, lr, 0.9)
    if name == "lamb":
        return nn.Lamb(params, lr)
    if name == "lars":
        return nn.LARS(nn.Momentum(params, lr, 0.9))
    if name == "asgd":
        return nn.ASGD(params, lr)
    raise ValueError(f"unknown optimizer {name!r}")


Data = Tuple[Any, Any, Any, Any]


def run(optimizer: str = "thor", epochs: int = EPOCHS, batch_size: int = 32, lr: Optional[float] = None,
        damping: float = THOR_DEFAULTS["damping"], frequency: int = THOR_DEFAULTS["frequency"], seed: int = 1,
        split_seed: int = 0, eval_every: int = EVAL_EVERY, target: float = 0.97, mode: str = "graph",
        stop_at_target: bool = False, quiet: bool = False, max_seconds: Optional[float] = None,
        clip: bool = THOR_DEFAULTS["clip"], lr_decay: float = THOR_DEFAULTS["lr_decay"],
        data: Optional[Data] = None, checkpoint: Optional[str] = None, label: Optional[str] = None,
        kl_clip: Optional[float] = THOR_DEFAULTS["kl_clip"],
        factor_convention: str = THOR_DEFAULTS["factor_convention"]) -> Dict:
    """Train once; return final loss, test accuracy, training seconds and the accuracy history.

    ``data`` replaces the digits split with ``(x_train, y_train, x_test, y_test)`` (tune.py passes a
    validation split as the test set). The result's ``diverged`` is the first step whose loss or state
    was not finite (None when the run stayed finite); training stops there.
    """
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor
    from mindspore import nn as ms_nn
    from mindspore.train import Model

    from model_zoo.lenet.callbacks import AccuracyMonitor, ProgressMonitor, all_finite
    from model_zoo.lenet.dataset import create_dataset, load_digits_32
    from model_zoo.lenet.lenet import LeNet5
    from ms_optim._bridge import prime_numpy_bridge
    from ms_optim.train_thor import ConvertModelUtils

    lr = ADAPTIVE if optimizer == THOR_ADAPTIVE else tuned_lr()[optimizer] if lr is None else lr
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    prime_numpy_bridge()
    ms.set_seed(seed)
    x_tr, y_tr, x_te, y_te = load_digits_32(seed=split_seed) if data is None else data
    train_ds = create_dataset(x_tr, y_tr, batch_size=batch_size, seed=seed)
    steps_per_epoch = train_ds.get_dataset_size()
    sink = optimizer in THOR_KINDS  # THOR: the THOR model's sink loop, one sink between two evaluations
    sinks = -(-epochs * steps_per_epoch // eval_every)
    total_steps = sinks * eval_every if sink else epochs * steps_per_epoch
    net = LeNet5()
    loss = ms_nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = make_optimizer(optimizer, net, lr, total_steps, batch_size, damping, frequency, clip, lr_decay,
                         kl_clip, factor_convention)
    model = Model(net, loss_fn=loss, optimizer=opt)
    model = ConvertModelUtils.convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
    x_test = Tensor(x_te)
    names = {p.name for p in net.get_parameters()}
    state = list(net.get_parameters()) + [p for p in opt.get_parameters() if p.name not in names]

    def accuracy() -> float:
        net.set_train(False)
        logits = net(x_test).asnumpy()
        net.set_train(True)
        return float(np.mean(np.argmax(logits, axis=1) == y_te))

    monitor = AccuracyMonitor(accuracy, eval_every, total_steps, target, stop_at_target, max_seconds,
                              state_params=state, checkpoint=checkpoint)
    callbacks = [monitor]
    if not quiet:
        callbacks.append(ProgressMonitor(label or optimizer, monitor, total_steps, steps_per_epoch))
    model.train(sinks if sink else epochs, train_ds, callbacks=callbacks, dataset_sink_mode=sink,
                sink_size=eval_every if sink else -1)
    seconds = monitor.seconds()
    if monitor.diverged is None and not all_finite(state):
        monitor.diverged = total_steps
    history = monitor.history
    final_acc = history[-1]["test_accuracy"] if history else float("nan")
    return {"optimizer": optimizer, "lr": lr, "epochs": epochs, "batch_size": batch_size, "seed": seed,
            "steps": history[-1]["step"] if history else 0, "final_loss": monitor.loss,
            "test_accuracy": final_acc, "train_seconds": seconds, "target": target,
            "seconds_to_target": monitor.seconds_to_target, "stopped_by_time_cap": monitor.capped,
            "diverged": monitor.diverged, "checkpoint_step": monitor.saved_step, "history": history,
            **({"damping": damping if optimizer == "thor" else ADAPTIVE, "frequency": frequency, "clip": clip,
                "lr_decay": lr_decay if optimizer == "thor" else None, "kl_clip": kl_clip,
                "factor_convention": opt.factor_convention} if optimizer in THOR_KINDS else {})}


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    result = run(args.optimizer, args.epochs, args.batch_size, args.lr, args.damping, args.frequency, args.seed,
                 args.split_seed, args.eval_every, args.target, args.mode, args.stop_at_target, args.quiet,
                 args.max_seconds, args.clip, args.lr_decay, checkpoint=args.checkpoint,
                 kl_clip=args.kl_clip, factor_convention=args.factor_convention)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if result["diverged"] is not None:
        kept = (f"kept the checkpoint of step {result['checkpoint_step']}" if result["checkpoint_step"]
                else "no checkpoint written")
        raise TrainingFailed(f"training diverged at step {result['diverged']} (non-finite loss or state, "
                             f"lr {format_lr(args.lr)}); {kept}")
    hit = result["seconds_to_target"]
    print(f"[{args.optimizer}] final loss {result['final_loss']:.4f}, test accuracy {result['test_accuracy']:.4f}, "
          f"{result['train_seconds']:.1f}s training, time to {args.target:.0%}: "
          f"{'not reached' if hit is None else f'{hit:.1f}s'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "train.py"))
