"""Masked-LM pretraining of BERT on plain text files, with ms_optim's Lamb (default) or THOR.

    python model_zoo/bert/train.py --data corpus.txt --config tiny --vocab-size 2000 --epochs 1
    python model_zoo/bert/train.py --data a.txt b.txt --vocab vocab.txt --config base --optimizer thor

Lamb: decoupled weight decay on every weight but biases and LayerNorm, learning rate warmed up
linearly then decayed linearly to 0 (a per-step ``Tensor``). THOR: ``ms_optim.nn.thor`` converts the
embeddings to ``EmbeddingThor`` and every dense layer to ``DenseThor``; LayerNorm gamma/beta get THOR's
diagonal rule; the model goes through ``ConvertModelUtils.convert_to_thor_model`` and trains with the
THOR model's data-sink loop. Training prints progress lines (every ``--log-interval`` steps, or once
per sink, and per epoch: loss, step, elapsed seconds, tokens/s), saves checkpoints of the network and
the optimizer state into ``--output-dir`` and the network's final one at the end.

Bad input (a missing or non-UTF-8 text file, a bad option value, too little text for one batch) is
one line on stderr and exit status 2, before anything is written. A checkpoint never holds a NaN or
inf: when the loss or the parameters become non-finite the run stops with one line on stderr and exit
status 1, keeping its last finite checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Optional

# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor  # noqa: E402
from mindspore import nn as ms_nn  # noqa: E402
from mindspore.train import Model  # noqa: E402

from model_zoo.bert import bert_data, bert_model  # noqa: E402
from model_zoo.common.checkpoint import FiniteCheckpoint, save_finite  # noqa: E402
from model_zoo.common.cli import InputError, OneLineArgumentParser, run_main  # noqa: E402
from model_zoo.common.context import set_device  # noqa: E402
from model_zoo.common.progress import LinePrinter, ProgressMonitor  # noqa: E402

PROG = "train.py"


def _number(kind, low: float, inclusive: bool = True, allow=()):
    """argparse type: ``kind`` (int or float), finite, >= low (or > low), or one of ``allow``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an int' if kind is int else 'a number'}, got {text!r}") \
                from None
        if value in allow:
            return value
        if not math.isfinite(value) or not (value >= low if inclusive else value > low):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {low:g}, got {text!r}")
        return value
    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROG, description="BERT masked-LM pretraining with ms_optim's Lamb or THOR.",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    data = parser.add_argument_group("data")
    data.add_argument("--data", nargs="+", required=True, help="plain text files (one or more sentences per line)")
    data.add_argument("--vocab", default=None, help="WordPiece vocab.txt to use; without it one is learned "
                      "from --data and written to --output-dir/vocab.txt")
    data.add_argument("--vocab-size", type=_number(int, 6), default=30522, help="size of the learned vocabulary")
    data.add_argument("--seq-length", type=_number(int, 4), default=128)
    data.add_argument("--max-predictions", type=_number(int, 1), default=20, help="masked tokens per sequence at most")
    data.add_argument("--batch-size", type=_number(int, 1), default=32)
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(bert_model.CONFIGS), default="base")
    model.add_argument("--dropout", type=_number(float, 0.0), default=None, help="override both dropout probabilities")
    train = parser.add_argument_group("training")
    train.add_argument("--optimizer", choices=["lamb", "thor"], default="lamb")
    train.add_argument("--epochs", type=_number(int, 1), default=1)
    train.add_argument("--steps-per-epoch", type=_number(int, 1, allow=(-1,)), default=-1,
                       help="steps per epoch (the data sink size); -1: the whole dataset")
    train.add_argument("--lr", type=_number(float, 0.0, inclusive=False), default=None,
                       help="peak learning rate (Lamb 1e-3, THOR 1e-2)")
    train.add_argument("--warmup-steps", type=_number(int, 0), default=0)
    train.add_argument("--weight-decay", type=_number(float, 0.0), default=0.01)
    train.add_argument("--momentum", type=_number(float, 0.0), default=0.9, help="THOR only")
    train.add_argument("--damping", type=_number(float, 0.0, inclusive=False), default=5e-2,
                       help="THOR only: initial damping")
    train.add_argument("--damping-decay", type=_number(float, 0.0, inclusive=False), default=0.5,
                       help="THOR only: damping at the last step is damping * damping_decay")
    train.add_argument("--frequency", type=_number(int, 2), default=100,
                       help="THOR only: steps between factor updates")
    train.add_argument("--loss-scale", type=_number(float, 1.0), default=1.0)
    train.add_argument("--no-sink", dest="sink", action="store_false", help="step-by-step instead of data sink")
    run = parser.add_argument_group("run")
    run.add_argument("--output-dir", default="bert_output", help="vocabulary and checkpoints")
    run.add_argument("--save-steps", type=_number(int, 1), default=1000, help="checkpoint every N steps")
    run.add_argument("--keep-checkpoints", type=_number(int, 1), default=3,
                     help="checkpoints kept (the newest; a finite one always stays)")
    run.add_argument("--device-target", default="CPU", choices=["CPU", "GPU", "Ascend"])
    run.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    run.add_argument("--seed", type=_number(int, 0), default=1)
    run.add_argument("--log-interval", type=_number(int, 1), default=1,
                     help="a progress line every N steps (and at the end of every epoch)")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == "lamb" else 1e-2
    return args


