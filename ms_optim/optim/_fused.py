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

Both are ``ops.Custom`` operators of type ``"aot"``: C++ compiled with the machine's ``g++`` at
first use into a cache directory (``$MS_OPTIM_CACHE_DIR``, default ``~/.cache/ms_optim``), keyed
by a hash of the source and flags, so later processes load it without compiling. They update
``w``/``m``/``v``/``accum`` in place (declared as written inputs, like ``Assign``), and return the
trust ratio they used. Norms are accumulated in double precision.

They are used only where they apply: CPU device, float32 parameters, and ``MS_OPTIM_FUSED`` not
set to ``0``. Everywhere else, and whenever the compiler is missing or fails, the optimizers run
their composite ``mindspore.ops`` version, which is also the reference the tests compare the
fused kernels with (both against the NumPy oracle).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Optional

import mindspore as ms
from mindspore import ops
from mindspore.ops import signature as sig

__all__ = ["fused_enabled", "library_path", "lamb_op", "lars_momentum_op"]

_SOURCE = r"""
#include <cmath>
#include <cstdint>

namespace {

int64_t NumElements(int index, int *ndims, int64_t **shapes) {
  int64_t n = 1;
  for (int d = 0; d < ndims[index]; ++d) n *= shapes[index][d];
  return n;
}

// Sum of squares in blocks of float partial sums (vectorisable) added into a double.
template <typename F>
double BlockedSquareSum(int64_t n, F value) {
  const int64_t kBlock = 2048;
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    float partial = 0.0f;
    for (int64_t i = start; i < end; ++i) {
      const float x = value(i);
      partial += x * x;
    }
    total += partial;
  }
  return total;
}

}  // namespace

// inputs: w, m, v, g (float32, same size), lr, wd (1 float each), hyper[5] = beta1, beta2, eps,
// 1 - beta1^t, 1 - beta2^t; output: ratio[1]. Updates w, m, v in place.
#define MS_OPTIM_CLONES __attribute__((target_clones("avx2", "default")))

extern "C" MS_OPTIM_CLONES int MsOptimLambStep(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 8) return 1;
  float *w = static_cast<float *>(params[0]);
  float *m = static_cast<float *>(params[1]);
  float *v = static_cast<float *>(params[2]);
  const float *g = static_cast<const float *>(params[3]);
  const float lr = *static_cast<const float *>(params[4]);
  const float wd = *static_cast<const float *>(params[5]);
  const float *h = static_cast<const float *>(params[6]);
  float *out = static_cast<float *>(params[7]);
  const float b1 = h[0], b2 = h[1], eps = h[2], bias1 = h[3], bias2 = h[4];
  const float c1 = 1.0f - b1, c2 = 1.0f - b2;
  // m_hat / (sqrt(v_hat) + eps) with one division and one square root per element
  const float inv_bias1 = 1.0f / bias1, inv_sqrt_bias2 = 1.0f / std::sqrt(bias2);
  const int64_t n = NumElements(0, ndims, shapes);
  const int64_t kBlock = 2048;
  double w_sq = 0.0, r_sq = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    float pw = 0.0f, pr = 0.0f;
    for (int64_t i = start; i < end; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + c1 * gi;
      const float vi = b2 * v[i] + c2 * (gi * gi);
      m[i] = mi;
      v[i] = vi;
      const float wi = w[i];
      const float ri = (mi * inv_bias1) / (std::sqrt(vi) * inv_sqrt_bias2 + eps) + wd * wi;
      pw += wi * wi;
      pr += ri * ri;
    }
    w_sq += pw;
    r_sq += pr;
  }
  float ratio = 1.0f;
  if (w_sq > 0.0 && r_sq > 0.0) ratio = static_cast<float>(std::sqrt(w_sq) / std::sqrt(r_sq));
  const float step = lr * ratio;
  for (int64_t i = 0; i < n; ++i) {
    const float wi = w[i];
    const float ri = (m[i] * inv_bias1) / (std::sqrt(v[i]) * inv_sqrt_bias2 + eps) + wd * wi;
    w[i] = wi - step * ri;
  }
  out[0] = ratio;
  return 0;
}

// inputs: w, accum, g (float32, same size), lr, wd, momentum (1 float each), hyper[3] = coefficient,
// epsilon, use_clip; output: ratio[1]. Updates w, accum in place.
static MS_OPTIM_CLONES int LarsMomentum(int nparam, void **params, int *ndims, int64_t **shapes, bool nesterov) {
  if (nparam != 8) return 1;
  float *w = static_cast<float *>(params[0]);
  float *a = static_cast<float *>(params[1]);
  const float *g = static_cast<const float *>(params[2]);
  const float lr = *static_cast<const float *>(params[3]);
  const float wd = *static_cast<const float *>(params[4]);
  const float mom = *static_cast<const float *>(params[5]);
  const float *h = static_cast<const float *>(params[6]);
  float *out = static_cast<float *>(params[7]);
  const int64_t n = NumElements(0, ndims, shapes);
  const double w_sq = BlockedSquareSum(n, [w](int64_t i) { return w[i]; });
  const double g_sq = BlockedSquareSum(n, [g](int64_t i) { return g[i]; });
  float c = 1.0f;
  if (w_sq > 0.0 && g_sq > 0.0) {
    const float w_norm = static_cast<float>(std::sqrt(w_sq));
    const float g_norm = static_cast<float>(std::sqrt(g_sq));
    c = h[0] * w_norm / (g_norm + wd * w_norm + h[1]);
  }
  if (h[2] != 0.0f) {
    c = c / lr;
    if (!(c < 1.0f)) c = 1.0f;
  }
  if (nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      // as MindSpore's CPU ApplyMomentum runs Nesterov (measured): the step uses the accumulation
      // from before this update, w -= lr * (g + momentum * accum_old)
      const float gi = c * (g[i] + wd * w[i]);
      const float a_old = a[i];
      a[i] = mom * a_old + gi;
      w[i] -= lr * (gi + mom * a_old);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float gi = c * (g[i] + wd * w[i]);
      const float ai = mom * a[i] + gi;
      a[i] = ai;
      w[i] -= lr * ai;
    }
  }
  out[0] = c;
  return 0;
}

extern "C" int MsOptimLarsMomentum(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  return LarsMomentum(nparam, params, ndims, shapes, false);
}

extern "C" int MsOptimLarsMomentumNesterov(int nparam, void **params, int *ndims, int64_t **shapes,
                                           const char **dtypes, void *stream, void *extra) {
  return LarsMomentum(nparam, params, ndims, shapes, true);
}
"""

