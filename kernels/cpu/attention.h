#pragma once
// Causal scaled-dot-product attention per (batch, head), through GEMMs on T x T tiles.
// Each operand is addressed as base + b*stride[0] + h*stride[1] + t*stride[2] + d (the
// last dimension is contiguous), so q, k and v can be views into a fused projection.

#include <cstdint>

namespace loom::kernels::cpu {

struct AttentionShape {
  int64_t batch, heads, time, head_dim;
};

// out = softmax(q k^T * scale, causal) v; probs [B, H, T, T] (contiguous) keeps the
// attention weights for backward.
template <typename T>
void causal_attention_forward(const AttentionShape& s, const T* q, const int64_t* q_strides,
                              const T* k, const int64_t* k_strides, const T* v,
                              const int64_t* v_strides, T* out, const int64_t* out_strides,
                              T* probs);

// Gradients into dq, dk, dv (overwritten), each with its own strides.
template <typename T>
void causal_attention_backward(const AttentionShape& s, const T* dout, const int64_t* dout_strides,
                               const T* q, const int64_t* q_strides, const T* k,
                               const int64_t* k_strides, const T* v, const int64_t* v_strides,
                               const T* probs, T* dq, const int64_t* dq_strides, T* dk,
                               const int64_t* dk_strides, T* dv, const int64_t* dv_strides);

}  // namespace loom::kernels::cpu
