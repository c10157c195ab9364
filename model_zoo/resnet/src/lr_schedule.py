"""Per-step schedules of the zoo. THOR's lr and damping come from ``ms_optim._thor.schedules`` (the
model zoo's generators); this module adds the Momentum baseline's warmup + decay schedule.

Momentum, for step s (0-based) with W warmup steps and T total steps:
  s < W:  lr = lr_end + (lr_max - lr_end) * (s + 1) / W
  s >= W: t = (s - W) / (T - W), and
          cosine: lr = lr_end + (lr_max - lr_end) * (1 + cos(pi * t)) / 2
          linear: lr = lr_max - (lr_max - lr_end) * t
          poly:   lr = lr_end + (lr_max - lr_end) * (1 - t) ** 2
"""
from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import numpy as np

__all__ = ["momentum_lr", "thor_schedules"]


def momentum_lr(schedule: str, lr_max: float, lr_end: float, warmup_epochs: int, total_epochs: int,
                steps_per_epoch: int) -> np.ndarray:
    """float32 array of ``total_epochs * steps_per_epoch`` learning rates (formula in the module doc)."""
    total = total_epochs * steps_per_epoch
    warmup = min(warmup_epochs * steps_per_epoch, total)
    out = np.empty(total, dtype=np.float64)
    for s in range(total):
        if s < warmup:
            out[s] = lr_end + (lr_max - lr_end) * (s + 1) / warmup
            continue
        t = (s - warmup) / max(total - warmup, 1)
        if schedule == "cosine":
            out[s] = lr_end + (lr_max - lr_end) * 0.5 * (1.0 + math.cos(math.pi * t))
        elif schedule == "linear":
            out[s] = lr_max - (lr_max - lr_end) * t
        elif schedule == "poly":
            out[s] = lr_end + (lr_max - lr_end) * (1.0 - t) ** 2
        else:
            raise ValueError(f"unknown lr_schedule {schedule!r}")
    return out.astype(np.float32)


def thor_schedules(config: Dict[str, Any], steps_per_epoch: int) -> Tuple[np.ndarray, np.ndarray]:
    """THOR lr and damping from step 0, both over ``lr_end_epoch`` epochs (>= ``epoch_size``).

    A resumed run uses the same arrays: the optimizer's restored ``global_step`` indexes them, so the
    schedule continues exactly where the checkpoint left it.
    """
    from ms_optim._thor.schedules import get_thor_damping, get_thor_lr

    lr = get_thor_lr(0, config["lr_init"], config["lr_decay"], config["lr_end_epoch"], steps_per_epoch,
                     decay_epochs=config["decay_epochs"])
    damping = get_thor_damping(0, config["damping_init"], config["damping_decay"],
                               max(config["lr_end_epoch"], config["epoch_size"]), steps_per_epoch)
    return lr, damping
