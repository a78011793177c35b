#pragma once
// What the emulated device was asked to do, in order, for the tests that count it (issue 46's
// launch budgets, test_emulated_training.cpp): kernel launches by the name written at their
// launch site, the cuBLASLt stand-in's matmuls (one launch each, as cuBLASLt's are for the
// shapes Loom uses), the runtime's copies and fills, which are not kernel launches, graph
// launches, after which the work the graph replays is logged as it runs, marked replayed, and
// the host's synchronisations (stream, event, device), each with the stream concerned.
// With an AllocationLookup, each launch also carries the bytes its arguments name (issue 46
// item 5): Note [The bytes a launch's arguments name].

#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::cuda_emulation {

enum class WorkKind { kKernel, kMatmul, kCopy, kFill, kGraph, kSync };

// Note [The bytes a launch's arguments name]
// A launch's argument words are the values that may be device addresses: each pointer
// argument, and every pointer-aligned word of each argument of class type (a chunk table's
// or an elementwise launch's operand pointers, which no signature shows), read as the launch
// converts its arguments. A WorkLog given an AllocationLookup resolves them as the work runs:
// the launch's argument bytes are the sizes of the distinct live allocations its words point
// into, each counted once (as asked of the allocator, not rounded), whatever part of one the
// launch touches. So they are the launch's footprint, an upper bound on the bytes a view
// touches and a lower one on the traffic of an allocation both read and written; a word that
// points into no live allocation (a host pointer, an integer) names nothing. For a matmul
// the words are its A, B, C, D and bias (or BGRADA's output), not the workspace.
// Each word also says whether the work only reads what it points at (a pointer-to-const
// parameter, a copy's source, a matmul's A, B and C), for the stream-order check
// (stream_order.h); anything else (a class argument's words, a copy's destination) counts as
// written.

struct ArgumentWord {
  const void* address;
  bool read_only = false;
};
using ArgumentWords = std::vector<ArgumentWord>;

// A live allocation: its start and its bytes.
struct Allocation {
  const void* base;
  size_t bytes;
};
// The live allocation an address points into, or none.
using AllocationLookup = std::function<std::optional<Allocation>(const void* address)>;

struct Work {
  WorkKind kind;
  std::string name;  // the kernel as launched ("cast_kernel<float, __nv_bfloat16>"), or the call
  bool replayed = false;  // run by a graph launch, not issued by the host
  size_t argument_bytes = 0;  // kernels and matmuls, with a lookup: Note [The bytes a launch's ...]
  // The stream it was issued to (a replayed entry: the graph launch's), or the one a
  // cudaStreamSynchronize waited for; null for the legacy default stream, an event's or the
  // device's synchronisation.
  const void* stream = nullptr;
};

// Records the device's work while it exists; at most one at a time. Thread-safe.
class WorkLog {
 public:
  WorkLog();
  // Also counts each launch's argument bytes through `lookup`, which must not launch work.
  explicit WorkLog(AllocationLookup lookup);
  WorkLog(const WorkLog&) = delete;
  WorkLog& operator=(const WorkLog&) = delete;
  ~WorkLog();

  std::vector<Work> entries() const;
  void clear();
  // Kernels and matmuls run, by the host or a graph: what a GPU profile counts as launches.
  size_t launches() const;
  // What the host launched: kernels, matmuls and graphs, not the work graphs replayed.
  size_t host_launches() const;
  // The argument bytes of the kernels and matmuls run (0 without a lookup).
  size_t argument_bytes() const;

  void add(WorkKind kind, const char* name, bool replayed, const ArgumentWords& words,
           const void* stream);

 private:
  AllocationLookup lookup_;
  mutable std::mutex mutex_;
  std::vector<Work> entries_;
};

// Adds to the live WorkLog, if any, and shows the device work (kernels, matmuls, copies and
// fills, as they run) to the live stream-order check (stream_order.h), if any.
void record_work(WorkKind kind, const char* name, bool replayed = false,
                 const ArgumentWords& words = {}, const void* stream = nullptr);

}  // namespace loom::cuda_emulation
