// RMSNorm for the CPU, forward and backward, as MindSpore AOT custom kernels.
//
// Why: the reference RMSNorm is seven elementwise and reduction ops forward and more backward, each
// a pass over the activations; on the CPU the norms took ~18% of a training step. One pass each way.
//
// float32 only. Forward inputs x (..., H), weight (H), eps (1); outputs y (..., H) and
// rstd (...) = 1/sqrt(mean(x^2) + eps), kept for the backward (as HF: y = weight * (x * rstd)).
// Backward inputs x, weight, rstd, dy; outputs dx (..., H), dweight (H).
//   n = x * rstd, dn = dy * weight, dx = rstd * (dn - n * mean(dn * n)), dweight = sum_rows dy * n.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_common.h"

namespace {

// rows x h from x's shape; false if weight's length is not x's last dimension.
bool read_rows(int *ndims, int64_t **shapes, int64_t *rows, int64_t *h) {
  if (ndims[0] < 1 || ndims[1] != 1) return false;
  *h = shapes[0][ndims[0] - 1];
  *rows = 1;
  for (int i = 0; i < ndims[0] - 1; ++i) *rows *= shapes[0][i];
  return *h > 0 && shapes[1][0] == *h;
}

}  // namespace

extern "C" int RmsNormForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *, void *) {
  int64_t rows, h;
  if (nparam != 5 || !port_cpu::all_float32(nparam, dtypes) || !read_rows(ndims, shapes, &rows, &h)) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = *static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  float *rstd = static_cast<float *>(params[4]);
  port_cpu::parallel_for(rows, [&](int64_t, int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float *xr = x + r * h;
      float *yr = y + r * h;
      float ss = 0.0f;
      for (int64_t c = 0; c < h; ++c) ss += xr[c] * xr[c];
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
      for (int64_t c = 0; c < h; ++c) yr[c] = w[c] * (xr[c] * s);
      rstd[r] = s;
    }
  });
  return 0;
}

extern "C" int RmsNormBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *, void *) {
  int64_t rows, h;
  if (nparam != 6 || !port_cpu::all_float32(nparam, dtypes) || !read_rows(ndims, shapes, &rows, &h)) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float *rstd = static_cast<const float *>(params[2]);
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dw = static_cast<float *>(params[5]);
  // Each worker sums its rows' weight gradient apart; the partial sums are added in worker order, so
  // the result depends only on the thread count.
  const int64_t workers = port_cpu::worker_count(rows);
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(workers, 1) * h), 0.0f);
  port_cpu::parallel_for(rows, [&](int64_t worker, int64_t first, int64_t last) {
    float *dwp = partial.data() + worker * h;
    for (int64_t r = first; r < last; ++r) {
      const float *xr = x + r * h, *dyr = dy + r * h;
      float *dxr = dx + r * h;
      const float s = rstd[r];
      float dot = 0.0f;
      for (int64_t c = 0; c < h; ++c) dot += dyr[c] * w[c] * xr[c];
      const float k = dot * s * s / static_cast<float>(h);  // mean(dn * n) / rstd
      for (int64_t c = 0; c < h; ++c) {
        dxr[c] = s * (dyr[c] * w[c] - xr[c] * k);
        dwp[c] += dyr[c] * xr[c] * s;
      }
    }
  });
  for (int64_t c = 0; c < h; ++c) dw[c] = 0.0f;
  for (int64_t p = 0; p < workers; ++p)
    for (int64_t c = 0; c < h; ++c) dw[c] += partial[p * h + c];
  return 0;
}
