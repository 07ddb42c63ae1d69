// Causal self-attention for the CPU, forward and backward, as MindSpore AOT custom kernels.
//
// Why: on the CPU the reference attention (BatchMatMul + mask + softmax + BatchMatMul) materialises
// the full float32 B x N x S x S score tensor several times forward and backward and was ~70% of a
// training step. These kernels hold one block of score rows per thread; the backward pass recomputes
// the probabilities from the saved log-sum-exp, as flash attention does.
//
// Layout BNSD, float32 only. q: (B, N, S, D); k, v: (B, G, S, D) with N % G == 0 (grouped-query
// attention without repeating k/v); query i attends to keys 0..i; scale = 1/sqrt(D).
// Forward outputs: o (B, N, S, D), lse (B, N, S) = log(sum_j exp(scale * q_i . k_j)).
// Backward inputs: q, k, v, o, lse, do; outputs: dq, dk, dv.
// Packed rows (PackedAttention*): one more input after v, seg (B, S) int32 segment ids; query i then
// attends to keys first(i)..i only, where first(i) starts the run of equal ids that holds i (packing
// puts each example in one run), so attention never crosses examples: a block-diagonal causal mask.
// ABI: int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
//            void *stream, void *extra) -- inputs first, then outputs; 0 means success.
//
// Work is done on blocks of R query rows with register-blocked loops (fixed R and vector width W, so
// the compiler keeps the accumulators in registers):
//   scores   C[r][j]  = sum_c A[r][c] * BT[c][j]      (A = q or do; BT = k or v transposed, padded)
//   outputs  O[r][c]  = sum_j P[r][j] * M[j][c]       (M = v or k, row-major)
//   grads    G[j][c] += sum_r P[r][j] * X[r][c]       (G = dk or dv, X = q or do)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"

