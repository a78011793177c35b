#include "nn/kv_cache.h"

#include <cmath>

#include "tensor/ops.h"

namespace loom::nn {

Tensor KVCache::attend(Layer& layer, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t past = layer.keys.defined() ? layer.keys.size(2) : 0;
  const int64_t fresh = q.size(2);
  if (past > 0 && fresh != 1) {
    fail("KVCache: ", fresh, " new positions after ", past,
         " cached ones; a cached forward takes a whole prompt first, then one token at a time");
  }
  layer.keys = past == 0 ? k.contiguous() : concat({layer.keys, k}, 2);
  layer.values = past == 0 ? v.contiguous() : concat({layer.values, v}, 2);
  if (past == 0) return causal_attention(q, layer.keys, layer.values);
  // One query over every cached position: no mask; softmax(q k^T / sqrt(D)) v.
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor scores = mul(matmul(q, transpose(layer.keys, 2, 3)), scale);  // [B, H, 1, T]
  Tensor out = matmul(softmax(scores), layer.values);                  // [B, H, 1, D]
  // As causal_attention lays its result out: [B, T_new, H, D] in memory.
  return out.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3});
}

}  // namespace loom::nn
