// THOR's fused CPU kernels (ms_optim/_thor/factor_kernels.py), compiled with _fused.cc into one library by
// ms_optim/optim/_fused.py; the same aot signature:
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)
// with the inputs, then the outputs, in params; they return 0 on success.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#define MS_OPTIM_CLONES __attribute__((target_clones("avx2", "default")))

namespace {

int64_t NumElements(int index, int *ndims, int64_t **shapes) {
  int64_t n = 1;
  for (int d = 0; d < ndims[index]; ++d) n *= shapes[index][d];
  return n;
}

}  // namespace

// THOR's Kronecker factors (ms_optim/_thor/factor_kernels.py): the diagonal blocks of
// scale * sum_t c_t c_t^T for the columns c_t of a layer's input (im2col patches of a conv, the
// rows of a Dense input, the positions of a conv's dL/ds), formed and stored by one op per factor.
// The products go through the GEMM bound by MsOptimSetSgemm (row-major, oneDNN's dnnl_sgemm
// signature); no GEMM bound: the entry points return an error and write nothing.
namespace {

using SgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                        int64_t, float, float *, int64_t);
SgemmFn g_sgemm = nullptr;

// Reads element i of a float32 or float16 input as float.
struct Source {
  const void *data;
  bool half;
  float operator[](int64_t i) const {
    return half ? static_cast<float>(static_cast<const _Float16 *>(data)[i]) : static_cast<const float *>(data)[i];
  }
};

bool Is(const char *dtype, const char *name) { return dtype != nullptr && std::strcmp(dtype, name) == 0; }

bool IsFloat(const char *dtype) { return Is(dtype, "float32") || Is(dtype, "float16"); }

// Scales the blocks, and copies them into the factor only if every value is finite. Returns 1 when written.
float Store(std::vector<float> &blocks, float scale, float *factor) {
  bool finite = true;
  for (float &v : blocks) {
    v *= scale;
    finite = finite && std::isfinite(v);
  }
  if (!finite) return 0.0f;
  std::memcpy(factor, blocks.data(), blocks.size() * sizeof(float));
  return 1.0f;
}

// The written[1] output of a factor op (inputs factor, x, flag, plan), set to 0; nullptr when its flag is
// False (nothing to do).
float *FactorOutput(void **params) {
  float *out = static_cast<float *>(params[4]);
  out[0] = 0.0f;
  return *static_cast<const bool *>(params[2]) ? out : nullptr;
}

// Scales the result by plan[0] and stores it into the factor (params[0]) if finite; sets the output.
int Finish(void **params, std::vector<float> &result, float *out) {
  const double scale = static_cast<const double *>(params[3])[0];
  out[0] = Store(result, static_cast<float>(scale), static_cast<float *>(params[0]));
  return 0;
}

}  // namespace

extern "C" void MsOptimSetSgemm(void *fn) { g_sgemm = reinterpret_cast<SgemmFn>(fn); }

