// Causal self-attention for the CPU, forward and backward, as MindSpore AOT custom kernels.
//
// Why: on the CPU the reference attention (BatchMatMul + mask + softmax + BatchMatMul) materialises
// the full float32 B x N x S x S score tensor several times forward and backward and was ~70% of a
// training step. These kernels never hold more than one row of scores per thread; the backward pass
// recomputes the probabilities from the saved log-sum-exp, as flash attention does.
//
// Layout BNSD, float32 only. q: (B, N, S, D); k, v: (B, G, S, D) with N % G == 0 (grouped-query
// attention without repeating k/v); query i attends to keys 0..i; scale = 1/sqrt(D).
// Forward outputs: o (B, N, S, D), lse (B, N, S) = log(sum_j exp(scale * q_i . k_j)).
// Backward inputs: q, k, v, o, lse, do; outputs: dq, dk, dv.
// ABI: int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
//            void *stream, void *extra) -- inputs first, then outputs; 0 means success.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct Dims {
  int64_t b, n, g, s, d;
};

bool all_float32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0 && std::strcmp(dtypes[i], "float") != 0) return false;
  }
  return true;
}

// Shapes are checked here as well as in Python: a wrong call must fail, not read out of bounds.
bool read_dims(int nparam, int *ndims, int64_t **shapes, Dims *out) {
  if (nparam < 3 || ndims[0] != 4 || ndims[1] != 4 || ndims[2] != 4) return false;
  const int64_t *q = shapes[0], *k = shapes[1], *v = shapes[2];
  Dims d{q[0], q[1], k[1], q[2], q[3]};
  if (k[0] != d.b || v[0] != d.b || v[1] != d.g || k[2] != d.s || v[2] != d.s || k[3] != d.d || v[3] != d.d)
    return false;
  if (d.g <= 0 || d.n % d.g != 0) return false;
  *out = d;
  return true;
}

// dst (D, S) = transpose of src (S, D).
void transpose_sd(const float *src, float *dst, int64_t s, int64_t d) {
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < d; ++j) dst[j * s + i] = src[i * d + j];
}

// scores[j] = q . k_j for j < n, with kt the (D, S) transpose of k.
inline void row_scores(const float *q, const float *kt, int64_t n, int64_t s, int64_t d, float *scores) {
  std::fill(scores, scores + n, 0.0f);
  for (int64_t c = 0; c < d; ++c) {
    const float qc = q[c];
    const float *kc = kt + c * s;
    for (int64_t j = 0; j < n; ++j) scores[j] += qc * kc[j];
  }
}

inline float dot(const float *a, const float *b, int64_t n) {
  float acc = 0.0f;
  for (int64_t j = 0; j < n; ++j) acc += a[j] * b[j];
  return acc;
}

}  // namespace

extern "C" int CausalAttentionForward(int nparam, void **params, int *ndims, int64_t **shapes,
                                      const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 5 || !all_float32(nparam, dtypes) || !read_dims(nparam, ndims, shapes, &dm)) return 1;
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  float *o = static_cast<float *>(params[3]);
  float *lse = static_cast<float *>(params[4]);
  const int64_t S = dm.s, D = dm.d, rep = dm.n / dm.g, tasks = dm.b * dm.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

#pragma omp parallel
  {
    std::vector<float> kt(S * D), vt(S * D), p(S);
    int64_t cached = -1;  // which (b, g) kt/vt hold
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / dm.n, h = t % dm.n, kv = b * dm.g + h / rep;
      if (kv != cached) {
        transpose_sd(k + kv * S * D, kt.data(), S, D);
        transpose_sd(v + kv * S * D, vt.data(), S, D);
        cached = kv;
      }
      const float *qh = q + t * S * D;
      float *oh = o + t * S * D;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = i + 1;
        row_scores(qh + i * D, kt.data(), n, S, D, p.data());
        float m = p[0];
        for (int64_t j = 1; j < n; ++j) m = std::max(m, p[j]);
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp((p[j] - m) * scale);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t c = 0; c < D; ++c) oh[i * D + c] = dot(p.data(), vt.data() + c * S, n) * inv;
        lse[t * S + i] = m * scale + std::log(sum);
      }
    }
  }
  return 0;
}

extern "C" int CausalAttentionBackward(int nparam, void **params, int *ndims, int64_t **shapes,
                                       const char **dtypes, void *, void *) {
  Dims dm;
  if (nparam != 9 || !all_float32(nparam, dtypes) || !read_dims(nparam, ndims, shapes, &dm)) return 1;
  const float *q = static_cast<const float *>(params[0]);
  const float *k = static_cast<const float *>(params[1]);
  const float *v = static_cast<const float *>(params[2]);
  const float *o = static_cast<const float *>(params[3]);
  const float *lse = static_cast<const float *>(params[4]);
  const float *dout = static_cast<const float *>(params[5]);
  float *dq = static_cast<float *>(params[6]);
  float *dk = static_cast<float *>(params[7]);
  float *dv = static_cast<float *>(params[8]);
  const int64_t S = dm.s, D = dm.d, rep = dm.n / dm.g, tasks = dm.b * dm.g;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // One task per (batch, kv head): it owns dk/dv of that head, so no two threads write the same row.
#pragma omp parallel
  {
    std::vector<float> kt(S * D), vt(S * D), dkt(S * D), dvt(S * D), p(S), dp(S);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / dm.g, gi = t % dm.g;
      transpose_sd(k + t * S * D, kt.data(), S, D);
      transpose_sd(v + t * S * D, vt.data(), S, D);
      std::fill(dkt.begin(), dkt.end(), 0.0f);
      std::fill(dvt.begin(), dvt.end(), 0.0f);
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h = (b * dm.n + gi * rep + r);
        const float *qh = q + h * S * D, *oh = o + h * S * D, *doh = dout + h * S * D, *lh = lse + h * S;
        float *dqh = dq + h * S * D;
        for (int64_t i = 0; i < S; ++i) {
          const int64_t n = i + 1;
          const float *qi = qh + i * D, *doi = doh + i * D;
          row_scores(qi, kt.data(), n, S, D, p.data());
          row_scores(doi, vt.data(), n, S, D, dp.data());
          const float delta = dot(doi, oh + i * D, D);
          const float l = lh[i];
          for (int64_t j = 0; j < n; ++j) {
            p[j] = std::exp(p[j] * scale - l);
            dp[j] = p[j] * (dp[j] - delta) * scale;  // dS, the gradient of the raw score q.k
          }
          for (int64_t c = 0; c < D; ++c) {
            dqh[i * D + c] = dot(dp.data(), kt.data() + c * S, n);
            const float qc = qi[c], dc = doi[c];
            float *dkc = dkt.data() + c * S, *dvc = dvt.data() + c * S;
            for (int64_t j = 0; j < n; ++j) {
              dkc[j] += dp[j] * qc;
              dvc[j] += p[j] * dc;
            }
          }
        }
      }
      transpose_sd(dkt.data(), dk + t * S * D, D, S);
      transpose_sd(dvt.data(), dv + t * S * D, D, S);
    }
  }
  return 0;
}
