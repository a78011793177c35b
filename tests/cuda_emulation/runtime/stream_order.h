#pragma once
// Note [The stream-order check]
// On a GPU, work issued to two streams runs concurrently unless something orders it. The
// emulated device runs all work when it is issued, so a missing cudaStreamWaitEvent, or a
// block of memory handed to a second stream while the first may still use it, passes every
// test here and corrupts data on a GPU. A StreamOrderCheck finds those: it follows the order
// CUDA guarantees (with vector clocks, as ThreadSanitizer and PyTorch's CUDA sanitizer,
// TORCH_CUDA_SANITIZER, do) and reports each pair of accesses to one device allocation from
// two streams, at least one of them a write, that nothing orders.
//
// What orders work: the order of one stream; cudaEventRecord(e, s) captures the work issued
// to s so far and cudaStreamWaitEvent(t, e) puts t's later work after it; the host's waits
// (cudaEventSynchronize, a cudaEventQuery or cudaStreamQuery that answers complete,
// cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy) put all work issued
// after them, by any host thread, after what they waited for. (Host threads hand work to one
// another through locks and queues that this cannot see; one clock for the host may hide a
// race between two threads but never invents one.)
//
// What is an access: a word of a kernel's, a matmul's, a copy's or a fill's arguments that
// points into an allocation the lookup knows (the caching allocator's blocks), as it runs;
// read if the word is read_only (ArgumentWord), else a write. Captured work counts when its
// graph is launched, on the launch's stream. Not followed: host memory, and the emulated
// NCCL's work (which does not go through the emulated streams).

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "work_log.h"

namespace loom::cuda_emulation {

class StreamOrderCheck {
 public:
  // Checks the device's work while it exists. Up to 4 may be live at once, each seeing all
  // the work (a test's own inside the one that covers every test: stream_order_in_tests.cpp);
  // one must outlive the work it sees.
  explicit StreamOrderCheck(AllocationLookup lookup);
  StreamOrderCheck(const StreamOrderCheck&) = delete;
  StreamOrderCheck& operator=(const StreamOrderCheck&) = delete;
  ~StreamOrderCheck();

  // The name reports give `stream` ("the copy stream"); others are named by address.
  void name(const void* stream, std::string label);
  // The unordered pairs found so far, each kind once: "cudaMemcpyAsync on the copy stream
  // wrote 4096 bytes at 0x... that scale_kernel on the compute stream read, with nothing
  // ordering them".
  std::vector<std::string> races() const;

  // What the emulated runtime tells it.
  void work(const char* name, const ArgumentWords& words, const void* stream);
  void event_recorded(const void* event, const void* stream);
  void stream_waits(const void* stream, const void* event);
  void host_waited_for_event(const void* event);
  void host_waited_for_stream(const void* stream);
  void host_waited_for_device();

 private:
  using Clock = std::map<const void*, unsigned long long>;  // stream -> work issued to it
  struct Access {
    const void* stream;
    unsigned long long tick;  // its stream's count at the access
    std::string name;
  };
  struct History {  // of one allocation
    size_t bytes;
    std::vector<Access> writes, reads;  // the latest of each stream
  };
  static void merge(Clock& into, const Clock& from);
  bool ordered_before(const Access& earlier, const Clock& now) const;
  std::string stream_name(const void* stream) const;
  void report(const Access& now, bool writes, const Access& then, bool then_wrote, const char* base,
              size_t bytes);

  AllocationLookup lookup_;
  mutable std::mutex mutex_;
  std::map<const void*, Clock> streams_;
  std::map<const void*, Clock> events_;
  Clock host_;
  std::map<const char*, History> allocations_;  // by start
  std::map<const void*, std::string> names_;
  std::set<std::string> kinds_;  // of races reported
  std::vector<std::string> races_;
};

// For the runtime: tell the live StreamOrderChecks, if any.
void note_device_work(const char* name, const ArgumentWords& words, const void* stream);
void note_event_recorded(const void* event, const void* stream);
void note_stream_waits(const void* stream, const void* event);
void note_host_waited_for_event(const void* event);
void note_host_waited_for_stream(const void* stream);
void note_host_waited_for_device();

}  // namespace loom::cuda_emulation
