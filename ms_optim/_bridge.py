"""One primer for MindSpore's NumPy bridge, used by the package, the model zoo, the tests and workers.

MindSpore 2.10's C++ bridge to NumPy was built against NumPy 1.x. Under NumPy 2 the first eager op
that goes through it (for example a Tensor op with a Python-number argument) fails once: NumPy prints
its "A module that was compiled using NumPy 1.x cannot be run in NumPy 2..." block on stderr and the
op raises ``SystemError`` (or ``ImportError``); every later call in the process works. In an ``msrun``
worker that first failure must happen before ``mindspore.communication.init()``, or the worker later
leaves the cluster abnormally.

:func:`prime_numpy_bridge` takes that one-time failure on purpose, once per process, with stderr
silenced at the file-descriptor level (NumPy writes the block from C code), so no user-visible op
is the first one. It runs an op, which initialises the device: call it after ``set_context``.
Under NumPy 1.x it is a harmless no-op.
"""
from __future__ import annotations

import os
import sys

__all__ = ["prime_numpy_bridge"]

_PRIMED = False


def prime_numpy_bridge() -> None:
    """Take MindSpore's one-time NumPy-bridge failure now, quietly; later calls do nothing."""
    global _PRIMED  # pylint: disable=global-statement
    if _PRIMED:
        return
    _PRIMED = True
    import numpy as np
    from mindspore import Tensor

    sys.stderr.flush()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a descriptor
        fd = None
    saved = devnull = None
    if fd is not None:
        saved, devnull = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
    try:
        _ = Tensor(np.ones(1, np.float32)) * 1.0
    except (SystemError, ImportError):
        pass
    finally:
        if fd is not None:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            os.close(devnull)