// Patch gram of an NCHW input: inputs factor (written: nblocks*bs*bs floats), x (B, C, H, W) float32 or
// float16, flag (bool: nothing is done when false), plan (float64[14]: scale, kh, kw, sh, sw, dh, dw,
// pad_top, pad_left, out_h, out_w, nblocks, bs, panel floats); output written[1]. The patches of a block
// are laid out for as many samples at a time as fit the panel floats (at least one). Row
// r = c*kh*kw + i*kw + j of the patch at output (oy, ox) is x[c, oy*sh - pad_top + i*dh, ox*sw - pad_left + j*dw],
// zero outside.
// A conv's G is the same with a 1x1 kernel over dL/ds.
extern "C" int MsOptimPatchGram(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void * /*stream*/, void * /*extra*/) {
  if (nparam != 5 || ndims[1] != 4 || g_sgemm == nullptr || !IsFloat(dtypes[1])) return 1;
  float *out = FactorOutput(params);
  if (out == nullptr) return 0;
  const Source x{params[1], Is(dtypes[1], "float16")};
  const double *p = static_cast<const double *>(params[3]);
  const int64_t batch = shapes[1][0], channels = shapes[1][1], height = shapes[1][2], width = shapes[1][3];
  const int64_t kh = p[1], kw = p[2], sh = p[3], sw = p[4], dh = p[5], dw = p[6], top = p[7], left = p[8];
  const int64_t oh = p[9], ow = p[10], nblocks = p[11], bs = p[12], panel_floats = p[13];
  const int64_t n = channels * kh * kw, positions = oh * ow;
  std::vector<float> blocks(nblocks * bs * bs, 0.0f);
  const int64_t samples = std::max<int64_t>(1, std::min<int64_t>(batch, panel_floats / (bs * positions)));
  std::unique_ptr<float[]> panel(new float[bs * samples * positions]);  // every used entry is written
  for (int64_t k = 0; k < nblocks; ++k) {
    const int64_t r0 = k * bs, rows = std::min(bs, n - r0);
    for (int64_t b0 = 0; b0 < batch; b0 += samples) {
      const int64_t nb = std::min(samples, batch - b0), cols = nb * positions;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = (r0 + r) / (kh * kw), i = (r0 + r) % (kh * kw) / kw, j = (r0 + r) % kw;
        float *row = panel.get() + r * cols;
        for (int64_t s = 0; s < nb; ++s) {
          const int64_t base = ((b0 + s) * channels + c) * height * width;
          for (int64_t oy = 0; oy < oh; ++oy) {
            const int64_t iy = oy * sh - top + i * dh;
            float *dst = row + s * positions + oy * ow;
            if (iy < 0 || iy >= height) {
              std::fill(dst, dst + ow, 0.0f);
              continue;
            }
            for (int64_t ox = 0; ox < ow; ++ox) {
              const int64_t ix = ox * sw - left + j * dw;
              dst[ox] = (ix < 0 || ix >= width) ? 0.0f : x[base + iy * width + ix];
            }
          }
        }
      }
      g_sgemm('N', 'T', rows, rows, cols, 1.0f, panel.get(), cols, panel.get(), cols, b0 == 0 ? 0.0f : 1.0f,
              blocks.data() + k * bs * bs, bs);
    }
  }
  return Finish(params, blocks, out);
}

// Row gram of a (N, n) input: inputs factor (written), rows float32 or float16, flag, plan (float64[3]:
// scale, nblocks, bs); output written[1]. Block k is scale * R_k^T R_k for the columns k*bs.. of R.
extern "C" int MsOptimRowGram(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void * /*stream*/, void * /*extra*/) {
  if (nparam != 5 || ndims[1] != 2 || g_sgemm == nullptr || !IsFloat(dtypes[1])) return 1;
  float *out = FactorOutput(params);
  if (out == nullptr) return 0;
  const double *p = static_cast<const double *>(params[3]);
  const int64_t rows = shapes[1][0], n = shapes[1][1], nblocks = p[1], bs = p[2];
  std::vector<float> converted;
  const float *r = static_cast<const float *>(params[1]);
  if (Is(dtypes[1], "float16")) {
    const Source half{params[1], true};
    converted.resize(rows * n);
    for (int64_t i = 0; i < rows * n; ++i) converted[i] = half[i];
    r = converted.data();
  }
  std::vector<float> blocks(nblocks * bs * bs, 0.0f);
  for (int64_t k = 0; k < nblocks; ++k) {
    const int64_t width = std::min(bs, n - k * bs);
    g_sgemm('T', 'N', width, width, rows, 1.0f, r + k * bs, n, r + k * bs, n, 0.0f, blocks.data() + k * bs * bs, bs);
  }
  return Finish(params, blocks, out);
}

// Id counts of an Embedding: inputs factor (written: vocab floats), ids int32 or int64 (any shape), flag,
// plan (float64[1]: scale); output written[1]. factor[v] = scale * (occurrences of v); other ids not counted.
extern "C" int MsOptimIdCounts(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void * /*stream*/, void * /*extra*/) {
  if (nparam != 5 || !(Is(dtypes[1], "int32") || Is(dtypes[1], "int64"))) return 1;
  float *out = FactorOutput(params);
  if (out == nullptr) return 0;
  const int64_t vocab = NumElements(0, ndims, shapes), count = NumElements(1, ndims, shapes);
  const bool wide = Is(dtypes[1], "int64");
  std::vector<float> counts(vocab, 0.0f);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = wide ? static_cast<const int64_t *>(params[1])[i] : static_cast<const int32_t *>(params[1])[i];
    if (id >= 0 && id < vocab) counts[id] += 1.0f;
  }
  return Finish(params, counts, out);
}

