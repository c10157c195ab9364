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

// The product L g R of a Dense or conv weight's vector g (out, ...) float32, read as the (out, k) matrix of its
// first axis against the others (a conv kernel: k = in*kh*kw), with L and R stored as diagonal blocks
// (nblocks, bs, bs), or as one (n, n) block (the last block's padding is not read: the padded rows and columns of
// g would be zero), times scale; output float32 in g's shape. Returns false when the inputs do not fit.
namespace {

bool Blocks(int index, int *ndims, int64_t **shapes, int64_t *nblocks, int64_t *bs) {
  if (ndims[index] == 3) {
    *nblocks = shapes[index][0];
    *bs = shapes[index][1];
    return shapes[index][2] == *bs;
  }
  if (ndims[index] == 2) {
    *nblocks = 1;
    *bs = shapes[index][0];
    return shapes[index][1] == *bs;
  }
  return false;
}

bool BlockProduct(void **params, int *ndims, int64_t **shapes, const char **dtypes, float scale, float *out) {
  if (ndims[0] < 2 || g_sgemm == nullptr) return false;
  if (!Is(dtypes[0], "float32") || !Is(dtypes[1], "float32") || !Is(dtypes[2], "float32")) return false;
  const int64_t rows = shapes[0][0];
  int64_t cols = 1;
  for (int d = 1; d < ndims[0]; ++d) cols *= shapes[0][d];
  int64_t ng = 0, bg = 0, na = 0, ba = 0;
  if (!Blocks(1, ndims, shapes, &ng, &bg) || !Blocks(2, ndims, shapes, &na, &ba)) return false;
  if (ng * bg < rows || na * ba < cols) return false;
  const float *g = static_cast<const float *>(params[0]);
  const float *left_blocks = static_cast<const float *>(params[1]);
  const float *right_blocks = static_cast<const float *>(params[2]);
  std::unique_ptr<float[]> left(new float[rows * cols]);  // written whole by the first products
  for (int64_t i = 0; i < ng && i * bg < rows; ++i) {
    const int64_t r0 = i * bg, w = std::min(bg, rows - r0);
    g_sgemm('N', 'N', w, cols, w, 1.0f, left_blocks + i * bg * bg, bg, g + r0 * cols, cols, 0.0f,
            left.get() + r0 * cols, cols);
  }
  for (int64_t j = 0; j < na && j * ba < cols; ++j) {
    const int64_t c0 = j * ba, w = std::min(ba, cols - c0);
    g_sgemm('N', 'N', rows, w, w, scale, left.get() + c0, cols, right_blocks + j * ba * ba, ba, 0.0f, out + c0,
            cols);
  }
  return true;
}

}  // namespace

// THOR's preconditioned gradient G^-1 g A^-1 (inputs g, g_inv, a_inv; the stored inverse blocks).
extern "C" int MsOptimBlockPrecondition(int nparam, void **params, int *ndims, int64_t **shapes,
                                        const char **dtypes, void * /*stream*/, void * /*extra*/) {
  if (nparam != 4) return 1;
  return BlockProduct(params, ndims, shapes, dtypes, 1.0f, static_cast<float *>(params[3])) ? 0 : 1;
}

// The curvature product scale * G v A (inputs v, the stored factors G and A, scale[1] float32).
extern "C" int MsOptimBlockProduct(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void * /*stream*/, void * /*extra*/) {
  if (nparam != 5 || !Is(dtypes[3], "float32") || NumElements(3, ndims, shapes) != 1) return 1;
  const float scale = static_cast<const float *>(params[3])[0];
  return BlockProduct(params, ndims, shapes, dtypes, scale, static_cast<float *>(params[4])) ? 0 : 1;
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

// each product and sum rounded to float32 in the order the composite ops round them
#define MS_OPTIM_ROUNDED __attribute__((optimize("no-associative-math", "fp-contract=off")))

// learning_rate="adaptive" on all the parameters at once (ms_optim/_thor/step/quad_model.py, update.py): each op
// one pass over every parameter's arrays, float32, instead of a handful of elementwise ops per parameter (the
// moves round as the composite ops do, so both paths take the same steps). The parameters' arrays come in groups
// of P inputs (parameter j at position group * P + j), then the scalars.
namespace {

// P from nparam = groups * P + extra, and every group's j-th input float32 with parameter j's size; -1 if not.
int64_t Groups(int nparam, int groups, int extra, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam < extra + groups || (nparam - extra) % groups != 0) return -1;
  const int64_t count = (nparam - extra) / groups;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t n = NumElements(static_cast<int>(j), ndims, shapes);
    for (int g = 0; g < groups; ++g) {
      const int index = static_cast<int>(g * count + j);
      if (!Is(dtypes[index], "float32") || NumElements(index, ndims, shapes) != n) return -1;
    }
  }
  return count;
}

