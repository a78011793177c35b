#pragma once
// The key/value cache of incremental decoding (nn/generate.h): each attention layer's keys and
// values of the positions seen so far, [B, H, T, D], so that a new token's forward
// computes only its own row. Models fill it through CausalLM::forward_cached.

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

struct KVCache {
  struct Layer {
    Tensor keys, values;  // undefined until the first forward
  };
  std::vector<Layer> layers;
  int64_t length = 0;  // positions cached

  // The layer's keys and values with k and v [B, H, T_new, D] appended; returns attention of
  // q [B, H, T_new, D] over all of them (queries at the last T_new positions, causal), laid
  // out as causal_attention's result ([B, H, T_new, D] viewed from [B, T_new, H, D] memory).
  // The cache must be empty (a prompt: T_new any) or T_new must be 1 (one new token).
  static Tensor attend(Layer& layer, const Tensor& q, const Tensor& k, const Tensor& v);
};

}  // namespace loom::nn
