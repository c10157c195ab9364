"""Fused CPU kernels for Lamb and LARS(Momentum): fewer passes over memory than composite ops.

A Lamb step written with ``mindspore.ops`` runs about a dozen elementwise kernels per parameter,
each one a full pass over memory; on CPU that is ~8x the time of MindSpore's fused Momentum. The
two kernels here do the same arithmetic in the fewest passes the math allows:

- ``MsOptimLambStep(w, m, v, g, lr, wd, hyper=[beta1, beta2, eps, 1-beta1^t, 1-beta2^t])``:
  pass 1 updates ``m`` and ``v`` and accumulates ``||w||^2`` and ``||r||^2``; pass 2 recomputes
  ``r`` from the new ``m``, ``v`` and writes ``w -= lr * ratio * r`` (10 array passes in all,
  Momentum needs 5).
- ``MsOptimLarsMomentum[Nesterov](w, accum, g, lr, wd, momentum, hyper=[coefficient, epsilon,
  use_clip])``: pass 1 accumulates ``||w||^2`` and ``||g||^2``; pass 2 applies
  ``accum = momentum*accum + c*(g + wd*w)`` and the momentum step, Nesterov as MindSpore's CPU
  ``ApplyMomentum`` runs it (7 passes).

The same library holds THOR's fused factor, preconditioning and inversion kernels
(``ms_optim/_thor/factor_kernels.py``), from ``_thor_fused.cc``.

Both are ``ops.Custom`` operators of type ``"aot"``: C++ in ``_fused.cc`` (package data, next to
this module, with ``_thor_fused.cc``), compiled with the machine's ``g++`` at first use into a cache directory
(see :func:`library_path` for its safety rules), keyed by a hash of the sources and flags, so later
processes load it without compiling. They update
``w``/``m``/``v``/``accum`` in place (declared as written inputs, like ``Assign``), and return the
trust ratio they used. Norms are accumulated in double precision.

They are used only where they apply: float32 parameters and :func:`fused_switch_on` (CPU device,
``MS_OPTIM_FUSED`` not ``0``; ASGD's fused MindSpore primitive obeys the same switch). Everywhere
else, and whenever the compiler is missing or fails (one :class:`FusedKernelWarning`), the optimizers run
their composite ``mindspore.ops`` version, which is also the reference the tests compare the
fused kernels with (both against the NumPy oracle).
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from typing import List, Optional

import mindspore as ms
from mindspore import ops
from mindspore.ops import signature as sig

__all__ = ["fused_switch_on", "fused_enabled", "library_path", "lamb_op", "lars_momentum_op",
           "FusedKernelWarning", "SOURCE_FILES"]

#: The C++ sources, compiled together into one library.
SOURCE_FILES = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                     for name in ("_fused.cc", "_thor_fused.cc"))

# Reassociation lets g++ vectorise the blocked float sums; no approximate division or sqrt.
_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
          "-fassociative-math", "-fno-signed-zeros"]
_LAYOUT = "2"  # bump when the cache layout changes (library + .sha256 sidecar)


class FusedKernelWarning(RuntimeWarning):
    """The fused kernels are not used, or the cache needed repair; the composite ops give the same numbers."""


_lock = threading.Lock()
_library: Optional[str] = None
_failed: Optional[str] = None
_private_dirs: List[str] = []


def fused_switch_on() -> bool:
    """The one switch for every fused path (Lamb, LARS, ASGD): the CPU target, and the environment
    variable ``MS_OPTIM_FUSED`` not set to ``0``."""
    return os.environ.get("MS_OPTIM_FUSED", "1") != "0" and ms.get_context("device_target") == "CPU"


def _warn(message: str) -> None:
    warnings.warn(message, FusedKernelWarning, stacklevel=3)


def _fallback(reason: str) -> None:
    """Record why the fused kernels are unavailable and say so once (one line)."""
    global _failed  # pylint: disable=global-statement
    if _failed is None:
        _warn(f"ms_optim: fused CPU kernels unavailable ({reason}); using composite ops (same results, "
              f"slower). Set MS_OPTIM_FUSED=0 to choose them and silence this warning.")
    _failed = reason


def _cache_dir() -> str:
    return os.environ.get("MS_OPTIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ms_optim")


def _not_private(directory: str) -> Optional[str]:
    """Why ``directory`` must not be loaded from (not a real directory, another owner, writable by
    group or others), or None if it is private to this user."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory (or a symbolic link)"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not {os.getuid()}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _damage(target: str) -> Optional[str]:
    """Why the library at ``target`` must not be loaded (checked BEFORE loading), or None if its
    SHA-256 matches the digest recorded next to it when it was built."""
    try:
        with open(target + ".sha256", encoding="ascii") as handle:
            recorded = handle.read().strip()
    except (OSError, UnicodeError):
        return "no build digest next to it"
    return (None if _sha256(target) == recorded
            else "its SHA-256 differs from the digest recorded at build time")


