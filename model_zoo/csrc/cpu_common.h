// Shared by port's CPU kernels (MindSpore ops.Custom AOT functions): dtype check and threads.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace port_cpu {

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
