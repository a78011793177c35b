#pragma once
// What the emulated device was asked to do, in order, for the tests that count it (issue 46's
// launch budgets, test_emulated_training.cpp): kernel launches by the name written at their
// launch site, the cuBLASLt stand-in's matmuls (one launch each, as cuBLASLt's are for the
// shapes Loom uses), the runtime's copies and fills, which are not kernel launches, and graph
// launches, after which the work the graph replays is logged as it runs, marked replayed.

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace loom::cuda_emulation {

enum class WorkKind { kKernel, kMatmul, kCopy, kFill, kGraph };

struct Work {
  WorkKind kind;
  std::string name;  // the kernel as launched ("cast_kernel<float, __nv_bfloat16>"), or the call
  bool replayed = false;  // run by a graph launch, not issued by the host
};

// Records the device's work while it exists; at most one at a time. Thread-safe.
class WorkLog {
 public:
  WorkLog();
  WorkLog(const WorkLog&) = delete;
  WorkLog& operator=(const WorkLog&) = delete;
  ~WorkLog();

  std::vector<Work> entries() const;
  void clear();
  // Kernels and matmuls run, by the host or a graph: what a GPU profile counts as launches.
  size_t launches() const;
  // What the host launched: kernels, matmuls and graphs, not the work graphs replayed.
  size_t host_launches() const;

  void add(WorkKind kind, const char* name, bool replayed);

 private:
  mutable std::mutex mutex_;
  std::vector<Work> entries_;
};

// Adds to the live WorkLog, if any.
void record_work(WorkKind kind, const char* name, bool replayed = false);

}  // namespace loom::cuda_emulation
