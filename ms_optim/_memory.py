"""Giving the memory a graph compilation freed back to the operating system.

Why. MindSpore compiles a GRAPH_MODE training cell in the process itself: its intermediate
representations, passes and kernel selection allocate with the C library's ``malloc`` and free most
of it when compilation ends. glibc keeps freed small blocks inside its heaps for its own later use;
the tensors of a training step come from MindSpore's memory pool in large blocks, which glibc maps
separately (``mmap``), so they do not reuse that space. The process's resident memory therefore stays
at the compiler's high-water mark for the whole training, and the first step's tensors come on top.

THOR's training graph has several times the kernels of a plain step (the factor taps in the backward
pass, the inversions, the preconditioning), and its compilation is correspondingly larger, and so is
the freed but resident memory the peak of every later step then carries.

The first training steps do the same on a smaller scale: the host side of a step (the data pipeline's
decoded batches, the runtime's launch bookkeeping, the fused kernels' scratch) frees what it allocated,
while the memory pool behind the step's tensors is still growing in fresh mappings, so releasing before
each of those steps as well lowers the peak again, with the same losses.

What. :func:`release_freed_memory` asks glibc to return every free page of its heaps to the system
(``malloc_trim(0)``; nothing that is in use moves or changes). :func:`release_after_compile` makes a
training cell do that after its first compilation of each phase, and before any later call once the
process's peak resident set (``getrusage``'s ``ru_maxrss``) has risen by :data:`REGROWTH_BYTES` since
the last release: while the peak climbs over the first steps, and not at all once it has settled, so a
settled step pays one ``getrusage`` call. ``ModelThor`` applies it to the training cell it
builds. With a hand-written loop, compile first and release before the first step::

    train = nn.TrainOneStepCell(loss_net, opt)
    train.compile(x, y)
    ms_optim.release_freed_memory()

On a C library without ``malloc_trim`` (macOS, Windows, musl) both are no-ops.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Optional

try:
    import resource
except ImportError:  # Windows: no getrusage (and no malloc_trim either)
    resource = None

__all__ = ["release_freed_memory", "release_after_compile"]

_TRIM = None  # the C function, once looked up; False when the C library has none

#: Rise of the process's peak resident set since the last release that makes the next call release again.
REGROWTH_BYTES = 32 << 20


def _peak_rss_bytes() -> int:
    """The process's peak resident set so far (``ru_maxrss``, KiB on Linux; only compared with itself, so
    macOS's bytes do no harm there, where there is nothing to release), 0 where it cannot be read."""
    if resource is None:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _malloc_trim() -> Optional[object]:
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            trim = libc.malloc_trim
        except (OSError, AttributeError):
            return None
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
        _TRIM = trim
    return _TRIM or None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system; True if the C library can do it.

    MindSpore compiles a GRAPH_MODE cell in the process, with ``malloc``; glibc keeps what compilation frees
    in its heaps, where the step's tensors (large blocks, mapped separately) never reuse it, so the
    resident memory stays at the compiler's high-water mark for the whole run. This asks glibc to return
    every free page (``malloc_trim(0)``): only memory that is already free is released, no Tensor,
    Parameter or compiled graph is touched. Call it after compiling a graph and before the first step, as
    ``ms_optim.train_thor.ModelThor``'s training cell does by itself. A no-op returning False on a C
    library without ``malloc_trim`` (macOS, Windows, musl).

    Examples:
        >>> import ms_optim
        >>> isinstance(ms_optim.release_freed_memory(), bool)
        True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_after_compile(cell):
    """Make ``cell`` call :func:`release_freed_memory` after compiling and while its peak memory climbs.

    ``cell`` (an ``nn.Cell`` run in GRAPH_MODE, e.g. a ``TrainOneStepCell``; and the ``_graph_cells`` of a
    training cell that runs its step as two graphs) compiles on its first call; MindSpore calls
    ``cell.compile`` again on every call and finds the graph cached. The wrapped ``compile`` releases after
    the first compilation of each phase (``"train"``, ``"eval"``, ...), and on a later call when the
    process's peak resident set has risen by at least :data:`REGROWTH_BYTES`
    since the last release (see the module docstring). Returns ``cell``; wrapping it twice changes
    nothing.
    """
    if getattr(cell, "_ms_optim_releases", None) is not None:
        return cell
    for part in getattr(cell, "_graph_cells", ()):  # a training cell that runs its step as two graphs
        release_after_compile(part)
    compile_graph = cell.compile
    released = set()
    last_peak = 0  # the peak resident set at the last release

    def compile_then_release(*args, **kwargs):
        nonlocal last_peak
        result = compile_graph(*args, **kwargs)
        phase = getattr(cell, "phase", None)
        peak = _peak_rss_bytes()
        if phase not in released or peak - last_peak >= REGROWTH_BYTES:
            released.add(phase)
            release_freed_memory()
            last_peak = peak
        return result

    object.__setattr__(cell, "compile", compile_then_release)
    object.__setattr__(cell, "_ms_optim_releases", released)
    return cell
