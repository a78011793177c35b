// Embedding lookup: of a whole table, or of the part of one a tensor-parallel rank holds.

#include <limits>
#include <optional>

#include "kernels/cpu/embedding.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/embedding.h"
#endif

namespace loom {

namespace {

// The table the backward adds its rows into: the weight's gradient as summed so far, when the
// pass can hand it over and it has the gradient's dtype (a tied table's output projection
// delivers its gradient first: Note [Adding into the partial gradient] in
// tensor/autograd/engine.cpp), else zeros. The kernels add each row's sum once, so either way
// the weight gets the bits of that sum plus the rest.
Tensor table_to_add_into(const autograd::Node& node, const Shape& shape, const Tensor& dy) {
  Tensor sum = node.partial_gradient(0);
  if (sum.defined() && sum.dtype() == dy.dtype() && sum.shape() == shape &&
      sum.device() == dy.device()) {
    return sum;
  }
  return Tensor::zeros(shape, dy.dtype(), dy.device());
}

// Embedding on a GPU. Indices are moved to the weight's device as i64 (host indices are
// uploaded); an out-of-range index (outside a part: any index not in it) stops the kernel with
// a device-side error naming it. The backward pass sorts the indices and sums each row's
// gradients in index order: no atomics, so the result is bitwise reproducible.
Tensor cuda_embedding(const Tensor& indices, const Tensor& weight, kernels::Part part) {
  if (indices.dtype() != DType::I64 && indices.dtype() != DType::I32) {
    fail("embedding: indices must be i32 or i64, got ", indices.dtype());
  }
  int64_t vocab = weight.size(0), width = weight.size(1);
  Tensor index = indices.to(weight.device()).to(DType::I64).contiguous();
  Shape shape = indices.shape();
  shape.push_back(width);
  Tensor w = detail::contiguous_input(weight);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  int64_t count = index.numel();
  LOOM_IF_CUDA(kernels::cuda::embedding_forward(weight.dtype(), index.data<int64_t>(),
                                                w.raw_data(), out.raw_data(), count, width, vocab,
                                                detail::stream_of(weight), part));
  if (autograd::any_requires_grad({weight})) {
    autograd::record(
        "Embedding", {weight}, {out},
        [index, shape = weight.shape(), count, width, vocab, part](const std::vector<Tensor>& g,
                                                                   const autograd::Node& node) {
          Tensor dy = g[0].contiguous();
          Tensor dw = table_to_add_into(node, shape, dy);
          LOOM_IF_CUDA({
            Tensor scratch = detail::workspace(
                dy.device(), kernels::cuda::embedding_backward_workspace(count));
            kernels::cuda::embedding_backward(dy.dtype(), index.data<int64_t>(), dy.raw_data(),
                                              dw.raw_data(), count, width, vocab,
                                              scratch.raw_data(), detail::stream_of(dy), part);
          });
          return std::vector<Tensor>{dw};
        });
  }
  return out;
}

// embedding(), and embedding_part() when `part_first` is given: the weight then holds rows
// [part_first, part_first + V) of the table.
Tensor embed(const char* op, const Tensor& indices, const Tensor& weight,
             std::optional<int64_t> part_first) {
  detail::check_kernel_device(op, weight);
  if (weight.dim() != 2) {
    fail(op, ": expected weight [V, C], got ", shape_str(weight.shape()));
  }
  int64_t vocab = weight.size(0), width = weight.size(1);
  const kernels::Part part = part_first ? kernels::Part{*part_first, true} : kernels::Part{};
  if (weight.device().is_cuda()) return cuda_embedding(indices, weight, part);
  // A part takes any index >= 0 (int64's range); the whole table checks them against it.
  const int64_t upper = part.part ? std::numeric_limits<int64_t>::max() : vocab;
  auto index = std::make_shared<std::vector<int64_t>>(detail::indices_as_i64(op, indices, upper));
  Shape shape = indices.shape();
  shape.push_back(width);
  Tensor w = detail::contiguous_input(weight);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  int64_t count = static_cast<int64_t>(index->size());
  if (reports_op_cost(weight.device())) {  // reads the indices and one row per index: out's size
    record_meta_op("embedding", OpClass::Embedding, 0, {indices, out}, {out});
  }
  if (weight.device().is_meta()) {
  } else if (is_16bit_float(weight.dtype())) {  // rows copied bit for bit
    kernels::cpu::embedding_forward<uint16_t>(
        index->data(), static_cast<const uint16_t*>(w.raw_data()),
        static_cast<uint16_t*>(out.raw_data()), count, width, vocab, part);
  } else {
    detail::dispatch_floating(weight.dtype(), "embedding", [&]<typename T>() {
      kernels::cpu::embedding_forward<T>(index->data(), w.data<T>(), out.data<T>(), count, width,
                                         vocab, part);
    });
  }
  if (autograd::any_requires_grad({weight})) {
    autograd::record(
        "Embedding", {weight}, {out},
        [index, shape = weight.shape(), count, width, vocab, part](const std::vector<Tensor>& g,
                                                                   const autograd::Node& node) {
          Tensor dy = g[0].contiguous();
          if (reports_op_cost(dy.device())) {  // adds each row of dy into dw's
            record_meta_op("Embedding", OpClass::Embedding, double(dy.numel()), {dy, dy}, {dy});
          }
          if (detail::computes_through_f32(dy)) {  // summed in f32, rounded once (meta too)
            Tensor dw = Tensor::empty(shape, dy.dtype(), dy.device());
            const Tensor dy32 = detail::widened(dy);
            Tensor dw32 = Tensor::zeros(shape, DType::F32, dy.device());
            if (!dw.device().is_meta()) {
              kernels::cpu::embedding_backward<float>(index->data(), dy32.data<float>(),
                                                      dw32.data<float>(), count, width, vocab,
                                                      part);
            }
            NoGradGuard no_grad;
            copy_(dw, dw32);
            return std::vector<Tensor>{dw};
          }
          Tensor dw = table_to_add_into(node, shape, dy);
          if (dw.device().is_meta()) {
            return std::vector<Tensor>{dw};
          }
          detail::dispatch_floating(dy.dtype(), "embedding", [&]<typename T>() {
            kernels::cpu::embedding_backward<T>(index->data(), dy.data<T>(), dw.data<T>(), count,
                                                width, vocab, part);
          });
          return std::vector<Tensor>{dw};
        });
  }
  return out;
}

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  return embed("embedding", indices, weight, std::nullopt);
}

Tensor embedding_part(const Tensor& indices, const Tensor& weight, int64_t first) {
  return embed("embedding_part", indices, weight, first);
}

}  // namespace loom
