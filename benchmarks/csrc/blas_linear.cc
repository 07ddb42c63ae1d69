// Benchmark only (issue 29, benchmarks/blas_linear.py): y = x W^T and its backward (dx = dy W,
// dW = dy^T x) as MindSpore ops.Custom AOT kernels over an external cblas_sgemm, the OpenBLAS that
// numpy's wheel bundles, to compare with MindSpore's MatMul (oneDNN) inside the same training step.
//
// The library path and the two symbol names (ILP64 builds suffix them, numpy 2's scipy-openblas also
// prefixes them) come from $PORT_BENCH_BLAS_LIB, $PORT_BENCH_BLAS_SGEMM, $PORT_BENCH_BLAS_THREADS.
// OpenBLAS runs on one thread per call and port's parallel_for splits the rows over the CPUs: an
// OpenBLAS thread pool spins after each call, as OpenMP's did, and would starve MindSpore's own threads.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "cpu_common.h"

namespace {

typedef void (*sgemm_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                        int64_t, float, float *, int64_t);
sgemm_t g_sgemm = nullptr;
std::once_flag g_once;
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS enum values

bool load() {
  std::call_once(g_once, [] {
    const char *path = std::getenv("PORT_BENCH_BLAS_LIB");
    const char *sgemm = std::getenv("PORT_BENCH_BLAS_SGEMM");
    const char *threads = std::getenv("PORT_BENCH_BLAS_THREADS");
    void *lib = path && sgemm ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (lib == nullptr) return;
    g_sgemm = reinterpret_cast<sgemm_t>(dlsym(lib, sgemm));
    auto set_threads = threads ? reinterpret_cast<void (*)(int64_t)>(dlsym(lib, threads)) : nullptr;
    if (set_threads) set_threads(1);
  });
  return g_sgemm != nullptr;
}

}  // namespace

// x (M, K), w (N, K) -> y (M, N).
extern "C" int BlasLinearForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *, void *) {
  if (nparam != 3 || !port_cpu::all_float32(nparam, dtypes) || ndims[0] != 2 || ndims[1] != 2 || !load()) return 1;
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][0];
  const float *x = static_cast<const float *>(params[0]), *w = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  port_cpu::parallel_for(m, [&](int64_t, int64_t r0, int64_t r1) {
    if (r1 > r0) g_sgemm(kRowMajor, kNoTrans, kTrans, r1 - r0, n, k, 1.0f, x + r0 * k, k, w, k, 0.0f, y + r0 * n, n);
  });
  return 0;
}

// x (M, K), w (N, K), dy (M, N) -> dx (M, K), dw (N, K); worker t takes rows of dx and rows of dw.
extern "C" int BlasLinearBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *, void *) {
  if (nparam != 5 || !port_cpu::all_float32(nparam, dtypes) || ndims[0] != 2 || ndims[1] != 2 || !load()) return 1;
  const int64_t m = shapes[0][0], k = shapes[0][1], n = shapes[1][0];
  const float *x = static_cast<const float *>(params[0]), *w = static_cast<const float *>(params[1]);
  const float *dy = static_cast<const float *>(params[2]);
  float *dx = static_cast<float *>(params[3]), *dw = static_cast<float *>(params[4]);
  const int64_t parts = port_cpu::worker_count(std::max(m, n));
  port_cpu::parallel_for(parts, [&](int64_t, int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t r0 = m * t / parts, r1 = m * (t + 1) / parts, c0 = n * t / parts, c1 = n * (t + 1) / parts;
      if (r1 > r0) g_sgemm(kRowMajor, kNoTrans, kNoTrans, r1 - r0, k, n, 1.0f, dy + r0 * n, n, w, k, 0.0f, dx + r0 * k, k);
      if (c1 > c0) g_sgemm(kRowMajor, kTrans, kNoTrans, c1 - c0, k, m, 1.0f, dy + c0, n, x, k, 0.0f, dw + c0 * k, k);
    }
  });
  return 0;
}
