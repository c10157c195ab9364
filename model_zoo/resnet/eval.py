"""Evaluate a ResNet checkpoint written by train.py (THOR or Momentum): top-1 and top-5 accuracy.

Example:
    python eval.py --config_path configs/resnet50_imagenet2012_thor_ascend.yaml \\
        --data_path /data/imagenet/val --checkpoint_path ./output/ckpt_0/resnet50-45_5004.ckpt --device_target Ascend

DATA_PATH is the eval split: an ImageFolder tree (resize to image_size/0.875, center crop image_size) or
a CIFAR-10 binary folder with test_batch.bin. Config keys can be overridden like in train.py
(e.g. --eval_batch_size=64). Prints one line ``top1 <acc> top5 <acc> images <n>``; with --output_json the
same numbers go to a JSON file. Bad input: a one-line error and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
# Bootstrap, identical in every model_zoo entry point (model_zoo/README.md, "Imports"): run as a file,
# this folder would be sys.path[0] and its modules importable under bare names; the repository root
# takes its place, so each module has one name (model_zoo.<model>...) and a checkout's ms_optim wins.
if not __package__:
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
        del sys.path[0]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

from model_zoo.resnet.src.cli import (  # noqa: E402
    ZooArgumentParser,
    add_config_options,
    config_overrides,
    run_main,
)
from model_zoo.resnet.src.config import ConfigError, load_config  # noqa: E402
from model_zoo.resnet.src.dataset import check_data_path  # noqa: E402

PROG = "eval.py"


def build_parser() -> ZooArgumentParser:
    parser = ZooArgumentParser(prog=PROG, description=__doc__, allow_abbrev=False,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", required=True, help="YAML config the checkpoint was trained with")
    parser.add_argument("--data_path", required=True, help="eval data (ImageFolder tree or CIFAR-10 folder)")
    parser.add_argument("--checkpoint_path", required=True, help="checkpoint (.ckpt) written by train.py")
    parser.add_argument("--device_target", default="CPU", choices=["Ascend", "GPU", "CPU"],
                        help="backend (default CPU)")
    parser.add_argument("--eval_steps", type=int, default=0,
                        help="evaluate only the first N batches (0 = the whole eval set; for smoke tests)")
    parser.add_argument("--output_json", default=None, help="also write the result to this JSON file")
    add_config_options(parser)
    return parser


def _check_output_json(path: str) -> None:
    """The result file can be written (checked before the evaluation, which may take hours)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"--output_json is a directory: {path}")
    if not os.path.isdir(folder):
        raise ConfigError(f"--output_json: directory does not exist: {folder}")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--output_json: directory is not writable: {folder}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    config = load_config(args.config_path, config_overrides(args))
    _, images = check_data_path(args.data_path, config["dataset"], training=False)
    if not os.path.isfile(args.checkpoint_path):
        raise ConfigError(f"--checkpoint_path not found: {args.checkpoint_path}")
    if args.eval_steps < 0:
        raise ConfigError(f"--eval_steps must be >= 0, got {args.eval_steps}")
    if args.output_json:
        _check_output_json(args.output_json)

    import mindspore as ms
    from mindspore.train import Model

    from model_zoo.resnet.src.dataset import create_dataset
    from model_zoo.resnet.src.trainer import build_loss, build_network, setup_context

    setup_context(args.device_target, config["mode"], distributed=False)
    net = build_network(config)
    try:
        state = ms.load_checkpoint(args.checkpoint_path)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"--checkpoint_path {args.checkpoint_path} is not a readable checkpoint "
                          f"({str(exc).splitlines()[0]})") from None
    missing = []
    for _, param in net.parameters_and_names():
        if param.name not in state:
            missing.append(param.name)
        elif tuple(state[param.name].shape) != tuple(param.shape):
            raise ConfigError(f"--checkpoint_path: '{param.name}' has shape {tuple(state[param.name].shape)}, "
                              f"the configured network has {tuple(param.shape)} (wrong config?)")
    if missing:
        raise ConfigError(f"--checkpoint_path lacks {len(missing)} network parameters, e.g. '{missing[0]}' "
                          f"(wrong config?)")
    ms.load_param_into_net(net, state, strict_load=True)
    net.set_train(False)
    data = create_dataset(args.data_path, config["dataset"], False, config["eval_batch_size"],
                          config["image_size"], num_parallel_workers=config["num_parallel_workers"],
                          steps=args.eval_steps or None)
    count = data.get_dataset_size() * config["eval_batch_size"]
    metrics = {"top_1_accuracy"} | ({"top_5_accuracy"} if config["class_num"] >= 5 else set())
    model = Model(net, loss_fn=build_loss(config), metrics=metrics)
    result = model.eval(data, dataset_sink_mode=False)
    top1 = float(result["top_1_accuracy"])
    top5 = float(result.get("top_5_accuracy", float("nan")))
    print(f"checkpoint {args.checkpoint_path}: top1 {top1:.4f} top5 {top5:.4f} images {min(count, images)}",
          flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as handle:
            json.dump({"checkpoint": args.checkpoint_path, "top1": top1, "top5": top5,
                       "images": int(min(count, images)), "net": config["net"]}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, PROG))
