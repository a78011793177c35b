#pragma once
// Deterministic reductions on the GPU: the CUDA counterparts of kernels/cpu/reduce.h, plus the
// whole-buffer sums behind loss averaging and gradient-norm clipping.
//
// Every kernel reduces in an order fixed by the sizes alone (no atomics, no dependence on the
// device or on timing), so the same input gives bitwise the same output on every run. That
// order is a tree, not the CPU's left-to-right loop, so sums agree with the CPU to rounding, not
// bitwise. Dtypes: f32, bf16, f16 and f64. All launchers are asynchronous on `stream` and never
// synchronise.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

// x is a contiguous [outer, extent, inner] block; out is contiguous [outer, inner] of
// out_dtype (dtype, or f32 for a bf16/f16 x: the f32 sums not rounded to 16 bits):
// out[o, i] = sum_d x[o, d, i], accumulated in f32 (f64 for f64). extent == 0 writes zeros.
// Long columns (inner > 1, extent >= 1024) are summed in two passes through `workspace`, of
// sum_axis_workspace_bytes (0, and workspace may be nullptr, for every other shape). The
// caller owns it and must keep it until the launch is done.
size_t sum_axis_workspace_bytes(DType dtype, int64_t outer, int64_t extent, int64_t inner);
void sum_axis(DType dtype, DType out_dtype, const void* x, void* out, int64_t outer,
              int64_t extent, int64_t inner, void* workspace, cudaStream_t stream);

// out[o, i] = max_d x[o, d, i] and argmax[o, i] (int64, device) = the first d attaining it,
// with the CPU loop's NaN rule (`if (v > best)` starting from d = 0): a NaN at d = 0 wins with
// index 0, a NaN anywhere else is never chosen. extent must be > 0.
void max_axis(DType dtype, const void* x, void* out, int64_t* argmax, int64_t outer, int64_t extent,
              int64_t inner, cudaStream_t stream);

// Device scratch that sum_all and sum_of_squares need for n elements (0 for n == 0). The
// caller owns it (e.g. from the caching allocator) and must keep it until the launch is done.
size_t reduce_workspace_bytes(int64_t n);

// *out (one element of `dtype`, device) = sum of x[0..n), accumulated in double (as the CPU's
// sum_all) and rounded once to dtype. n == 0 writes 0.
void sum_all(DType dtype, const void* x, int64_t n, void* out, void* workspace,
             cudaStream_t stream);

// *out (one float, device) = sum of x[i]^2 over x[0..n), accumulated in double (as the CPU's
// sum_of_squares) and rounded once to float: the squared 2-norm for gradient clipping.
void sum_of_squares(DType dtype, const void* x, int64_t n, float* out, void* workspace,
                    cudaStream_t stream);

// One device buffer of a multi-tensor launch: n elements at data.
struct TensorSpan {
  const void* data;
  int64_t n;
};

// Device scratch that multi_tensor_sum_of_squares needs for these tensors (8 bytes per chunk of
// 65,536 elements).
size_t multi_tensor_squares_workspace_bytes(const TensorSpan* tensors, int count);

// squares[k] (float, device; `count` of them) = sum of x^2 over tensors[k] (all of `dtype`),
// for every tensor in two launches per 256 tensors or 2,560 chunks rather than two per tensor
// (Note [Multi-tensor launches] in chunk_plan.cuh): each chunk of 65,536 elements summed in
// double by one block in a fixed tree, a tensor's chunk sums added in order by one warp's
// fixed tree, the total rounded once to float. The bits depend on the sizes alone, never on how
// the tensors were grouped into launches. Empty tensors give 0. `tensors` is host memory, read
// during the call only.
void multi_tensor_sum_of_squares(DType dtype, const TensorSpan* tensors, int count,
                                 float* squares, void* workspace, cudaStream_t stream);
// The same sums not rounded to float: each tensor's double total (a piece of a gradient that
// sharding split, whose pieces' totals are added before that rounding).
void multi_tensor_sum_of_squares(DType dtype, const TensorSpan* tensors, int count, double* squares,
                                 void* workspace, cudaStream_t stream);

// Gradient clipping's norm and factor without a copy to the host (a step a CUDA graph
// captures): from the per-gradient sums of squares squares[0..count) (device), *total_norm
// (double, device) = sqrt(sum over k of sqrt(squares[k])^2) and *factor (float, device) =
// max_norm / (total + 1e-6) where that is below 1, else 1 (a non-finite total gives 1: nothing
// is scaled), with the host's arithmetic and bits (optim::grad_norm, clip_grads_to_norm). One
// launch of one thread. max_norm must be positive (infinity: a norm without clipping).
void clip_coefficient(const float* squares, int count, double max_norm, double* total_norm,
                      float* factor, cudaStream_t stream);

}  // namespace loom::kernels::cuda
