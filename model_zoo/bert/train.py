"""Masked-LM pretraining of BERT on plain text files, with ms_optim's Lamb (default) or THOR.

    python model_zoo/bert/train.py --data corpus.txt --config tiny --vocab-size 2000 --epochs 1
    python model_zoo/bert/train.py --data a.txt b.txt --vocab vocab.txt --config base --optimizer thor

Lamb: decoupled weight decay on every weight but biases and LayerNorm, learning rate warmed up
linearly then decayed linearly to 0 (a per-step ``Tensor``). THOR: ``ms_optim.nn.thor`` converts the
embeddings to ``EmbeddingThor`` and every dense layer to ``DenseThor``; LayerNorm gamma/beta get THOR's
diagonal rule; the model goes through ``ConvertModelUtils.convert_to_thor_model`` and trains with the
THOR model's data-sink loop. Training prints one progress line per sink (or step), saves checkpoints
into ``--output-dir`` and a final one at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
try:
    import ms_optim  # noqa: F401
except ImportError:  # running from a source checkout without `pip install`
    sys.path.insert(1, os.path.dirname(os.path.dirname(HERE)))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn as ms_nn  # noqa: E402
from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint  # noqa: E402

import bert_data  # noqa: E402
import bert_model  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="BERT masked-LM pretraining with ms_optim's Lamb or THOR.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--data", nargs="+", required=True, help="plain text files (one or more sentences per line)")
    data.add_argument("--vocab", default=None, help="WordPiece vocab.txt to use; without it one is learned "
                      "from --data and written to --output-dir/vocab.txt")
    data.add_argument("--vocab-size", type=int, default=30522, help="size of the learned vocabulary")
    data.add_argument("--seq-length", type=int, default=128)
    data.add_argument("--max-predictions", type=int, default=20, help="masked tokens per sequence at most")
    data.add_argument("--batch-size", type=int, default=32)
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(bert_model.CONFIGS), default="base")
    model.add_argument("--dropout", type=float, default=None, help="override both dropout probabilities")
    train = parser.add_argument_group("training")
    train.add_argument("--optimizer", choices=["lamb", "thor"], default="lamb")
    train.add_argument("--epochs", type=int, default=1)
    train.add_argument("--steps-per-epoch", type=int, default=-1,
                       help="steps per epoch (the data sink size); -1: the whole dataset")
    train.add_argument("--lr", type=float, default=None, help="peak learning rate (Lamb 1e-3, THOR 1e-2)")
    train.add_argument("--warmup-steps", type=int, default=0)
    train.add_argument("--weight-decay", type=float, default=0.01)
    train.add_argument("--momentum", type=float, default=0.9, help="THOR only")
    train.add_argument("--damping", type=float, default=5e-2, help="THOR only: initial damping")
    train.add_argument("--damping-decay", type=float, default=0.5, help="THOR only: damping at the last step "
                       "is damping * damping_decay")
    train.add_argument("--frequency", type=int, default=100, help="THOR only: steps between factor updates")
    train.add_argument("--loss-scale", type=float, default=1.0)
    train.add_argument("--no-sink", dest="sink", action="store_false", help="step-by-step instead of data sink")
    run = parser.add_argument_group("run")
    run.add_argument("--output-dir", default="bert_output", help="vocabulary and checkpoints")
    run.add_argument("--save-steps", type=int, default=1000, help="checkpoint every N steps")
    run.add_argument("--keep-checkpoints", type=int, default=3)
    run.add_argument("--device-target", default="CPU", choices=["CPU", "GPU", "Ascend"])
    run.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    run.add_argument("--seed", type=int, default=1)
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


class Progress(Callback):
    """One line per step end (one per sink in data-sink mode): epoch, step, loss, ms per step."""

    def __init__(self, total_steps: int, log=print):
        super().__init__()
        self.total_steps = total_steps
        self.log = log
        self.losses: List[float] = []
        self._last_step = 0
        self._last_time = time.time()

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        loss = params.net_outputs
        if isinstance(loss, (tuple, list)):
            loss = loss[0]
        loss = float(np.asarray(loss.asnumpy() if hasattr(loss, "asnumpy") else loss).reshape(-1)[0])
        self.losses.append(loss)
        step = params.cur_step_num
        now = time.time()
        per_step = (now - self._last_time) * 1000.0 / max(step - self._last_step, 1)
        self._last_step, self._last_time = step, now
        self.log(f"epoch {params.cur_epoch_num}/{params.epoch_num} step {step}/{self.total_steps} "
                 f"loss {loss:.4f} {per_step:.1f} ms/step", flush=True)


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


def main(argv: Optional[List[str]] = None) -> Dict:
    """Train; returns {'losses', 'checkpoint', 'vocab', 'steps', 'network'} (a JSON summary is printed)."""
    args = parse_args(argv)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE,
                   device_target=args.device_target)
    ms.set_seed(args.seed)
    ms.dataset.config.set_seed(args.seed)
    os.makedirs(args.output_dir, exist_ok=True)

    vocab = args.vocab or bert_data.train_vocab(args.data, args.output_dir, vocab_size=args.vocab_size,
                                                min_frequency=1)
    tokenizer = bert_data.load_tokenizer(vocab)
    dataset = bert_data.create_dataset(args.data, tokenizer, seq_length=args.seq_length,
                                       batch_size=args.batch_size, max_predictions=args.max_predictions,
                                       seed=args.seed)
    batches = dataset.get_dataset_size()
    steps_per_epoch = batches if args.steps_per_epoch <= 0 else args.steps_per_epoch
    if steps_per_epoch > batches:
        dataset = dataset.repeat(math.ceil(steps_per_epoch / batches))
    if steps_per_epoch != batches:
        # An epoch is exactly steps_per_epoch batches, whichever loop runs it (MindSpore's Model falls
        # back to step-by-step on CPU and would ignore sink_size).
        dataset = dataset.take(steps_per_epoch)
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
    print(f"BERT-{args.config}: {sum(p.size for p in net_with_loss.trainable_params())} parameters, "
          f"vocab {config.vocab_size}, {batches} batches of {args.batch_size}x{args.seq_length}, "
          f"{args.optimizer} for {total_steps} steps ({'sink' if args.sink else 'no sink'})", flush=True)

    loss_scale_manager = None
    if args.loss_scale != 1.0:
        loss_scale_manager = ms.FixedLossScaleManager(args.loss_scale, drop_overflow_update=False)
    model = Model(net_with_loss, optimizer=optimizer, loss_scale_manager=loss_scale_manager)
    if args.optimizer == "thor":
        from ms_optim.train_thor import ConvertModelUtils

        model = ConvertModelUtils.convert_to_thor_model(model, network=net_with_loss, optimizer=optimizer,
                                                        loss_scale_manager=loss_scale_manager)

    progress = Progress(total_steps)
    prefix = f"bert_{args.config}_{args.optimizer}"
    checkpoint = ModelCheckpoint(prefix=prefix, directory=args.output_dir,
                                 config=CheckpointConfig(save_checkpoint_steps=args.save_steps,
                                                         keep_checkpoint_max=args.keep_checkpoints))
    model.train(args.epochs, dataset, callbacks=[progress, checkpoint], dataset_sink_mode=args.sink)
    final = os.path.join(args.output_dir, f"{prefix}_final.ckpt")
    ms.save_checkpoint(net_with_loss, final)
    result = {"losses": progress.losses, "checkpoint": final, "vocab": vocab, "steps": total_steps,
              "network": net_with_loss}
    print(json.dumps({"final_loss": progress.losses[-1] if progress.losses else None, "checkpoint": final}),
          flush=True)
    return result


if __name__ == "__main__":
    main()
