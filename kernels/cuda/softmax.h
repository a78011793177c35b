#pragma once
// Softmax over rows and the fused softmax + cross-entropy on the GPU: the CUDA counterparts of
// kernels/cpu/softmax.h.
//
// Storage f32, bf16 or f16 (every tensor of `dtype` unless its type says float); all arithmetic
// in f32 (the mean loss adds the rows in f64, as the CPU kernel does). Launchers are
// asynchronous on `stream`, never synchronise, and throw loom::Error for a dtype they do not
// take or a failed launch. Results are deterministic: no atomics, fixed reduction orders.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "kernels/part.h"

namespace loom::kernels::cuda {

// y = softmax(x) per row of `width`. With causal_t > 0, rows are rows of [.., T, T] blocks
// (T = causal_t = width): row r may attend to columns 0..(r mod T); the rest get 0.
// y may alias x. One warp per row up to a few thousand elements, one block per row beyond.
void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t width,
                     int64_t causal_t, cudaStream_t stream);
// dx = y * (dy - sum(dy * y)) per row. dx may alias y or dy.
void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                      int64_t width, cudaStream_t stream);

// Cross-entropy of logits [rows, vocab] against targets (int64 [rows], on the device):
// row loss = logsumexp(row) - row[target]. Writes each row's logsumexp (for backward) and loss
// (f32 [rows] each), and mean_loss (one f32 element, whatever the logits' storage: a bf16
// model's loss is accumulated and kept in f32) = the mean of the row losses, added
// in f64 in an order fixed by the row count (deterministic; equal to the CPU's row-order sum
// up to f64 rounding). One block per row reads the row once (online max and sum of exps);
// a second one-block kernel takes the mean. rows must be > 0.
// A target outside [0, vocab) prints the row, target and vocab from the device and traps (as a
// device-side assert): the stream's context is then unusable, and the error surfaces at the
// next synchronising call as cudaErrorLaunchFailure or similar.
void cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets,
                           float* logsumexp, float* row_losses, float* mean_loss, int64_t rows,
                           int64_t vocab, cudaStream_t stream);

// Of a part of each row's classes (kernels::Part: the logits hold classes [first, first +
// vocab), targets index the whole row), per row: the logsumexp of its logits, and the target's
// logit where the target falls in the part, else 0 (picked; f32 [rows] each). Summed over the
// parts as logsumexps and logits, they give the whole row's loss (nn::parallel_cross_entropy).
// One block per row.
void cross_entropy_part_forward(DType dtype, const void* logits, const int64_t* targets,
                                int64_t first, float* logsumexp, float* picked, int64_t rows,
                                int64_t vocab, cudaStream_t stream);

// dlogits = dloss / rows * (softmax(logits) - onehot(target)), where dloss (one f32 element on
// the device, the gradient of the mean loss) is read by the kernel, so no host
// synchronisation is needed. dlogits may alias logits (each element is read before the same
// thread overwrites it), which saves the [rows, vocab] gradient buffer. Out-of-range targets
// trap as in forward. Of a part: `logsumexp` is the whole row's, and a target outside the part
// adds no onehot.
void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets,
                            const float* logsumexp, const float* dloss, void* dlogits, int64_t rows,
                            int64_t vocab, cudaStream_t stream, Part part = {});

// cross_entropy_forward and cross_entropy_backward in one pass over the logits, for a loss
// whose gradient is known before its backward runs (`dloss`, on the host: Note [The loss's
// gradient with the loss] in tensor/ops/softmax.cpp): the logsumexps, row losses and mean of
// cross_entropy_forward, then each row's gradient written over its logits, the bits
// cross_entropy_backward writes given dloss. One block per row reads the row, then reads it
// again (from L2, just read) as it overwrites it, where the two kernels read it from memory
// twice. Targets as cross_entropy_forward's.
void cross_entropy_forward_backward(DType dtype, void* logits_then_gradient, const int64_t* targets,
                                    float* logsumexp, float* row_losses, float* mean_loss,
                                    float dloss, int64_t rows, int64_t vocab, cudaStream_t stream);

// The gradient cross_entropy_forward_backward wrote for `expected`, made that of the loss's
// gradient dloss (one f32 element on the device): nothing when *dloss == expected (each block
// reads it and returns), else dlogits *= *dloss / expected, in f32, rounded once more.
// `count` elements; expected finite and nonzero.
void cross_entropy_rescale(DType dtype, void* dlogits, const float* dloss, float expected,
                           int64_t count, cudaStream_t stream);

}  // namespace loom::kernels::cuda