namespace {

using port_cpu::all_float32;
using port_cpu::parallel_for;

constexpr int64_t R = 8;  // query rows per block
// Key columns per register tile: one vector of this build's ISA (cpu_common.h). A 16-wide tile on an
// AVX2 build needs 16 ymm accumulators plus operands and spills (4-5x slower; BENCHMARKS.md, "On an AVX2 CPU").
constexpr int64_t JW = port_cpu::W;

struct Dims {
  int64_t b, n, g, s, d;
};

// Shapes are checked here as well as in Python: a wrong call must fail, not read out of bounds.
bool read_dims(int nparam, int *ndims, int64_t **shapes, Dims *out) {
  if (nparam < 3 || ndims[0] != 4 || ndims[1] != 4 || ndims[2] != 4) return false;
  const int64_t *q = shapes[0], *k = shapes[1], *v = shapes[2];
  Dims d{q[0], q[1], k[1], q[2], q[3]};
  if (k[0] != d.b || v[0] != d.b || v[1] != d.g || k[2] != d.s || v[2] != d.s || k[3] != d.d || v[3] != d.d)
    return false;
  if (d.g <= 0 || d.n % d.g != 0 || d.s <= 0 || d.d <= 0) return false;
  *out = d;
  return true;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// dst (D, ld) = transpose of src (S, D); columns S..ld stay zero.
void transpose_pad(const float *src, float *dst, int64_t s, int64_t d, int64_t ld) {
  for (int64_t i = 0; i < s; ++i)
    for (int64_t c = 0; c < d; ++c) dst[c * ld + i] = src[i * d + c];
}

using port_cpu::load;
using port_cpu::store;
using port_cpu::vec1;
using port_cpu::vec4;
using port_cpu::vec8;
using port_cpu::vecw;

// C[r][0 .. W) = sum_{i < k} A[r][i] * B[i][0 .. W), r < R; V is a vector of W floats, A, B and C have
// leading dimensions lda, ldb, ldc. Both products with row outputs use it: scores (A = q block,
// B = k transposed, k = D) and outputs (A = probabilities, B = v or k rows, k = keys seen).
template <typename V>
inline void tile_gemm(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t k, float *C,
                      int64_t ldc) {
  V acc[R] = {};
  for (int64_t i = 0; i < k; ++i) {
    const V b = load<V>(B + i * ldb);
    for (int64_t r = 0; r < R; ++r) acc[r] += A[r * lda + i] * b;
  }
  for (int64_t r = 0; r < R; ++r) store(C + r * ldc, acc[r]);
}

// G[j][c0 .. c0+W) += sum_r P[r][j] * X[r][c0 .. c0+W), j < n.
template <typename V>
inline void tile_grads(const float *P, int64_t ldp, const float *X, int64_t d, int64_t n, int64_t c0,
                       float *G) {
  V x[R];
  for (int64_t r = 0; r < R; ++r) x[r] = load<V>(X + r * d + c0);
  for (int64_t j = 0; j < n; ++j) {
    V g = load<V>(G + j * d + c0);
    for (int64_t r = 0; r < R; ++r) g += P[r * ldp + j] * x[r];
    store(G + j * d + c0, g);
  }
}

// The two D-wide products over all of D, in the widest tiles D allows: full vectors of this ISA,
// then 8, 4 and 1 floats for the tail.
void outputs(const float *P, int64_t ldp, const float *M, int64_t d, int64_t n, float *O) {
  int64_t c = 0;
  for (; c + JW <= d; c += JW) tile_gemm<vecw>(P, ldp, M + c, d, n, O + c, d);
  if constexpr (JW > 8)
    for (; c + 8 <= d; c += 8) tile_gemm<vec8>(P, ldp, M + c, d, n, O + c, d);
  if constexpr (JW > 4)
    for (; c + 4 <= d; c += 4) tile_gemm<vec4>(P, ldp, M + c, d, n, O + c, d);
  for (; c < d; ++c) tile_gemm<vec1>(P, ldp, M + c, d, n, O + c, d);
}

void grads(const float *P, int64_t ldp, const float *X, int64_t d, int64_t n, float *G) {
  int64_t c = 0;
  for (; c + JW <= d; c += JW) tile_grads<vecw>(P, ldp, X, d, n, c, G);
  if constexpr (JW > 8)
    for (; c + 8 <= d; c += 8) tile_grads<vec8>(P, ldp, X, d, n, c, G);
  if constexpr (JW > 4)
    for (; c + 4 <= d; c += 4) tile_grads<vec4>(P, ldp, X, d, n, c, G);
  for (; c < d; ++c) tile_grads<vec1>(P, ldp, X, d, n, c, G);
}

void scores(const float *A, int64_t d, const float *BT, int64_t ldb, int64_t npad, float *C) {
  for (int64_t j0 = 0; j0 < npad; j0 += JW) tile_gemm<vecw>(A, d, BT + j0, ldb, d, C + j0, ldb);
}
// Copy `rows` rows of src (row i0 on) into the R x d block dst, zero rows past the end.
void load_rows(const float *src, int64_t i0, int64_t rows, int64_t d, float *dst) {
  std::memcpy(dst, src + i0 * d, sizeof(float) * rows * d);
  std::fill(dst + rows * d, dst + R * d, 0.0f);
}

// Segment starts per (batch, position) from seg (B, S): first[b*S + i] is where i's run of equal ids
// starts. Without seg (plain causal attention) every start is 0.
std::vector<int64_t> segment_starts(const int32_t *seg, int64_t b, int64_t s) {
  std::vector<int64_t> first(b * s, 0);
  if (seg == nullptr) return first;
  for (int64_t x = 0; x < b; ++x)
    for (int64_t i = 1; i < s; ++i)
      first[x * s + i] = seg[x * s + i] == seg[x * s + i - 1] ? first[x * s + i - 1] : i;
  return first;
}

bool seg_ok(int index, int *ndims, int64_t **shapes, const char **dtypes, const Dims &dm) {
  return ndims[index] == 2 && shapes[index][0] == dm.b && shapes[index][1] == dm.s &&
         (std::strcmp(dtypes[index], "int32") == 0 || std::strcmp(dtypes[index], "int") == 0);
}

bool floats_except(int nparam, const char **dtypes, int skip) {
  for (int i = 0; i < nparam; ++i)
    if (i != skip && !all_float32(1, dtypes + i)) return false;
  return true;
}

int forward(void **params, const Dims &dm, const int32_t *seg, float *o, float *lse) {
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const std::vector<int64_t> starts = segment_starts(seg, dm.b, dm.s);
  const int64_t S = dm.s, D = dm.d, rep = dm.n / dm.g, tasks = dm.b * dm.n, L = round_up(S, JW);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  parallel_for(tasks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<float> kt(D * L, 0.0f), p(R * L), qb(R * D), ob(R * D);
    int64_t cached = -1;  // which (b, g) kt holds
    for (int64_t t = first; t < last; ++t) {
      const int64_t b = t / dm.n, h = t % dm.n, kv = b * dm.g + h / rep;
      const int64_t *fb = starts.data() + b * S;
      if (kv != cached) {
        transpose_pad(k + kv * S * D, kt.data(), S, D, L);
        cached = kv;
      }
      const float *vh = v + kv * S * D;
      for (int64_t i0 = 0; i0 < S; i0 += R) {
        const int64_t rows = std::min(R, S - i0), n = i0 + rows;
        load_rows(q + t * S * D, i0, rows, D, qb.data());
        scores(qb.data(), D, kt.data(), L, round_up(n, JW), p.data());
        for (int64_t r = 0; r < R; ++r) {
          float *pr = p.data() + r * L;
          const int64_t valid = std::min(i0 + r + 1, n), lo = r < rows ? fb[i0 + r] : 0;
          float m = pr[lo];
          for (int64_t j = lo + 1; j < valid; ++j) m = std::max(m, pr[j]);
          float sum = 0.0f;
          for (int64_t j = lo; j < valid; ++j) {
            pr[j] = std::exp((pr[j] - m) * scale);
            sum += pr[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = lo; j < valid; ++j) pr[j] *= inv;
          std::fill(pr, pr + lo, 0.0f);
          std::fill(pr + valid, pr + n, 0.0f);
          if (r < rows) lse[t * S + i0 + r] = m * scale + std::log(sum);
        }
        outputs(p.data(), L, vh, D, n, ob.data());
        std::memcpy(o + (t * S + i0) * D, ob.data(), sizeof(float) * rows * D);
      }
    }
  });
  return 0;
}

// params: q, k, v, then (from `rest` on) o, lse, do, dq, dk, dv.
int backward(void **params, const Dims &dm, const int32_t *seg, int rest) {
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const float *o = static_cast<const float *>(params[rest]);
  const float *lse = static_cast<const float *>(params[rest + 1]);
  const float *dout = static_cast<const float *>(params[rest + 2]);
  float *dq = static_cast<float *>(params[rest + 3]);
  float *dk = static_cast<float *>(params[rest + 4]);
  float *dv = static_cast<float *>(params[rest + 5]);
  const std::vector<int64_t> starts = segment_starts(seg, dm.b, dm.s);
  const int64_t S = dm.s, D = dm.d, rep = dm.n / dm.g, tasks = dm.b * dm.g, L = round_up(S, JW);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // One task per (batch, kv head): it owns dk/dv of that head, so no two threads write the same row.
  parallel_for(tasks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<float> kt(D * L, 0.0f), vt(D * L, 0.0f), p(R * L), dp(R * L), qb(R * D), dob(R * D), dqb(R * D);
    for (int64_t t = first; t < last; ++t) {
      const int64_t b = t / dm.g, gi = t % dm.g;
      const int64_t *fb = starts.data() + b * S;
      const float *kh = k + t * S * D, *vh = v + t * S * D;
      float *dkh = dk + t * S * D, *dvh = dv + t * S * D;
      transpose_pad(kh, kt.data(), S, D, L);
      transpose_pad(vh, vt.data(), S, D, L);
      std::fill(dkh, dkh + S * D, 0.0f);
      std::fill(dvh, dvh + S * D, 0.0f);
      for (int64_t hr = 0; hr < rep; ++hr) {
        const int64_t h = b * dm.n + gi * rep + hr;
        const float *qh = q + h * S * D, *oh = o + h * S * D, *doh = dout + h * S * D, *lh = lse + h * S;
        for (int64_t i0 = 0; i0 < S; i0 += R) {
          const int64_t rows = std::min(R, S - i0), n = i0 + rows, npad = round_up(n, JW);
          load_rows(qh, i0, rows, D, qb.data());
          load_rows(doh, i0, rows, D, dob.data());
          scores(qb.data(), D, kt.data(), L, npad, p.data());
          scores(dob.data(), D, vt.data(), L, npad, dp.data());
          for (int64_t r = 0; r < R; ++r) {
            float *pr = p.data() + r * L, *dpr = dp.data() + r * L;
            const int64_t valid = r < rows ? i0 + r + 1 : 0, lo = r < rows ? fb[i0 + r] : 0;
            float delta = 0.0f, l = 0.0f;
            if (r < rows) {
              const float *orow = oh + (i0 + r) * D, *dorow = dob.data() + r * D;
              for (int64_t c = 0; c < D; ++c) delta += dorow[c] * orow[c];
              l = lh[i0 + r];
            }
            for (int64_t j = lo; j < valid; ++j) {
              pr[j] = std::exp(pr[j] * scale - l);
              dpr[j] = pr[j] * (dpr[j] - delta) * scale;  // dS, the gradient of the raw score q.k
            }
            std::fill(pr, pr + lo, 0.0f);
            std::fill(dpr, dpr + lo, 0.0f);
            std::fill(pr + valid, pr + n, 0.0f);
            std::fill(dpr + valid, dpr + n, 0.0f);
          }
          outputs(dp.data(), L, kh, D, n, dqb.data());
          std::memcpy(dq + (h * S + i0) * D, dqb.data(), sizeof(float) * rows * D);
          grads(dp.data(), L, qb.data(), D, n, dkh);
          grads(p.data(), L, dob.data(), D, n, dvh);
        }
      }
    }
  });
  return 0;
}

}  // namespace

