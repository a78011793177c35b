#pragma once
// Moving bytes between host and device memory.
//
// copy_bytes orders the copy on `stream` (a stream of the CUDA device involved; for a
// device-to-device copy between two devices, a stream of either). What the caller may do on
// return depends on the memories involved:
//  - host -> host: std::memcpy; done on return (`stream` is unused).
//  - device -> device (same device: cudaMemcpyAsync; two devices: cudaMemcpyPeerAsync):
//    asynchronous. The result is visible to later work on `stream`; other streams or the host
//    must wait for it (an Event, or synchronize).
//  - pinned host -> device: asynchronous; the caller must keep the source unchanged and alive
//    until `stream` has passed the copy.
//  - pageable host -> device: the source is copied into pinned staging buffers (4 MiB chunks,
//    two buffers in flight) on the calling thread; the source may be reused as soon as the
//    call returns, the destination is valid in `stream` order. Blocks only while waiting for
//    a staging buffer to drain, never for the last chunks.
//  - device -> pinned host: asynchronous; synchronise `stream` before reading the destination.
//  - device -> pageable host: staged the same way, and blocks until the destination holds the
//    data (the host must be able to read it on return).
// Pinned means page-locked memory known to CUDA (cudaHostAlloc, cudaHostRegister, a
// PinnedBuffer) or managed memory; everything else is pageable.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tensor/device.h"

namespace loom::cuda {

// Copies `nbytes` from `src` (memory of `src_device`) to `dst` (memory of `dst_device`); see
// above for what is asynchronous. Throws loom::Error for a bad device index or a failed CUDA
// call.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                cudaStream_t stream);

// The host <-> device copies copy_bytes has made in this process, by how: straight from or to
// pinned memory, or staged through pinned buffers because the host memory is pageable (a
// host wait per download, and a host-side memcpy either way). For finding transfers that
// should be page-locked (the offloads' are: docs/cuda.md, item 6). Thread-safe.
struct HostCopyCounts {
  uint64_t pinned = 0, staged = 0;              // copies
  uint64_t pinned_bytes = 0, staged_bytes = 0;  // the bytes they moved
};
HostCopyCounts host_copy_counts();

// Blocks until all work queued so far on the device's compute stream has finished (and on the
// calling thread's current stream, when a StreamGuard replaced the compute stream).
void synchronize(int device);

}  // namespace loom::cuda
