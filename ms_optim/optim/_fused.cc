// Fused CPU kernels of ms_optim's Lamb and LARS(Momentum), loaded as MindSpore "aot" Custom ops.
// Shipped as package data and compiled at first use by ms_optim/optim/_fused.py (see its docstring).
// Each entry point follows MindSpore's aot signature:
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)
// with the inputs, then the output, in params; they return 0 on success.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

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

extern "C" MS_OPTIM_CLONES int MsOptimLambStep(int nparam, void **params, int *ndims, int64_t **shapes,
                                               const char ** /*dtypes*/, void * /*stream*/, void * /*extra*/) {
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

extern "C" int MsOptimLarsMomentum(int nparam, void **params, int *ndims, int64_t **shapes,
                                   const char ** /*dtypes*/, void * /*stream*/, void * /*extra*/) {
  return LarsMomentum(nparam, params, ndims, shapes, false);
}

extern "C" int MsOptimLarsMomentumNesterov(int nparam, void **params, int *ndims, int64_t **shapes,
                                           const char ** /*dtypes*/, void * /*stream*/, void * /*extra*/) {
  return LarsMomentum(nparam, params, ndims, shapes, true);
}
