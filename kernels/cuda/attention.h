#pragma once
// Fused causal scaled-dot-product attention on the GPU (FlashAttention-2 style): the CUDA
// counterpart of kernels/cpu/attention.h,
//   out = softmax(q k^T / sqrt(head_dim), causal) v,
// computed tile by tile with an online softmax, so the [T, T] probabilities never exist in
// memory. Forward keeps each row's logsumexp instead; backward recomputes the probabilities
// from it.
//
// Operands are addressed as base + b*strides[0] + h*strides[1] + t*strides[2] + d (the last
// dimension contiguous), so q, k and v may be views into a fused [B, T, 3, H, D] projection.
// Grouped-query attention is native: q, out, dout and dq have `heads` heads, k, v, dk and dv
// `kv_heads` (dividing heads; equal for plain multi-head attention, 1 for multi-query), and
// query head h reads key/value head h / (heads / kv_heads), as the CPU kernel does. Nothing is
// repeated in memory; dk and dv sum over their group of query heads inside the kernel.
// Storage f32 or bf16 (all operands of `dtype`); all arithmetic and accumulation in f32.
// head_dim from 1 to 128 (kernels are compiled for padded head dims 32, 64 and 128 and mask
// the rest); any T. Launchers are asynchronous on `stream`, never synchronise, and throw
// loom::Error for a dtype or size they do not take or a failed launch. No atomics: results are
// bitwise reproducible.
//
// Versions (see Note [Attention versions] in attention.cu; bench/cuda/lab_attention.cu runs
// them side by side):
//   v1 (kSimt)       : f32 and bf16, CUDA-core FMAs, 32 x 32 tiles.
//   v2 (kTensorCore) : bf16 only, WMMA bf16 16x16x16 tensor-core MMAs, 64 x 64 tiles; the
//                      probabilities (and dS in backward) are rounded to bf16 before their
//                      MMA, as FlashAttention does.
//   v3 (kMma)        : bf16 only, mma.sync m16n8k16 with scores and probabilities kept in
//                      registers and tiles double-buffered by cp.async (FlashAttention-2's
//                      design); the same roundings as v2.
// The public launchers below use v1 for f32 and, for bf16, the version LOOM_CUDA_ATTENTION
// names (v1, v2 or v3; v3 when unset; v1 where the device cannot run v2 or v3: a build whose
// code for this device targets below sm_80). v3 has been tested only on the emulated device
// (docs/cuda.md); the lab validates every version against the CPU kernel before timing it,
// and should v3 fail or lose there, LOOM_CUDA_ATTENTION=v2 runs v2 (measured on an H200 on
// 2026-12-04) with no rebuild.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

struct AttentionShape {
  int64_t batch, heads, time, head_dim;
  int64_t kv_heads;  // key/value heads, dividing heads: heads for plain multi-head attention
};

// Writes out (same layout rules as q) and logsumexp [B*H*T] (contiguous f32, natural log of
// each row's softmax denominator including the 1/sqrt(head_dim) scale), which backward needs.
void flash_attention_forward(DType dtype, const AttentionShape& s, const void* q,
                             const int64_t* q_strides, const void* k, const int64_t* k_strides,
                             const void* v, const int64_t* v_strides, void* out,
                             const int64_t* out_strides, float* logsumexp, cudaStream_t stream);

// Bytes of device workspace flash_attention_backward needs: one f32 per row (B*H*T), for
// D_i = rowsum(dout * out). Depends only on the shape.
size_t flash_attention_backward_workspace(const AttentionShape& s);

// dq, dk, dv are OVERWRITTEN (each with its own strides). `out` and `logsumexp` are what
// flash_attention_forward wrote for these q, k, v. Atomic-free: one kernel computes dk and dv
// per key tile of a key/value head (looping over its group's query heads, and over their query
// tiles), a second one dq per query tile (looping over key tiles). `workspace`: flash_attention_backward_workspace(s) bytes, 16-byte aligned.
void flash_attention_backward(DType dtype, const AttentionShape& s, const void* dout,
                              const int64_t* dout_strides, const void* q, const int64_t* q_strides,
                              const void* k, const int64_t* k_strides, const void* v,
                              const int64_t* v_strides, const void* out, const int64_t* out_strides,
                              const float* logsumexp, void* dq, const int64_t* dq_strides, void* dk,
                              const int64_t* dk_strides, void* dv, const int64_t* dv_strides,
                              void* workspace, cudaStream_t stream);

// ---- Versioned entry points, for the lab (bench/cuda/lab_attention.cu) --------------------

enum class AttentionVersion { kSimt = 1, kTensorCore = 2, kMma = 3 };

// Whether `version` takes this dtype (v2, v3: bf16 only).
bool attention_version_supports(AttentionVersion version, DType dtype);

// As flash_attention_forward / flash_attention_backward, with the version chosen.
void flash_attention_forward_version(AttentionVersion version, DType dtype, const AttentionShape& s,
                                     const void* q, const int64_t* q_strides, const void* k,
                                     const int64_t* k_strides, const void* v,
                                     const int64_t* v_strides, void* out,
                                     const int64_t* out_strides, float* logsumexp,
                                     cudaStream_t stream);
void flash_attention_backward_version(
    AttentionVersion version, DType dtype, const AttentionShape& s, const void* dout,
    const int64_t* dout_strides, const void* q, const int64_t* q_strides, const void* k,
    const int64_t* k_strides, const void* v, const int64_t* v_strides, const void* out,
    const int64_t* out_strides, const float* logsumexp, void* dq, const int64_t* dq_strides,
    void* dk, const int64_t* dk_strides, void* dv, const int64_t* dv_strides, void* workspace,
    cudaStream_t stream);

}  // namespace loom::kernels::cuda
