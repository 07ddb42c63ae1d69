// Rotary position embedding (rotate-half layout, as HF Llama) for the CPU, forward and backward, as
// MindSpore AOT custom kernels.
//
// Why: the reference is x*cos + cat(-x2, x1)*sin, seven ops forward (two slices, a negation, a concat,
// two products, a sum) and more backward, each a pass over q or k; one pass each way here.
//
// float32 only. Forward inputs x (B, N, S, D), cos (S, D), sin (S, D); output y (B, N, S, D):
//   y[i] = x[i] cos[i] - x[i + D/2] sin[i]   (i <  D/2)
//   y[i] = x[i] cos[i] + x[i - D/2] sin[i]   (i >= D/2)
// Backward inputs dy, cos, sin; output dx (the transpose of the same rotation):
//   dx[j] = dy[j] cos[j] + dy[j + D/2] sin[j + D/2]   (j <  D/2)
//   dx[j] = dy[j] cos[j] - dy[j - D/2] sin[j - D/2]   (j >= D/2)
#include <cstdint>

#include "cpu_common.h"

namespace {

bool read_shape(int *ndims, int64_t **shapes, int64_t *rows, int64_t *s, int64_t *d) {
  if (ndims[0] != 4 || ndims[1] != 2 || ndims[2] != 2) return false;
  *s = shapes[0][2];
  *d = shapes[0][3];
  *rows = shapes[0][0] * shapes[0][1] * *s;
  for (int t = 1; t <= 2; ++t)
    if (shapes[t][0] != *s || shapes[t][1] != *d) return false;
  return *d > 0 && *d % 2 == 0;
}

// Forward: the rotation; Backward: its transpose, applied to dy.
template <bool Backward>
int rope(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  int64_t rows, s, d;
  if (nparam != 4 || !port_cpu::all_float32(nparam, dtypes) || !read_shape(ndims, shapes, &rows, &s, &d)) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *cos = static_cast<const float *>(params[1]);
  const float *sin = static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  const int64_t h = d / 2;
  port_cpu::parallel_for(rows, [&](int64_t, int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float *xr = x + r * d, *c = cos + (r % s) * d, *sn = sin + (r % s) * d;
      float *yr = y + r * d;
      for (int64_t i = 0; i < h; ++i) {
        if (Backward) {
          yr[i] = xr[i] * c[i] + xr[i + h] * sn[i + h];
          yr[i + h] = xr[i + h] * c[i + h] - xr[i] * sn[i];
        } else {
          yr[i] = xr[i] * c[i] - xr[i + h] * sn[i];
          yr[i + h] = xr[i + h] * c[i + h] + xr[i] * sn[i + h];
        }
      }
    }
  });
  return 0;
}

}  // namespace

extern "C" int RopeForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                           void *) {
  return rope<false>(nparam, params, ndims, shapes, dtypes);
}

extern "C" int RopeBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                            void *) {
  return rope<true>(nparam, params, ndims, shapes, dtypes);
}