def _write_atomic(path: str, data: bytes) -> None:
    handle, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp_")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _build(compiler: str, sources: List[str], target: str) -> Optional[str]:
    """Compile the ``sources`` (texts) into ``target`` atomically, its digest first; returns an error
    text or None."""
    directory = os.path.dirname(target)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        names = [f"fused{i}.cc" for i in range(len(sources))]
        for name, source in zip(names, sources):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as handle:
                handle.write(source)
        # run in tmp with relative names: the output does not depend on the temporary path
        result = subprocess.run([compiler, *_FLAGS, "-o", "fused.so", *names], cwd=tmp, capture_output=True,
                                text=True, timeout=180, check=False)
        if result.returncode != 0:
            return "g++ failed: " + " ".join(result.stderr.split())[-300:]
        built = os.path.join(tmp, "fused.so")
        os.chmod(built, 0o700)
        _write_atomic(target + ".sha256", (_sha256(built) + "\n").encode("ascii"))
        os.replace(built, target)  # atomic: concurrent processes never see half a file
    return None


def _private_temporary_dir() -> str:
    directory = tempfile.mkdtemp(prefix="ms_optim_fused_")  # mode 0700
    _private_dirs.append(directory)
    if len(_private_dirs) == 1:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _private_dirs])
    return directory


def library_path() -> Optional[str]:
    """Path of the compiled kernel library, compiling it on first use; None if that is impossible.

    The cache (``$MS_OPTIM_CACHE_DIR``, default ``~/.cache/ms_optim``) is created with mode 0700 and
    used only if it is owned by this user and not writable by group or others; otherwise the library
    is built in a private temporary directory, with a warning. A cached library is loaded only if its
    SHA-256 matches the digest written next to it at build time; a damaged or foreign file is rebuilt
    (one warning). When no library can be had (no ``g++``, a compile error, an unwritable directory),
    one warning names the reason and the ``MS_OPTIM_FUSED`` switch, and the reason is in :data:`_failed`.
    """
    global _library  # pylint: disable=global-statement
    with _lock:
        if _library is not None or _failed is not None:
            return _library
        compiler = shutil.which("g++")
        if compiler is None:
            _fallback("g++ not found on PATH")
            return None
        sources = []
        for path in SOURCE_FILES:
            try:
                with open(path, encoding="utf-8") as handle:
                    sources.append(handle.read())
            except OSError as error:
                _fallback(f"cannot read {path}: {error.strerror}")
                return None
        key = hashlib.sha256("\0".join([_LAYOUT, *sources, *_FLAGS]).encode()).hexdigest()[:16]
        directory = _cache_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            unsafe = _not_private(directory)
            if unsafe is not None:
                _warn(f"ms_optim: kernel cache {directory} is {unsafe}; not loading from it, building in a "
                      f"private temporary directory instead.")
                directory = _private_temporary_dir()
            target = os.path.join(directory, f"ms_optim_fused_{key}.so")
            if os.path.lexists(target):
                damage = _damage(target)
                if damage is None:
                    _library = target
                    return _library
                _warn(f"ms_optim: cached kernel library {target} not loaded ({damage}); rebuilding it.")
            error = _build(compiler, sources, target)
        except (OSError, subprocess.SubprocessError) as exc:
            error = f"could not build in {directory}: {exc}"
        if error is not None:
            _fallback(error)
            return None
        _library = target
        return _library


def fused_enabled() -> bool:
    """Whether new optimizers should use the fused kernels: :func:`fused_switch_on` and the kernel
    library available."""
    return fused_switch_on() and library_path() is not None


def _signature(n_inputs: int, n_written: int) -> tuple:
    return tuple(sig.make_sig(f"x{i}", sig.sig_rw.RW_WRITE if i < n_written else sig.sig_rw.RW_READ)
                 for i in range(n_inputs))


class _InplaceCustom(ops.Custom):
    """An aot Custom op returning one float32 and writing some of its inputs in place; subclasses
    declare which (like Assign's ``variable``), so graph mode orders reads and writes of those
    Parameters correctly."""

    def __init__(self, func: str) -> None:
        super().__init__(func, out_shape=lambda *shapes: [1], out_dtype=lambda *dtypes: ms.float32,
                         func_type="aot")
        self.add_prim_attr("side_effect_mem", True)


class _LambCustom(_InplaceCustom):
    __mindspore_signature__ = _signature(7, 3)  # w, m, v written


class _LarsMomentumCustom(_InplaceCustom):
    __mindspore_signature__ = _signature(7, 2)  # w, accum written


def _make(cls, name: str) -> Optional[ops.Custom]:
    """The Custom op for kernel ``name``, or None (composite fallback) if it cannot be created, e.g.
    when ``MS_CUSTOM_AOT_WHITE_LIST`` does not include the cache directory."""
    path = library_path()
    if path is None:
        return None
    try:
        return cls(f"{path}:{name}")
    except (TypeError, ValueError, RuntimeError) as error:
        _fallback(f"could not create the fused op {name}: {' '.join(str(error).split())[:300]}")
        return None


def lamb_op() -> Optional[ops.Custom]:
    """The fused Lamb step (w, m, v, g, lr, wd, hyper) -> ratio, or None if unavailable."""
    return _make(_LambCustom, "MsOptimLambStep")


def lars_momentum_op(nesterov: bool) -> Optional[ops.Custom]:
    """The fused LARS + momentum step (w, accum, g, lr, wd, momentum, hyper) -> ratio, or None."""
    return _make(_LarsMomentumCustom, "MsOptimLarsMomentumNesterov" if nesterov else "MsOptimLarsMomentum")
