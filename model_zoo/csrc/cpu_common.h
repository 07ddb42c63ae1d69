// Shared by port's CPU kernels (MindSpore ops.Custom AOT functions): dtype check, threads, vectors.
//
// Each kernel source is compiled once per instruction set, into its own library (cpu_kernels.py picks
// one at run time: PORT_CPU_ISA, else the best this CPU has): avx512 (-mavx512f/bw/dq/vl -mfma),
// avx2 (-mavx2 -mfma) and generic (the x86-64 baseline, SSE2). Separate libraries rather than one with
// several code paths: inline and template functions (these and the standard library's) compiled with
// AVX-512 in one translation unit could be the copy the linker keeps for all of them.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace port_cpu {

// Floats in one vector register of the ISA this library is compiled for.
#if defined(__AVX512F__)
constexpr int64_t W = 16;
#elif defined(__AVX__)
constexpr int64_t W = 8;
#else
constexpr int64_t W = 4;
#endif

// Explicit vectors (GCC/Clang vector extensions): left to itself the compiler vectorises the
// attention tiles across rows and shuffles, several times slower. Loads and stores go through memcpy:
// unaligned-safe.
typedef float vecw __attribute__((vector_size(W * sizeof(float))));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
typedef float vec1 __attribute__((vector_size(4)));

template <typename V>
inline V load(const float *p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V>
inline void store(float *p, V v) { std::memcpy(p, &v, sizeof(V)); }

inline bool all_float32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0 && std::strcmp(dtypes[i], "float") != 0) return false;
  }
  return true;
}

// Threads: $PORT_CPU_KERNEL_THREADS, else the CPUs this process may run on.
inline int64_t thread_count() {
  if (const char *env = std::getenv("PORT_CPU_KERNEL_THREADS")) {
    const long n = std::strtol(env, nullptr, 10);
    if (n > 0) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// How many workers parallel_for uses for `tasks` tasks (callers size per-worker buffers with it).
inline int64_t worker_count(int64_t tasks) { return std::min(tasks, thread_count()); }

// Runs body(worker, first, last) over [0, tasks) in contiguous chunks, the calling thread taking the
// first. Plain threads started per call and joined, not OpenMP: an OpenMP pool spins after each
// region and starved MindSpore's own CPU thread pool (a training step ran 1.6x slower).
template <typename F>
inline void parallel_for(int64_t tasks, F body) {
  const int64_t workers = worker_count(tasks);
  std::vector<std::thread> pool;
  pool.reserve(workers > 0 ? workers - 1 : 0);
  for (int64_t w = 1; w < workers; ++w)
    pool.emplace_back(body, w, tasks * w / workers, tasks * (w + 1) / workers);
  if (workers > 0) body(0, 0, tasks / workers);
  for (auto &t : pool) t.join();
}

}  // namespace port_cpu
