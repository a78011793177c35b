// Embedding lookup.

#include "kernels/cpu/embedding.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"
#include "tensor/ops/dispatch.h"

namespace loom {

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  detail::check_kernel_device("embedding", weight);
  if (weight.dim() != 2) {
    fail("embedding: expected weight [V, C], got ", shape_str(weight.shape()));
  }
  int64_t vocab = weight.size(0), width = weight.size(1);
  auto index =
      std::make_shared<std::vector<int64_t>>(detail::indices_as_i64("embedding", indices, vocab));
  Shape shape = indices.shape();
  shape.push_back(width);
  Tensor w = detail::contiguous_input(weight);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  int64_t count = static_cast<int64_t>(index->size());
  detail::dispatch_floating(weight.dtype(), "embedding", [&]<typename T>() {
    kernels::cpu::embedding_forward<T>(index->data(), w.data<T>(), out.data<T>(), count, width);
  });
  if (autograd::any_requires_grad({weight})) {
    autograd::record("Embedding", {weight}, {out},
                     [index, shape = weight.shape(), count, width](const std::vector<Tensor>& g,
                                                                   const autograd::Node&) {
                       Tensor dy = g[0].contiguous();
                       Tensor dw = Tensor::zeros(shape, dy.dtype(), dy.device());
                       detail::dispatch_floating(dy.dtype(), "embedding", [&]<typename T>() {
                         kernels::cpu::embedding_backward<T>(index->data(), dy.data<T>(),
                                                             dw.data<T>(), count, width);
                       });
                       return std::vector<Tensor>{dw};
                     });
  }
  return out;
}

}  // namespace loom