const float *Scalars(void **params, int index, const char **dtypes, int *ndims, int64_t **shapes, int64_t n) {
  if (!Is(dtypes[index], "float32") || NumElements(index, ndims, shapes) != n) return nullptr;
  return static_cast<const float *>(params[index]);
}

}  // namespace

// MsOptimQuadTrial(weights[P], stored[P], previous[P], directions[P], coefs[2] = a0, b0) -> written[1]:
//   stored = -direction;   weight += a0 * stored + b0 * previous      (weights and stored written)
extern "C" MS_OPTIM_CLONES MS_OPTIM_ROUNDED int MsOptimQuadTrial(int nparam, void **params, int *ndims,
                                                                 int64_t **shapes, const char **dtypes,
                                                                 void * /*stream*/, void * /*extra*/) {
  const int64_t count = Groups(nparam, 4, 2, ndims, shapes, dtypes);
  if (count < 0) return 1;
  const float *coefs = Scalars(params, static_cast<int>(4 * count), dtypes, ndims, shapes, 2);
  if (coefs == nullptr) return 1;
  const float a0 = coefs[0], b0 = coefs[1];
  for (int64_t j = 0; j < count; ++j) {
    const int64_t n = NumElements(static_cast<int>(j), ndims, shapes);
    float *weight = static_cast<float *>(params[j]);
    float *stored = static_cast<float *>(params[count + j]);
    const float *previous = static_cast<const float *>(params[2 * count + j]);
    const float *direction = static_cast<const float *>(params[3 * count + j]);
    for (int64_t i = 0; i < n; ++i) {
      const float x = -direction[i];
      stored[i] = x;
      const float step = a0 * x + b0 * previous[i];
      weight[i] += step;
    }
  }
  static_cast<float *>(params[nparam - 1])[0] = 1.0f;
  return 0;
}

// MsOptimQuadMove(weights[P], previous[P], vectors[P], coefs[4] = c0, c1, c2, c3) -> written[1]:
//   weight += c0 * vector + c1 * previous;   previous = c2 * vector + c3 * previous   (weights, previous written)
extern "C" MS_OPTIM_CLONES MS_OPTIM_ROUNDED int MsOptimQuadMove(int nparam, void **params, int *ndims,
                                                                int64_t **shapes, const char **dtypes,
                                                                void * /*stream*/, void * /*extra*/) {
  const int64_t count = Groups(nparam, 3, 2, ndims, shapes, dtypes);
  if (count < 0) return 1;
  const float *coefs = Scalars(params, static_cast<int>(3 * count), dtypes, ndims, shapes, 4);
  if (coefs == nullptr) return 1;
  const float c0 = coefs[0], c1 = coefs[1], c2 = coefs[2], c3 = coefs[3];
  for (int64_t j = 0; j < count; ++j) {
    const int64_t n = NumElements(static_cast<int>(j), ndims, shapes);
    float *weight = static_cast<float *>(params[j]);
    float *previous = static_cast<float *>(params[count + j]);
    const float *vector = static_cast<const float *>(params[2 * count + j]);
    for (int64_t i = 0; i < n; ++i) {
      const float v = vector[i], y = previous[i];
      const float step = c0 * v + c1 * y;
      weight[i] += step;
      previous[i] = c2 * v + c3 * y;
    }
  }
  static_cast<float *>(params[nparam - 1])[0] = 1.0f;
  return 0;
}