def lr_schedule(peak: float, total_steps: int, warmup_steps: int) -> np.ndarray:
    """Per-step learning rate: linear warm-up to ``peak`` over ``warmup_steps``, then linear decay to 0."""
    steps = np.arange(total_steps, dtype=np.float64)
    warm = peak * (steps + 1) / max(warmup_steps, 1)
    decay = peak * (total_steps - steps) / max(total_steps - warmup_steps, 1)
    return np.where(steps < warmup_steps, warm, decay).astype(np.float32)


def damping_schedule(initial: float, final_ratio: float, total_steps: int) -> np.ndarray:
    """Per-step damping decaying geometrically from ``initial`` to ``initial * final_ratio``."""
    fraction = np.arange(total_steps, dtype=np.float64) / max(total_steps - 1, 1)
    return (initial * final_ratio ** fraction).astype(np.float32)


def _no_decay(param) -> bool:
    name = param.name.lower()
    return "layer_norm" in name or "layernorm" in name or name.endswith(".bias") or name.endswith(".beta") \
        or name.endswith(".gamma")


def build_optimizer(args, net_with_loss: ms_nn.Cell, total_steps: int):
    """ms_optim's Lamb over parameter groups, or ms_optim's thor (which converts the network)."""
    from ms_optim import nn

    lr = Tensor(lr_schedule(args.lr, total_steps, args.warmup_steps))
    params = net_with_loss.trainable_params()
    if args.optimizer == "lamb":
        groups = [{"params": [p for p in params if not _no_decay(p)], "weight_decay": args.weight_decay},
                  {"params": [p for p in params if _no_decay(p)], "weight_decay": 0.0}]
        return nn.Lamb(groups, learning_rate=lr)
    damping = Tensor(damping_schedule(args.damping, args.damping_decay, total_steps))
    return nn.thor(net_with_loss, lr, damping, args.momentum, args.weight_decay, args.loss_scale,
                   args.batch_size, decay_filter=lambda p: not _no_decay(p), frequency=args.frequency)


def check_inputs(args: argparse.Namespace) -> None:
    """What can be checked before anything is built or written; raises InputError."""
    for path in args.data:
        if not os.path.isfile(path):
            raise InputError(f"--data: text file not found: {path}")
        if not os.access(path, os.R_OK):
            raise InputError(f"--data: text file not readable: {path}")
    if args.vocab is not None and not os.path.isfile(args.vocab):
        raise InputError(f"--vocab: file not found: {args.vocab}")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise InputError(f"--output-dir exists and is not a directory: {args.output_dir}")