// THOR's preconditioned gradient G^-1 g A^-1 of a Dense or conv weight gradient g (out, ...) float32, read as
// the (out, k) matrix of its first axis against the others (a conv kernel: k = in*kh*kw), with the inverses
// stored as diagonal blocks g_inv (ng, bg, bg) and a_inv (na, ba, ba) (the last block's padding is not read: the
// padded rows and columns of g would be zero); output float32 in g's shape.
extern "C" int MsOptimBlockPrecondition(int nparam, void **params, int *ndims, int64_t **shapes,
                                        const char **dtypes, void * /*stream*/, void * /*extra*/) {
  if (nparam != 4 || ndims[0] < 2 || ndims[1] != 3 || ndims[2] != 3 || g_sgemm == nullptr) return 1;
  if (!Is(dtypes[0], "float32") || !Is(dtypes[1], "float32") || !Is(dtypes[2], "float32")) return 1;
  const int64_t rows = shapes[0][0];
  int64_t cols = 1;
  for (int d = 1; d < ndims[0]; ++d) cols *= shapes[0][d];
  const int64_t ng = shapes[1][0], bg = shapes[1][1], na = shapes[2][0], ba = shapes[2][1];
  if (ng * bg < rows || na * ba < cols) return 1;
  const float *g = static_cast<const float *>(params[0]);
  const float *g_inv = static_cast<const float *>(params[1]);
  const float *a_inv = static_cast<const float *>(params[2]);
  float *out = static_cast<float *>(params[3]);
  std::unique_ptr<float[]> left(new float[rows * cols]);  // written whole by the first products
  for (int64_t i = 0; i < ng && i * bg < rows; ++i) {
    const int64_t r0 = i * bg, w = std::min(bg, rows - r0);
    g_sgemm('N', 'N', w, cols, w, 1.0f, g_inv + i * bg * bg, bg, g + r0 * cols, cols, 0.0f, left.get() + r0 * cols,
            cols);
  }
  for (int64_t j = 0; j < na && j * ba < cols; ++j) {
    const int64_t c0 = j * ba, w = std::min(ba, cols - c0);
    g_sgemm('N', 'N', rows, w, w, 1.0f, left.get() + c0, cols, a_inv + j * ba * ba, ba, 0.0f, out + c0, cols);
  }
  return 0;
}

namespace {

// Inverts the n x n row-major matrix a in place (Gauss-Jordan, partial pivoting); false at a zero or
// non-finite pivot (a is then left partly reduced).
MS_OPTIM_CLONES bool InvertInPlace(double *a, int64_t n, std::vector<int64_t> &swaps) {
  for (int64_t k = 0; k < n; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < n; ++i) p = std::fabs(a[i * n + k]) > std::fabs(a[p * n + k]) ? i : p;
    const double pivot = a[p * n + k];
    if (!(std::fabs(pivot) > 0.0) || !std::isfinite(pivot)) return false;
    swaps[k] = p;
    if (p != k) std::swap_ranges(a + k * n, a + (k + 1) * n, a + p * n);
    double *row = a + k * n;
    row[k] = 1.0;
    for (int64_t j = 0; j < n; ++j) row[j] /= pivot;
    for (int64_t i = 0; i < n; ++i) {
      double *other = a + i * n;
      const double f = other[k];
      if (i == k || f == 0.0) continue;
      other[k] = 0.0;
      for (int64_t j = 0; j < n; ++j) other[j] -= f * row[j];
    }
  }
  for (int64_t k = n - 1; k >= 0; --k) {
    if (swaps[k] == k) continue;
    for (int64_t i = 0; i < n; ++i) std::swap(a[i * n + k], a[i * n + swaps[k]]);
  }
  return true;
}