// MsOptimQuadProducts(first[P], second[P], gradients[P], terms[P], first_products[P], second_products[P],
// plan float64[1 + P] = directions k (1 or 2), then per parameter 1 * decayed + 2 * curved) -> out (4, 2, 2):
//   out[0] = D = <v_i, v_k>,   out[1] = R = D over the decayed parameters,
//   out[2] = A = <c(v_i), v_k> over the curved parameters (symmetrised),   out[3] = [<g, v_i>; <t, v_i> decayed]
// (t: the decay terms wd * w)
// with v_0 = first, v_1 = second (read only when k == 2; the rest of out is 0), sums in double precision.
extern "C" MS_OPTIM_CLONES int MsOptimQuadProducts(int nparam, void **params, int *ndims, int64_t **shapes,
                                                   const char **dtypes, void * /*stream*/, void * /*extra*/) {
  const int64_t count = Groups(nparam, 6, 2, ndims, shapes, dtypes);
  if (count < 0 || !Is(dtypes[6 * count], "float64") || NumElements(static_cast<int>(6 * count), ndims, shapes) !=
      count + 1 || !Is(dtypes[6 * count + 1], "float32") || NumElements(static_cast<int>(6 * count + 1), ndims,
                                                                         shapes) != 16)
    return 1;
  const double *plan = static_cast<const double *>(params[6 * count]);
  const bool two = plan[0] > 1.5;
  double d[3] = {0, 0, 0}, r[3] = {0, 0, 0}, a[4] = {0, 0, 0, 0}, e[2] = {0, 0}, w[2] = {0, 0};
  for (int64_t j = 0; j < count; ++j) {
    const int64_t n = NumElements(static_cast<int>(j), ndims, shapes);
    const int flags = static_cast<int>(plan[1 + j]);
    const bool decayed = flags & 1, curved = flags & 2;
    const float *x = static_cast<const float *>(params[j]);
    const float *y = static_cast<const float *>(params[count + j]);
    const float *g = static_cast<const float *>(params[2 * count + j]);
    const float *wt = static_cast<const float *>(params[3 * count + j]);
    const float *kx = static_cast<const float *>(params[4 * count + j]);
    const float *ky = static_cast<const float *>(params[5 * count + j]);
    // double products and sums: the model is small differences of these inner products
    const int64_t kBlock = 2048;
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t end = std::min(start + kBlock, n);
      double pxx = 0, pxy = 0, pyy = 0, pgx = 0, pgy = 0, pwx = 0, pwy = 0, pax = 0, paxy = 0, payx = 0, pay = 0;
      for (int64_t i = start; i < end; ++i) {
        const double xi = x[i];
        pxx += xi * xi;
        pgx += static_cast<double>(g[i]) * xi;
        if (decayed) pwx += static_cast<double>(wt[i]) * xi;
        if (curved) pax += static_cast<double>(kx[i]) * xi;
        if (two) {
          const double yi = y[i];
          pxy += xi * yi;
          pyy += yi * yi;
          pgy += static_cast<double>(g[i]) * yi;
          if (decayed) pwy += static_cast<double>(wt[i]) * yi;
          if (curved) {
            paxy += static_cast<double>(kx[i]) * yi;
            payx += static_cast<double>(ky[i]) * xi;
            pay += static_cast<double>(ky[i]) * yi;
          }
        }
      }
      d[0] += pxx; d[1] += pxy; d[2] += pyy;
      e[0] += pgx; e[1] += pgy;
      if (decayed) { r[0] += pxx; r[1] += pxy; r[2] += pyy; w[0] += pwx; w[1] += pwy; }
      if (curved) { a[0] += pax; a[1] += paxy; a[2] += payx; a[3] += pay; }
    }
  }
  float *out = static_cast<float *>(params[nparam - 1]);
  const double cross = 0.5 * (a[1] + a[2]);
  const double values[16] = {d[0], d[1], d[1], d[2], r[0], r[1], r[1], r[2],
                             a[0], cross, cross, a[3], e[0], e[1], w[0], w[1]};
  for (int i = 0; i < 16; ++i) out[i] = static_cast<float>(values[i]);
  return 0;
}
