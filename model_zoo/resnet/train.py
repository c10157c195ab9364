"""Train ResNet-18/34/50/101 with ms_optim's THOR (or Momentum) on ImageNet or CIFAR-10.

The THOR path is the MindSpore model zoo's, with ms_optim's imports:

    from ms_optim import nn
    from ms_optim.train_thor import ConvertModelUtils
    opt = nn.thor(net, lr, Tensor(damping), momentum, weight_decay, loss_scale, batch_size,
                  split_indices=[26, 53], frequency=834)
    model = ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                      loss_scale_manager=..., metrics=..., amp_level=...,
                                                      keep_batchnorm_fp32=False)

Examples:
    python train.py --config_path configs/resnet50_imagenet2012_thor_ascend.yaml \\
        --data_path /data/imagenet/train --device_target Ascend --run_distribute
    python train.py --config_path configs/resnet18_cifar10_thor.yaml --data_path ./cifar-10-batches-bin \\
        --device_target CPU --epoch_size=2 --output_dir ./run1
    python train.py ... --resume ./run1/ckpt_0/resnet18-1_781.ckpt     # continue step and schedules

Output: OUTPUT_DIR/config.yaml (the resolved config) and OUTPUT_DIR/ckpt_<rank>/<net>-<epoch>_<step>.ckpt
(every save_checkpoint_steps global steps and at the end). Exit status 2 with a one-line error for bad
input (paths, data layout, config keys/types), before anything is written.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.dont_write_bytecode = True  # a refused run leaves nothing behind, not even __pycache__
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
from model_zoo.resnet.src.config import ConfigError, format_config, load_config  # noqa: E402
from model_zoo.resnet.src.dataset import check_data_path  # noqa: E402

PROG = "train.py"


def build_parser() -> ZooArgumentParser:
    parser = ZooArgumentParser(prog=PROG, description=__doc__, allow_abbrev=False,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config_path", required=True, help="YAML config (see configs/)")
    parser.add_argument("--data_path", required=True,
                        help="training data: an ImageFolder tree DATA_PATH/<class>/<image> (imagenet2012) or a "
                             "folder with CIFAR-10 binary data_batch_*.bin files (cifar10)")
    parser.add_argument("--device_target", default="CPU", choices=["Ascend", "GPU", "CPU"],
                        help="backend (default CPU)")
    parser.add_argument("--run_distribute", action="store_true",
                        help="data-parallel run: init() the communication (HCCL/NCCL/MCCL via the launcher: "
                             "rank table or msrun) and shard the data by rank")
    parser.add_argument("--output_dir", default="./output",
                        help="where config.yaml and ckpt_<rank>/ go (default ./output)")
    parser.add_argument("--resume", default=None, metavar="CKPT",
                        help="checkpoint written by this script: weights, optimizer state (THOR factors, "
                             "inverses, momenta, global_step) and the step counter are restored; training "
                             "continues at the next step with the same data, lr and damping as an "
                             "uninterrupted run")
    parser.add_argument("--optimizer", default=None, choices=["thor", "momentum"],
                        help="override the config's optimizer")
    add_config_options(parser)
    return parser


def _check_inputs(args, config) -> int:
    """Everything that can be checked without MindSpore; returns the image count."""
    _, images = check_data_path(args.data_path, config["dataset"], training=True)
    if args.resume is not None and not os.path.isfile(args.resume):
        raise ConfigError(f"--resume checkpoint not found: {args.resume}")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ConfigError(f"--output_dir exists and is not a directory: {args.output_dir}")
    return images


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    overrides = config_overrides(args)
    if args.optimizer is not None:
        overrides["optimizer"] = args.optimizer
    config = load_config(args.config_path, overrides)
    _check_inputs(args, config)
    from model_zoo.resnet.src.trainer import train  # imports MindSpore: only after the input is known to be good

    return train(args, config, format_config(config))


if __name__ == "__main__":
    sys.exit(run_main(main, None, PROG))
