"""The training run behind train.py (imports MindSpore; train.py has already checked the input)."""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Dict, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor

from model_zoo.common.context import set_device
from model_zoo.common.progress import LinePrinter, ProgressMonitor

from .callbacks import RankStatsAverager, StepCheckpoint
from .config import ConfigError
from .dataset import create_dataset
from .lr_schedule import momentum_lr, thor_schedules
from .resnet import build_resnet

__all__ = ["train", "setup_context", "build_network", "build_loss", "amp_level_for"]


log = LinePrinter()
_DATA_FILE = re.compile(r"The corresponding data file is: (.+?)\.(?:\s|$)")


def _bad_data_file(exc: RuntimeError) -> str:
    """The file MindSpore's data pipeline names in ``exc`` (an image it cannot decode), or ''."""
    match = _DATA_FILE.search(str(exc))
    return match.group(1) if match else ""


def setup_context(device_target: str, mode: str, distributed: bool) -> Tuple[int, int]:
    """Execution mode, device and (when distributed) the communication group; returns (rank, size)."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    device_id = None
    if device_target == "Ascend" and "DEVICE_ID" in os.environ and not (distributed and "MS_WORKER_NUM" in os.environ):
        device_id = int(os.environ["DEVICE_ID"])  # standalone, or a rank-table launch (msrun sets its own)
    set_device(device_target, device_id)
    if not distributed:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init

    from ms_optim._bridge import prime_numpy_bridge

    if device_target == "CPU":
        prime_numpy_bridge()  # before init(): see ms_optim._bridge

    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=size)
    return rank, size


def build_network(config: Dict[str, Any]):
    """The ResNet of the config, with weights drawn from ``seed`` (identical on every rank)."""
    ms.set_seed(config["seed"])
    np.random.seed(config["seed"])
    return build_resnet(config["net"], class_num=config["class_num"], width=config["width"], stem=config["stem"])


def build_loss(config: Dict[str, Any]):
    return ms.nn.CrossEntropyLoss(reduction="mean", label_smoothing=config["label_smoothing"])


def amp_level_for(config: Dict[str, Any], device_target: str) -> str:
    if config["amp_level"] != "auto":
        return config["amp_level"]
    return "O0" if device_target == "CPU" else "O2"


def _steps_per_epoch(config, data_path, rank, size) -> int:
    probe = create_dataset(data_path, config["dataset"], True, config["batch_size"], config["image_size"],
                           seed=config["seed"], epoch=0, rank_size=size, rank_id=rank,
                           num_parallel_workers=config["num_parallel_workers"])
    available = probe.get_dataset_size()
    if available == 0:
        raise ConfigError(f"data_path {data_path} gives this rank (of {size}) fewer images than one batch "
                          f"of {config['batch_size']}")
    return min(available, config["steps_per_epoch"]) if config["steps_per_epoch"] else available


def trace_thresholds(config: Dict[str, Any]):
    """``thor``'s ``trace_thresholds`` from the config: None (the fixed schedule) when both omegas are 0."""
    omegas = (config["trace_omega_1"], config["trace_omega_2"])
    return None if omegas == (0.0, 0.0) else omegas


def _build_optimizer(config, net, steps_per_epoch):
    """THOR through ms_optim's public API exactly as the model zoo calls it, or Momentum."""
    if config["optimizer"] == "thor":
        from ms_optim import nn as thor_nn

        try:  # a config value the schedules or THOR refuse (e.g. a NaN lr_init): report it as input error
            lr, damping = thor_schedules(config, steps_per_epoch)
            opt = thor_nn.thor(net, Tensor(lr), Tensor(damping), config["momentum"], config["weight_decay"],
                               config["loss_scale"], config["batch_size"],
                               split_indices=config["split_indices"], frequency=config["frequency"],
                               factor_convention=config["factor_convention"], inverse=config["inverse"],
                               trace_thresholds=trace_thresholds(config),
                               distribute_inverses=config["distribute_inverses"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"THOR refused the config: {exc}") from None
        return opt, lr
    lr = momentum_lr(config["lr_schedule"], config["lr_max"], config["lr_end"], config["warmup_epochs"],
                     config["epoch_size"], steps_per_epoch)
    decayed = [p for p in net.trainable_params() if not any(k in p.name for k in ("beta", "gamma", "bias"))]
    others = [p for p in net.trainable_params() if any(k in p.name for k in ("beta", "gamma", "bias"))]
    groups = [{"params": decayed, "weight_decay": config["weight_decay"]}, {"params": others, "weight_decay": 0.0},
              {"order_params": net.trainable_params()}]
    opt = ms.nn.Momentum(groups, Tensor(lr), config["momentum"], loss_scale=config["loss_scale"])
    return opt, lr


def _load_resume(path: str, cells, steps_per_epoch: int) -> int:
    """Restore every Parameter of ``cells`` from ``path``; returns the global step it was saved at."""
    try:
        state = ms.load_checkpoint(path)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"--resume {path} is not a readable MindSpore checkpoint ({str(exc).splitlines()[0]})") \
            from None
    if "zoo_step" not in state or "zoo_steps_per_epoch" not in state:
        raise ConfigError(f"--resume {path} was not written by this train.py (no zoo_step in it)")
    step = int(np.asarray(state.pop("zoo_step").asnumpy()).reshape(-1)[0])
    saved_spe = int(np.asarray(state.pop("zoo_steps_per_epoch").asnumpy()).reshape(-1)[0])
    if saved_spe != steps_per_epoch:
        raise ConfigError(f"--resume {path} was saved with {saved_spe} steps per epoch, this run has "
                          f"{steps_per_epoch} (same data, batch_size, steps_per_epoch and ranks needed)")
    missing = []
    for cell in cells:
        for _, param in cell.parameters_and_names():
            if param.name in ("learning_rate", "damping"):
                continue  # schedules come from the config (so a run can be extended); global_step indexes them
            if param.name not in state:
                missing.append(param.name)
                continue
            value = state[param.name]
            if tuple(value.shape) != tuple(param.shape):
                raise ConfigError(f"--resume {path}: '{param.name}' has shape {tuple(value.shape)}, the network "
                                  f"has {tuple(param.shape)} (different net/width/class_num/optimizer?)")
            param.set_data(Tensor(value.asnumpy(), param.dtype))
    if missing:
        raise ConfigError(f"--resume {path} lacks {len(missing)} parameters of this run, e.g. '{missing[0]}' "
                          f"(was it written with another optimizer?)")
    return step


