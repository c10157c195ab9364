"""Train LeNet5 on scikit-learn's digits (32x32, held-out 20%) with THOR or a first-order optimizer.

Examples:
    python model_zoo/lenet/train.py --optimizer thor --epochs 5
    python model_zoo/lenet/train.py --optimizer momentum --lr 0.1 --epochs 5 --json out.json

The test accuracy is measured every ``--eval-every`` steps on the whole held-out set; the training
clock is paused while it is measured, so "time to X%" is training time only (graph compilation
included). THOR runs through ``ConvertModelUtils.convert_to_thor_model`` and the THOR model's
dataset-sink loop; the other optimizers through ``mindspore.train.Model``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

OPTIMIZERS = ("thor", "momentum", "lamb", "lars", "asgd")
DEFAULT_LR = {"thor": 0.1, "momentum": 0.1, "lamb": 0.01, "lars": 0.1, "asgd": 0.1}
THOR_DEFAULTS = {"damping": 0.01, "frequency": 20, "weight_decay": 1e-4, "clip": True, "lr_decay": 2.0}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="thor", help="optimizer to train with")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (45 steps each at batch 32)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default per optimizer: " +
                             ", ".join(f"{k} {v}" for k, v in DEFAULT_LR.items()) + ")")
    parser.add_argument("--damping", type=float, default=THOR_DEFAULTS["damping"], help="THOR damping")
    parser.add_argument("--frequency", type=int, default=THOR_DEFAULTS["frequency"],
                        help="THOR: recompute factors and inverses every this many steps")
    parser.add_argument("--lr-decay", type=float, default=THOR_DEFAULTS["lr_decay"],
                        help="THOR: power of the polynomial decay of lr to 0 over the run (0: constant lr)")
    parser.add_argument("--no-clip", action="store_true", help="THOR: no per-tensor gradient clipping")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights and the batch order")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the train/test split")
    parser.add_argument("--eval-every", type=int, default=9, help="steps between test-accuracy measurements")
    parser.add_argument("--target", type=float, default=0.97, help="accuracy whose time-to-reach is reported")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    parser.add_argument("--stop-at-target", action="store_true", help="stop as soon as --target is reached")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop once training took this long")
    parser.add_argument("--json", default=None, help="write the result (history included) to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="print only the final line")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.eval_every < 1 or args.frequency < 2:
        parser.error("--epochs, --batch-size and --eval-every must be >= 1 and --frequency >= 2")
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    return args


def make_optimizer(name: str, net, lr: float, total_steps: int, batch_size: int,
                   damping: float = THOR_DEFAULTS["damping"], frequency: int = THOR_DEFAULTS["frequency"],
                   clip: bool = THOR_DEFAULTS["clip"], lr_decay: float = THOR_DEFAULTS["lr_decay"]):
    """Build the optimizer ``name`` for ``net`` (THOR gets constant per-step lr and damping Tensors)."""
    import numpy as np
    from mindspore import Tensor

    from ms_optim import nn

    params = net.trainable_params()
    if name == "thor":
        from ms_optim.thor.schedules import get_thor_lr

        # lr_decay 0: constant; otherwise the model zoo's polynomial decay, counted in steps here
        lr_t = Tensor(get_thor_lr(0, lr, lr_decay, total_steps, 1, decay_epochs=total_steps + 2))
        damping_t = Tensor(np.full((total_steps,), damping, np.float32))
        return nn.thor(net, lr_t, damping_t, 0.9, weight_decay=THOR_DEFAULTS["weight_decay"],
                       batch_size=batch_size, frequency=frequency, enable_clip_grad=clip)
    if name == "momentum":
        return nn.Momentum(params, lr, 0.9)
    if name == "lamb":
        return nn.Lamb(params, lr)
    if name == "lars":
        return nn.LARS(nn.Momentum(params, lr, 0.9))
    if name == "asgd":
        return nn.ASGD(params, lr)
    raise ValueError(f"unknown optimizer {name!r}")


def _absorb_numpy_bridge_failure() -> None:
    """MindSpore 2.10 with NumPy 2: the first PYNATIVE op through MindSpore's NumPy bridge fails once
    (later ones work) and prints a long "compiled using NumPy 1.x" notice. Take that one-time failure
    here with stderr silenced, so the training output stays readable."""
    import numpy as np
    from mindspore import Tensor

    sys.stderr.flush()
    fd = sys.stderr.fileno()
    saved, devnull = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        _ = Tensor(np.ones(1, np.float32)) * 1.0
    except (SystemError, ImportError):
        pass
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def run(optimizer: str = "thor", epochs: int = 5, batch_size: int = 32, lr: Optional[float] = None,
        damping: float = THOR_DEFAULTS["damping"], frequency: int = THOR_DEFAULTS["frequency"], seed: int = 1,
        split_seed: int = 0, eval_every: int = 9, target: float = 0.97, mode: str = "graph",
        stop_at_target: bool = False, quiet: bool = False, max_seconds: Optional[float] = None,
        clip: bool = THOR_DEFAULTS["clip"], lr_decay: float = THOR_DEFAULTS["lr_decay"]) -> Dict:
    """Train once; return final loss, test accuracy, training seconds and the accuracy history."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor
    from mindspore import nn as ms_nn
    from mindspore.train import Callback, Model

    from model_zoo.lenet.dataset import create_dataset, load_digits_32
    from model_zoo.lenet.lenet import LeNet5
    from ms_optim.train_thor import ConvertModelUtils

    lr = DEFAULT_LR[optimizer] if lr is None else lr
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    _absorb_numpy_bridge_failure()
    ms.set_seed(seed)
    x_tr, y_tr, x_te, y_te = load_digits_32(seed=split_seed)
    train_ds = create_dataset(x_tr, y_tr, batch_size=batch_size, seed=seed)
    steps_per_epoch = train_ds.get_dataset_size()
    sink = optimizer == "thor"  # THOR: the THOR model's sink loop, one sink between two evaluations
    sinks = -(-epochs * steps_per_epoch // eval_every)
    total_steps = sinks * eval_every if sink else epochs * steps_per_epoch
    net = LeNet5()
    loss = ms_nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = make_optimizer(optimizer, net, lr, total_steps, batch_size, damping, frequency, clip, lr_decay)
    model = Model(net, loss_fn=loss, optimizer=opt)
    model = ConvertModelUtils.convert_to_thor_model(model, network=net, loss_fn=loss, optimizer=opt)
    x_test = Tensor(x_te)

    history: List[Dict] = []
    state = {"paused": 0.0, "start": 0.0, "last_eval": 0, "hit": None, "loss": float("nan"), "capped": False}

    def accuracy() -> float:
        net.set_train(False)
        logits = net(x_test).asnumpy()
        net.set_train(True)
        return float(np.mean(np.argmax(logits, axis=1) == y_te))

    class _Eval(Callback):
        def on_train_step_end(self, run_context):
            params = run_context.original_args()
            step = params.cur_step_num
            out = params.net_outputs
            state["loss"] = float((out[0] if isinstance(out, (tuple, list)) else out).asnumpy())
            if step - state["last_eval"] < eval_every and step < total_steps:
                return
            pause = time.perf_counter()
            seconds = pause - state["start"] - state["paused"]
            acc = accuracy()
            state["last_eval"] = step
            history.append({"step": step, "seconds": seconds, "test_accuracy": acc, "loss": state["loss"]})
            if acc >= target and state["hit"] is None:
                state["hit"] = seconds
                if stop_at_target:
                    run_context.request_stop()
            if max_seconds is not None and seconds >= max_seconds:
                state["capped"] = True
                run_context.request_stop()
            if not quiet:
                print(f"[{optimizer}] epoch {-(-step // steps_per_epoch)} step {step}/{total_steps} "
                      f"loss {state['loss']:.4f} test_acc {acc:.4f} t {seconds:.2f}s", flush=True)
            state["paused"] += time.perf_counter() - pause

    state["start"] = time.perf_counter()
    model.train(sinks if sink else epochs, train_ds, callbacks=[_Eval()], dataset_sink_mode=sink,
                sink_size=eval_every if sink else -1)
    seconds = time.perf_counter() - state["start"] - state["paused"]
    final_acc = history[-1]["test_accuracy"] if history else accuracy()
    return {"optimizer": optimizer, "lr": lr, "epochs": epochs, "batch_size": batch_size, "seed": seed,
            "steps": history[-1]["step"] if history else 0, "final_loss": state["loss"],
            "test_accuracy": final_acc, "train_seconds": seconds, "target": target,
            "seconds_to_target": state["hit"], "stopped_by_time_cap": state["capped"], "history": history,
            **({"damping": damping, "frequency": frequency} if optimizer == "thor" else {})}


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    result = run(args.optimizer, args.epochs, args.batch_size, args.lr, args.damping, args.frequency, args.seed,
                 args.split_seed, args.eval_every, args.target, args.mode, args.stop_at_target, args.quiet,
                 args.max_seconds, not args.no_clip, args.lr_decay)
    hit = result["seconds_to_target"]
    print(f"[{args.optimizer}] final loss {result['final_loss']:.4f}, test accuracy {result['test_accuracy']:.4f}, "
          f"{result['train_seconds']:.1f}s training, time to {args.target:.0%}: "
          f"{'not reached' if hit is None else f'{hit:.1f}s'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
