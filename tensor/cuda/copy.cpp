#include "tensor/cuda/copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/pinned.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

// Host <-> device copies so far (host_copy_counts).
struct HostCopyCounters {
  std::atomic<uint64_t> copies{0}, bytes{0};
  void add(size_t nbytes) {
    copies.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(nbytes, std::memory_order_relaxed);
  }
};
HostCopyCounters pinned_host_copies, staged_host_copies;

// Big enough to run the copy engine near its bandwidth, small enough that the host-side
// memcpy of one chunk overlaps the DMA of the other.
constexpr size_t kStagingChunk = 4 << 20;

bool is_pinned(const void* ptr) {
  cudaPointerAttributes attributes{};
  cudaError_t status = cudaPointerGetAttributes(&attributes, ptr);
  if (status != cudaSuccess) {
    // Unknown to CUDA (older runtimes report plain host memory as an error): pageable.
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost || attributes.type == cudaMemoryTypeManaged;
}

// Two pinned staging buffers used alternately, each with the event of its last copy.
class Staging {
 public:
  explicit Staging(size_t nbytes)
      : chunk_(std::min(nbytes, kStagingChunk)),
        buffers_{PinnedBuffer(chunk_), PinnedBuffer(nbytes > chunk_ ? chunk_ : 0)} {}

  size_t chunk() const { return chunk_; }
  char* buffer(size_t k) { return static_cast<char*>(buffers_[k].get()); }

  // After a copy involving buffer k was queued on `stream`: the buffer is released only after
  // `stream` passed it (also when an exception unwinds the caller), and wait(k) waits for it.
  void queued(size_t k, cudaStream_t stream) {
    buffers_[k].record_stream(stream);
    if (!events_[k]) events_[k].emplace();
    events_[k]->record(stream);
  }

  // Blocks until the last copy queued on buffer k has finished.
  void wait(size_t k) {
    if (events_[k]) events_[k]->synchronize();
  }

 private:
  size_t chunk_;
  PinnedBuffer buffers_[2];
  std::optional<Event> events_[2];
};

void upload_staged(char* dst, const char* src, size_t nbytes, cudaStream_t stream) {
  Staging staging(nbytes);
  size_t chunk = staging.chunk();
  for (size_t offset = 0, i = 0; offset < nbytes; offset += chunk, ++i) {
    size_t k = i % 2;
    size_t len = std::min(chunk, nbytes - offset);
    staging.wait(k);  // the copy engine is done reading this buffer's previous chunk
    std::memcpy(staging.buffer(k), src + offset, len);
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst + offset, staging.buffer(k), len, cudaMemcpyHostToDevice, stream));
    staging.queued(k, stream);
  }
  // The last chunks may still be in flight: the buffers go back to the pinned cache only
  // after `stream` passed them (record_stream in queued()).
}

void download_staged(char* dst, const char* src, size_t nbytes, cudaStream_t stream) {
  Staging staging(nbytes);
  size_t chunk = staging.chunk();
  size_t chunks = (nbytes + chunk - 1) / chunk;
  auto enqueue = [&](size_t i) {
    size_t offset = i * chunk;
    size_t len = std::min(chunk, nbytes - offset);
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(staging.buffer(i % 2), src + offset, len, cudaMemcpyDeviceToHost, stream));
    staging.queued(i % 2, stream);
  };
  // Keep one chunk in flight while the host copies the other out.
  enqueue(0);
  if (chunks > 1) enqueue(1);
  for (size_t i = 0; i < chunks; ++i) {
    size_t offset = i * chunk;
    size_t len = std::min(chunk, nbytes - offset);
    staging.wait(i % 2);
    std::memcpy(dst + offset, staging.buffer(i % 2), len);
    if (i + 2 < chunks) enqueue(i + 2);
  }
}

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                cudaStream_t stream) {
  if (nbytes == 0) return;
  if (dst == nullptr || src == nullptr) {
    tag::kCuda.fail("copy_bytes of ", nbytes, " bytes from ", src_device, " to ", dst_device,
                    " got a null ", dst == nullptr ? "destination" : "source");
  }
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    check_device_index(src_device.index);
    DeviceGuard guard(dst_device.index);
    if (dst_device.index == src_device.index) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      // Direct over NVLink/PCIe when peer access is enabled, staged by the driver otherwise.
      LOOM_CUDA_CHECK(
          cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream));
    }
    return;
  }
  if (dst_device.is_cuda()) {
    DeviceGuard guard(dst_device.index);
    if (is_pinned(src)) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
      pinned_host_copies.add(nbytes);
    } else {
      upload_staged(static_cast<char*>(dst), static_cast<const char*>(src), nbytes, stream);
      staged_host_copies.add(nbytes);
    }
    return;
  }
  DeviceGuard guard(src_device.index);
  if (is_pinned(dst)) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
    pinned_host_copies.add(nbytes);
  } else {
    download_staged(static_cast<char*>(dst), static_cast<const char*>(src), nbytes, stream);
    staged_host_copies.add(nbytes);
  }
}

HostCopyCounts host_copy_counts() {
  return {pinned_host_copies.copies.load(std::memory_order_relaxed),
          staged_host_copies.copies.load(std::memory_order_relaxed),
          pinned_host_copies.bytes.load(std::memory_order_relaxed),
          staged_host_copies.bytes.load(std::memory_order_relaxed)};
}

void synchronize(int device) {
  DeviceGuard guard(device);
  cudaStream_t compute = compute_stream(device);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(compute));
  cudaStream_t current = current_stream(device);
  if (current != compute) LOOM_CUDA_CHECK(cudaStreamSynchronize(current));
}

}  // namespace loom::cuda
