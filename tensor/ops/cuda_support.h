#pragma once
// What the op implementations need to run a kernel on a CUDA tensor (internal).
//
// An op dispatches on its inputs' device:
//   if (x.device().is_cuda()) {
//     LOOM_IF_CUDA(kernels::cuda::gelu_forward(x.dtype(), in.raw_data(), out.raw_data(), n,
//                                              detail::stream_of(x)));
//   } else { ...CPU kernel... }
// In a build without CUDA, LOOM_IF_CUDA(...) is a call that throws (no CUDA tensor can exist
// there, so it is never reached), which keeps every op free of #if blocks around its body.
// Kernels run asynchronously on the device's current stream (tensor/cuda/stream.h); the
// caching allocator reuses a freed block only on the stream that used it, so temporaries can
// be released as soon as their kernel is queued.

#include "tensor/tensor.h"

#if LOOM_WITH_CUDA
#include <cuda_runtime_api.h>

#define LOOM_IF_CUDA(...) __VA_ARGS__

namespace loom::detail {
// The current stream of t's device, after making that device current on this thread.
cudaStream_t stream_of(const Tensor& t);
// An uninitialised byte buffer on `device`, for a kernel's workspace.
Tensor workspace(Device device, size_t bytes);
}  // namespace loom::detail

#else

#define LOOM_IF_CUDA(...) ::loom::detail::fail_without_cuda()

namespace loom::detail {
[[noreturn]] void fail_without_cuda();
}  // namespace loom::detail

#endif
