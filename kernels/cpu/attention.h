#pragma once
// Causal scaled-dot-product attention, flash-style: tiled by query rows and key columns with an
// online softmax, so no [T, T] matrix is ever held; forward keeps each row's logsumexp, from
// which backward recomputes the probabilities tile by tile (Note [Flash attention on the CPU]
// in attention.cpp). Grouped-query attention is native: q has `heads` heads, k and v
// `kv_heads` (dividing heads), query head h reading key/value head h / (heads / kv_heads).
// Each operand is addressed as base + b*stride[0] + h*stride[1] + t*stride[2] + d (the
// last dimension is contiguous), so q, k and v can be views into a fused projection.
// Bitwise the same on any thread count: a (batch, head) is one thread's, its tiles in a fixed
// order.

#include <cstdint>

namespace loom::kernels::cpu {

struct AttentionShape {
  int64_t batch, heads, time, head_dim;
  int64_t kv_heads;  // key/value heads: heads for plain multi-head attention
};

// out = softmax(q k^T * scale, causal) v with scale 1/sqrt(head_dim); lse [B, H, T]
// (contiguous) receives each row's log(sum(exp(scores * scale))), what backward needs.
template <typename T>
void causal_attention_forward(const AttentionShape& s, const T* q, const int64_t* q_strides,
                              const T* k, const int64_t* k_strides, const T* v,
                              const int64_t* v_strides, T* out, const int64_t* out_strides,
                              T* lse);

// Gradients into dq [B, H, T, D], dk and dv [B, kv_heads, T, D] (overwritten), each with its
// own strides; out and lse are the forward's.
template <typename T>
void causal_attention_backward(const AttentionShape& s, const T* dout, const int64_t* dout_strides,
                               const T* q, const int64_t* q_strides, const T* k,
                               const int64_t* k_strides, const T* v, const int64_t* v_strides,
                               const T* out, const int64_t* out_strides, const T* lse, T* dq,
                               const int64_t* dq_strides, T* dk, const int64_t* dk_strides, T* dv,
                               const int64_t* dv_strides);

}  // namespace loom::kernels::cpu