def train(args, config: Dict[str, Any], config_text: str) -> int:
    if config["optimizer"] == "thor":
        # Imported before init(): msrun workers then leave the cluster cleanly at exit.
        from ms_optim.train_thor import ConvertModelUtils
    rank, size = setup_context(args.device_target, config["mode"], args.run_distribute)
    steps_per_epoch = _steps_per_epoch(config, args.data_path, rank, size)
    total_steps = config["epoch_size"] * steps_per_epoch

    net = build_network(config)
    loss = build_loss(config)
    opt, lr = _build_optimizer(config, net, steps_per_epoch)
    start_step = _load_resume(args.resume, (net, opt), steps_per_epoch) if args.resume else 0
    if start_step >= total_steps:
        raise ConfigError(f"--resume checkpoint is at step {start_step}, the run has only {total_steps} steps "
                          f"(raise epoch_size to continue)")

    from mindspore.train import FixedLossScaleManager, Model

    scale = FixedLossScaleManager(config["loss_scale"], drop_overflow_update=False)
    metrics = {"top_1_accuracy", "top_5_accuracy"} if config["class_num"] >= 5 else {"top_1_accuracy"}
    amp_level = amp_level_for(config, args.device_target)
    if config["optimizer"] == "thor":
        model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=scale, metrics=metrics,
                      amp_level=amp_level, keep_batchnorm_fp32=False)
        model = ConvertModelUtils().convert_to_thor_model(model=model, network=net, loss_fn=loss, optimizer=opt,
                                                          loss_scale_manager=scale, metrics=metrics,
                                                          amp_level=amp_level, keep_batchnorm_fp32=False)
    else:
        model = Model(net, loss_fn=loss, optimizer=opt, loss_scale_manager=scale, metrics=metrics,
                      amp_level=amp_level)

    # Everything is built and checked: now the run may write.
    ckpt_dir = os.path.join(args.output_dir, f"ckpt_{rank}")
    os.makedirs(ckpt_dir, exist_ok=True)
    if rank == 0:
        with open(os.path.join(args.output_dir, "config.yaml"), "w", encoding="utf-8") as handle:
            handle.write(config_text.replace("  ", "", 1).replace("\n  ", "\n") + "\n")
    log(f"[rank {rank}/{size}] {config['net']} width {config['width']} {config['optimizer']} on "
        f"{args.device_target} ({config['mode']} mode, amp {amp_level}, "
        f"{'dataset sink' if config['dataset_sink_mode'] and args.device_target != 'CPU' else 'step by step'}); "
        f"{steps_per_epoch} steps/epoch x "
        f"{config['epoch_size']} epochs, batch {config['batch_size']} per rank"
        + (f"; resuming at global step {start_step}" if start_step else ""))
    log("config:\n" + config_text)

    # Sinking data only pays on a device; on CPU MindSpore's Model falls back to step-by-step anyway,
    # and step mode gives per-step progress lines and checkpoints.
    sink = config["dataset_sink_mode"] and args.device_target != "CPU"
    prefix = config["net"]
    monitor = ProgressMonitor(config["epoch_size"], steps_per_epoch, config["batch_size"] * size,
                              config["log_interval"], unit="images", lr=lr, printer=log)
    saver = StepCheckpoint(ckpt_dir, prefix, (net, opt), config["save_checkpoint_steps"],
                           config["keep_checkpoint_max"], steps_per_epoch, total_steps, printer=log,
                           before_save=RankStatsAverager((net, opt), size) if size > 1 else None,
                           stop_on_loss=size == 1)  # ranks must stop at the same step: see FiniteCheckpoint
    t0 = time.perf_counter()
    first_epoch, skip = divmod(start_step, steps_per_epoch)
    for epoch in range(first_epoch, config["epoch_size"]):
        skip_now = skip if epoch == first_epoch else 0
        data = create_dataset(args.data_path, config["dataset"], True, config["batch_size"], config["image_size"],
                              seed=config["seed"], epoch=epoch, rank_size=size, rank_id=rank,
                              num_parallel_workers=config["num_parallel_workers"], steps=steps_per_epoch,
                              skip_steps=skip_now)
        monitor.start_step = saver.start_step = epoch * steps_per_epoch + skip_now
        try:
            model.train(1, data, callbacks=[monitor, saver], dataset_sink_mode=sink, sink_size=-1)
        except RuntimeError as exc:
            bad = _bad_data_file(exc)
            if not bad:
                raise
            kept = f"; last checkpoint {saver.last_path}" if saver.last_path else ""
            raise ConfigError(f"cannot decode image {bad} (corrupt or not an image): remove or replace it"
                              f"{kept}") from None
        saver.raise_if_failed()
    seconds = time.perf_counter() - t0
    done = total_steps - start_step
    log(f"[rank {rank}] finished: {done} steps in {seconds:.1f} s "
        f"({config['batch_size'] * size * done / max(seconds, 1e-9):.1f} images/s overall), "
        f"final checkpoint {saver.last_path}")
    sys.stdout.flush()
    return 0
