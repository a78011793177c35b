#pragma once
// What the emulated device was asked to do, in order, for the tests that count it (issue 46's
// launch budgets, test_emulated_training.cpp): kernel launches by the name written at their
// launch site, the cuBLASLt stand-in's matmuls (one launch each, as cuBLASLt's are for the
// shapes Loom uses), and the runtime's copies and fills, which are not kernel launches.

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace loom::cuda_emulation {

enum class WorkKind { kKernel, kMatmul, kCopy, kFill };

struct Work {
  WorkKind kind;
  std::string name;  // the kernel as launched ("cast_kernel<float, __nv_bfloat16>"), or the call
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
  // Kernel launches and matmuls: what a GPU profile counts as launches.
  size_t launches() const;

  void add(WorkKind kind, const char* name);

 private:
  mutable std::mutex mutex_;
  std::vector<Work> entries_;
};

// Adds to the live WorkLog, if any.
void record_work(WorkKind kind, const char* name);

}  // namespace loom::cuda_emulation