extern "C" int CausalAttentionForward(int nparam, void **params, int *ndims, int64_t **shapes,
                                      const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 5 || !all_float32(nparam, dtypes) || !read_dims(nparam, ndims, shapes, &dm)) return 1;
  return forward(params, dm, nullptr, static_cast<float *>(params[3]), static_cast<float *>(params[4]));
}

extern "C" int CausalAttentionBackward(int nparam, void **params, int *ndims, int64_t **shapes,
                                       const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 9 || !all_float32(nparam, dtypes) || !read_dims(nparam, ndims, shapes, &dm)) return 1;
  return backward(params, dm, nullptr, 3);
}

// Packed rows: q, k, v, seg, o, lse.
extern "C" int PackedAttentionForward(int nparam, void **params, int *ndims, int64_t **shapes,
                                      const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 6 || !floats_except(nparam, dtypes, 3) || !read_dims(nparam, ndims, shapes, &dm) ||
      !seg_ok(3, ndims, shapes, dtypes, dm))
    return 1;
  return forward(params, dm, static_cast<const int32_t *>(params[3]), static_cast<float *>(params[4]),
                 static_cast<float *>(params[5]));
}

// Packed rows: q, k, v, seg, o, lse, do, dq, dk, dv.
extern "C" int PackedAttentionBackward(int nparam, void **params, int *ndims, int64_t **shapes,
                                       const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 10 || !floats_except(nparam, dtypes, 3) || !read_dims(nparam, ndims, shapes, &dm) ||
      !seg_ok(3, ndims, shapes, dtypes, dm))
    return 1;
  return backward(params, dm, static_cast<const int32_t *>(params[3]), 4);
}