# Reassociation lets g++ vectorise the blocked float sums; no approximate division or sqrt.
_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
          "-fassociative-math", "-fno-signed-zeros"]

_lock = threading.Lock()
_library: Optional[str] = None
_failed: Optional[str] = None


def _cache_dir() -> str:
    return os.environ.get("MS_OPTIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ms_optim")


def library_path() -> Optional[str]:
    """Path of the compiled kernel library, compiling it on first use; None if that is impossible
    (no ``g++``, a compile error, an unwritable cache); the reason is then in :data:`_failed`."""
    global _library, _failed  # pylint: disable=global-statement
    with _lock:
        if _library is not None or _failed is not None:
            return _library
        compiler = shutil.which("g++")
        if compiler is None:
            _failed = "g++ not found"
            return None
        digest = hashlib.sha256((_SOURCE + " ".join(_FLAGS)).encode()).hexdigest()[:16]
        directory = _cache_dir()
        target = os.path.join(directory, f"ms_optim_fused_{digest}.so")
        if not os.path.exists(target):
            try:
                os.makedirs(directory, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=directory) as tmp:
                    source = os.path.join(tmp, "fused.cc")
                    with open(source, "w", encoding="utf-8") as handle:
                        handle.write(_SOURCE)
                    built = os.path.join(tmp, "fused.so")
                    result = subprocess.run([compiler, *_FLAGS, "-o", built, source], capture_output=True,
                                            text=True, timeout=120, check=False)
                    if result.returncode != 0:
                        _failed = f"g++ failed: {result.stderr[-2000:]}"
                        return None
                    os.replace(built, target)  # atomic: concurrent processes never see half a file
            except (OSError, subprocess.SubprocessError) as error:
                _failed = f"could not build the fused kernels: {error}"
                return None
        _library = target
        return _library


def fused_enabled() -> bool:
    """Whether new optimizers should use the fused kernels: CPU target, ``MS_OPTIM_FUSED`` not ``0``,
    and the kernel library available."""
    if os.environ.get("MS_OPTIM_FUSED", "1") == "0":
        return False
    if ms.get_context("device_target") != "CPU":
        return False
    return library_path() is not None


def _signature(n_inputs: int, n_written: int) -> tuple:
    return tuple(sig.make_sig(f"x{i}", sig.sig_rw.RW_WRITE if i < n_written else sig.sig_rw.RW_READ)
                 for i in range(n_inputs))


class _InplaceCustom(ops.Custom):
    """An aot Custom op returning one float32 and writing some of its inputs in place; subclasses
    declare which (like Assign's ``variable``), so graph mode orders reads and writes of those
    Parameters correctly."""

    def __init__(self, func: str) -> None:
        super().__init__(func, out_shape=lambda *shapes: [1], out_dtype=lambda *dtypes: ms.float32, func_type="aot")
        self.add_prim_attr("side_effect_mem", True)


class _LambCustom(_InplaceCustom):
    __mindspore_signature__ = _signature(7, 3)  # w, m, v written


class _LarsMomentumCustom(_InplaceCustom):
    __mindspore_signature__ = _signature(7, 2)  # w, accum written


def _make(cls, name: str) -> Optional[ops.Custom]:
    """The Custom op for kernel ``name``, or None (composite fallback) if it cannot be created, e.g.
    when ``MS_CUSTOM_AOT_WHITE_LIST`` does not include the cache directory."""
    global _failed  # pylint: disable=global-statement
    path = library_path()
    if path is None:
        return None
    try:
        return cls(f"{path}:{name}")
    except (TypeError, ValueError, RuntimeError) as error:
        _failed = f"could not create the fused op {name}: {error}"
        return None


def lamb_op() -> Optional[ops.Custom]:
    """The fused Lamb step (w, m, v, g, lr, wd, hyper) -> ratio, or None if unavailable."""
    return _make(_LambCustom, "MsOptimLambStep")


def lars_momentum_op(nesterov: bool) -> Optional[ops.Custom]:
    """The fused LARS + momentum step (w, accum, g, lr, wd, momentum, hyper) -> ratio, or None."""
    return _make(_LarsMomentumCustom, "MsOptimLarsMomentumNesterov" if nesterov else "MsOptimLarsMomentum")