// The damped inverses of a factor's blocks (see MsOptimBlockInverse) into `inverse` (nblocks * bs * bs), with
// the inputs factor, lam, scale (float32) and plan (float64[3]: nblocks, pad, tolerance) at params[first..first+3]
// and the inverse's shape (nblocks, bs, bs) at shapes[shape]: 1 when every block is accepted, 0 when one is
// rejected, -1 when the inputs do not fit.
int DampedInverses(void **params, int *ndims, int64_t **shapes, const char **dtypes, int first, int shape,
                   float *inverse) {
  if (ndims[shape] != 3 || g_sgemm == nullptr || !Is(dtypes[first + 3], "float64")) return -1;
  for (int i = 0; i < 3; ++i)
    if (!Is(dtypes[first + i], "float32")) return -1;
  const double *plan = static_cast<const double *>(params[first + 3]);
  const int64_t nblocks = plan[0], pad = plan[1], bs = shapes[shape][1], size = bs * bs;
  if (shapes[shape][0] != nblocks || shapes[shape][2] != bs || NumElements(first, ndims, shapes) != nblocks * size)
    return -1;
  const float *factor = static_cast<const float *>(params[first]);
  const float lam = *static_cast<const float *>(params[first + 1]);
  const float scale = *static_cast<const float *>(params[first + 2]);
  std::vector<float> damped(size), residual(size);
  std::vector<double> work(size);
  std::vector<int64_t> swaps(bs);
  for (int64_t k = 0; k < nblocks; ++k) {
    for (int64_t i = 0; i < size; ++i) damped[i] = factor[k * size + i] * scale;
    for (int64_t i = 0; i < bs; ++i) damped[i * bs + i] += lam + (k == nblocks - 1 && i >= bs - pad ? 1.0f : 0.0f);
    std::copy(damped.begin(), damped.end(), work.begin());
    if (!InvertInPlace(work.data(), bs, swaps)) return 0;
    float *x = inverse + k * size;
    std::copy(work.begin(), work.end(), x);
    g_sgemm('N', 'N', bs, bs, bs, 1.0f, damped.data(), bs, x, bs, 0.0f, residual.data(), bs);
    float total = 0.0f, largest = 0.0f;
    for (int64_t i = 0; i < size; ++i) {
      const float r = std::fabs(residual[i] - (i % (bs + 1) == 0 ? 1.0f : 0.0f));
      total += r;
      largest = std::max(largest, r);
    }
    if (!std::isfinite(total) || !(largest <= plan[2])) return 0;
  }
  return 1;
}

}  // namespace

// THOR's damped inversion of one factor's diagonal blocks, written in place (ms_optim/_thor/grouped.py):
// inputs inverse (nblocks, bs, bs) float32 (written), factor (as many float32), lam and scale (float32, one
// value each), plan (float64[3]: nblocks, pad, tolerance); output written[1]. Block k: D = scale * F_k +
// (lam + p) I (p = 1 on the last block's last `pad` diagonal entries), X = D^-1 (Gauss-Jordan in double,
// stored as float32), accepted if sum |D X - I| is finite and max |D X - I| <= tolerance (float32 product);
// the inverse is written only when every block is accepted, and written[0] is then 1.
extern "C" int MsOptimBlockInverse(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void * /*stream*/, void * /*extra*/) {
  if (nparam != 6 || !Is(dtypes[0], "float32")) return 1;
  std::vector<float> inverse(NumElements(0, ndims, shapes));
  const int ok = DampedInverses(params, ndims, shapes, dtypes, 1, 0, inverse.data());
  if (ok < 0) return 1;
  if (ok) std::memcpy(params[0], inverse.data(), inverse.size() * sizeof(float));
  static_cast<float *>(params[5])[0] = static_cast<float>(ok);
  return 0;
}

// The same as a pure op (the layer-by-layer inversion, ms_optim/_thor/slot.py): inputs factor (nblocks, bs, bs),
// lam, scale, plan; outputs the inverse (nblocks, bs, bs) float32 (zeros when rejected) and accepted[1].
extern "C" int MsOptimBlockInverseOut(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                      void * /*stream*/, void * /*extra*/) {
  if (nparam != 6 || !Is(dtypes[4], "float32")) return 1;
  float *inverse = static_cast<float *>(params[4]);
  const int ok = DampedInverses(params, ndims, shapes, dtypes, 0, 4, inverse);
  if (ok < 0) return 1;
  if (!ok) std::fill(inverse, inverse + NumElements(4, ndims, shapes), 0.0f);
  static_cast<float *>(params[5])[0] = static_cast<float>(ok);
  return 0;
}
