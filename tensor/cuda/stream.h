#pragma once
// Per-device streams and events.
//
// Note [Loom streams]
// Every device has three long-lived streams, all created on first use with
// cudaStreamNonBlocking (so they never serialise with the legacy default stream):
//  - the compute stream, where ops launch their kernels,
//  - the comm stream, where collectives run, so that communication overlaps compute, and
//  - the copy stream, for copies between host and device memory that overlap compute (the
//    sharding engine's offloaded gradients: Note [Offloaded gradients on the copy stream]).
// Work crosses between them only through events (Event::record + Event::wait_on), never a
// host synchronisation. The streams are intentionally never destroyed: a destructor running
// at exit could run after the driver has shut down.
//
// current_stream(device) is the compute stream unless the calling thread installed another
// one with a StreamGuard; allocations and ops use current_stream.

#include <cuda_runtime_api.h>

namespace loom::cuda {

// The device's compute stream. Thread-safe; throws loom::Error for a bad index or a
// failing cudaStreamCreateWithFlags.
cudaStream_t compute_stream(int device);

// The device's stream for collectives. Thread-safe.
cudaStream_t comm_stream(int device);

// The device's stream for host/device copies that overlap compute. Thread-safe.
cudaStream_t copy_stream(int device);

// The calling thread's stream for `device`: the innermost StreamGuard's, otherwise the
// compute stream.
cudaStream_t current_stream(int device);

// Overrides current_stream(device) for the calling thread until destruction, which
// restores the previous override (guards nest). The stream must belong to `device`; the
// guard must end on the thread that made it.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  bool had_previous_;
  cudaStream_t previous_;
};

// Owns a cudaEvent_t, created on the current device (timing disabled unless asked). Recording
// on a stream of another device recreates the event there. Move-only; the destructor never
// throws. An event that was never recorded counts as complete (query() is true).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `stream` so far. Does not block.
  void record(cudaStream_t stream);
  // True when the captured work has finished. Does not block.
  bool query() const;
  // Blocks the calling thread until the captured work has finished.
  void synchronize() const;
  // Makes `stream` wait (on the device, not the host) for the captured work.
  void wait_on(cudaStream_t stream) const;
  // Milliseconds between this event and `end`; both must be timing events that were
  // recorded, and `end` must have completed (call end.synchronize() first).
  float elapsed_ms(const Event& end) const;

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }

 private:
  void destroy() noexcept;

  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
  bool recorded_ = false;
};

}  // namespace loom::cuda
