"""MindSpore's execution context for the zoo's trainers, without deprecated calls."""
from __future__ import annotations

from typing import Optional

import mindspore as ms

__all__ = ["set_device"]


def set_device(device_target: str, device_id: Optional[int] = None) -> None:
    """``mindspore.set_device`` where it exists (MindSpore >= 2.5), else the older ``set_context`` keys.
    In a process whose runtime already runs on ``device_target`` (a second run from Python) it does nothing."""
    if hasattr(ms, "set_device"):
        try:
            ms.set_device(device_target, device_id)
        except RuntimeError:  # set once, or the runtime already started: fine if it is the same target
            if ms.get_context("device_target") != device_target:
                raise
    else:  # pragma: no cover - older MindSpore
        ms.set_context(device_target=device_target, **({} if device_id is None else {"device_id": device_id}))