def build_data(args: argparse.Namespace):
    """(tokenizer, dataset, batches, steps_per_epoch); nothing is written. Bad text -> InputError."""
    try:
        if args.vocab is not None:
            tokenizer = bert_data.load_tokenizer(args.vocab)
        else:
            tokenizer = bert_data.learn_tokenizer(args.data, vocab_size=args.vocab_size, min_frequency=1)
        dataset = bert_data.create_dataset(args.data, tokenizer, seq_length=args.seq_length,
                                           batch_size=args.batch_size, max_predictions=args.max_predictions,
                                           seed=args.seed)
    except (ValueError, OSError) as exc:
        raise InputError(str(exc).splitlines()[0]) from None
    batches = dataset.get_dataset_size()
    steps_per_epoch = batches if args.steps_per_epoch <= 0 else args.steps_per_epoch
    if steps_per_epoch > batches:
        dataset = dataset.repeat(math.ceil(steps_per_epoch / batches))
    if steps_per_epoch != batches:
        # An epoch is exactly steps_per_epoch batches, whichever loop runs it (MindSpore's Model falls
        # back to step-by-step on CPU and would ignore sink_size).
        dataset = dataset.take(steps_per_epoch)
    return tokenizer, dataset, batches, steps_per_epoch


def main(argv: Optional[List[str]] = None) -> Dict:
    """Train; returns {'losses', 'checkpoint', 'vocab', 'steps', 'network'} (a JSON summary is printed).
    Raises InputError (bad input, nothing written) or NonFiniteState (the run diverged)."""
    args = parse_args(argv)
    check_inputs(args)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    set_device(args.device_target)
    ms.set_seed(args.seed)
    ms.dataset.config.set_seed(args.seed)
    tokenizer, dataset, batches, steps_per_epoch = build_data(args)
    total_steps = steps_per_epoch * args.epochs

    overrides = {}
    if args.dropout is not None:
        overrides = dict(hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout)
    config = bert_model.get_config(args.config, tokenizer.get_vocab_size(),
                                   max_position_embeddings=max(args.seq_length,
                                                               bert_model.CONFIGS[args.config].max_position_embeddings),
                                   **overrides)
    net_with_loss = bert_model.BertPretrainingLoss(bert_model.BertForMaskedLM(config))
    optimizer = build_optimizer(args, net_with_loss, total_steps)
    log = LinePrinter()
    log(f"BERT-{args.config}: {sum(p.size for p in net_with_loss.trainable_params())} parameters, "
        f"vocab {config.vocab_size}, {batches} batches of {args.batch_size}x{args.seq_length}, "
        f"{args.optimizer} for {total_steps} steps ({'sink' if args.sink else 'no sink'})")

    loss_scale_manager = None
    if args.loss_scale != 1.0:
        loss_scale_manager = ms.FixedLossScaleManager(args.loss_scale, drop_overflow_update=False)
    model = Model(net_with_loss, optimizer=optimizer, loss_scale_manager=loss_scale_manager)
    if args.optimizer == "thor":
        from ms_optim.train_thor import ConvertModelUtils

        model = ConvertModelUtils.convert_to_thor_model(model, network=net_with_loss, optimizer=optimizer,
                                                        loss_scale_manager=loss_scale_manager)

    # Everything is built and checked: now the run may write.
    os.makedirs(args.output_dir, exist_ok=True)
    vocab = args.vocab or bert_data.save_vocab(tokenizer, args.output_dir)
    progress = ProgressMonitor(args.epochs, steps_per_epoch, args.batch_size * args.seq_length, args.log_interval,
                               unit="tokens", lr=lr_schedule(args.lr, total_steps, args.warmup_steps), printer=log)
    prefix = f"bert_{args.config}_{args.optimizer}"
    saver = FiniteCheckpoint(args.output_dir, prefix, (net_with_loss, optimizer), every=args.save_steps,
                             keep_max=args.keep_checkpoints, total_steps=total_steps, printer=log)
    model.train(args.epochs, dataset, callbacks=[progress, saver], dataset_sink_mode=args.sink)
    saver.raise_if_failed()
    final = os.path.join(args.output_dir, f"{prefix}_final.ckpt")
    save_finite((net_with_loss,), final)
    result = {"losses": progress.all_losses, "checkpoint": final, "vocab": vocab, "steps": total_steps,
              "network": net_with_loss}
    log(json.dumps({"final_loss": progress.all_losses[-1] if progress.all_losses else None, "checkpoint": final}))
    return result


if __name__ == "__main__":
    sys.exit(run_main(main, None, PROG))
