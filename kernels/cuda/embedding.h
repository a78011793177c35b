#pragma once
// Embedding lookup and its gradient on the GPU: the CUDA counterparts of
// kernels/cpu/embedding.h. weight is [vocab, width], indices int64 [count] on the device.
//
// Storage f32, bf16 or f16 (weight, out, dout, dweight of `dtype`); the gradient adds in f32.
// Launchers are asynchronous on `stream`, never synchronise, and throw loom::Error for a dtype
// they do not take or a failed launch. An index outside [0, vocab) (of a whole table; a part
// takes any index: kernels::Part) prints the position, index and vocab from the device and
// traps (as a device-side assert): the context is then unusable, and the error surfaces at
// the next synchronising call.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "kernels/part.h"

namespace loom::kernels::cuda {

// out[n, :] = weight[indices[n] - first, :] for n < count. Of a part of a table (`part`: the
// weight holds rows [first, first + vocab) of it), an index outside it gives a zero row
// forward and adds nothing backward instead of trapping.
void embedding_forward(DType dtype, const int64_t* indices, const void* weight, void* out,
                       int64_t count, int64_t width, int64_t vocab, cudaStream_t stream,
                       Part part = {});

// Bytes of device workspace embedding_backward needs for `count` indices (any vocab below
// 2^31). Queries CUB on the current device; launches nothing.
size_t embedding_backward_workspace(int64_t count);

// dweight[r, :] += the sum of dout[n, :] over the n whose index selects row r, as
// kernels/cpu/embedding.h's: each row's sum formed from zero in order of n, in f32, rounded to
// the storage type, then added to the row once (the bits of adding to dweight what the call
// makes of zeros). Deterministic and atomic-free: the (index, position) pairs are radix-sorted
// (stable) in `workspace`, and one thread per (distinct index, column pack) sums that index's
// rows and stores once. So the additions happen in the CPU kernel's order, and f32 results
// match it bitwise. A heavily repeated index is summed by a single thread per column pack
// (serial in its repeat count).
// `workspace` holds embedding_backward_workspace(count) bytes (256-byte aligned, as from
// cudaMalloc or the caching allocator). count < 2^31, vocab < 2^31.
void embedding_backward(DType dtype, const int64_t* indices, const void* dout, void* dweight,
                        int64_t count, int64_t width, int64_t vocab, void* workspace,
                        cudaStream_t stream, Part part = {});

}  // namespace loom::kernels::cuda
