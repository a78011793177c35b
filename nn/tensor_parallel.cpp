#include "nn/tensor_parallel.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/autocast.h"
#include "tensor/autograd/function.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom::nn {

Tensor take_split(const Tensor& full, const TensorParallelSplit& split, int rank, int size) {
  if (!split.split()) return full.contiguous();
  const int64_t extent = full.size(split.dim);
  if (extent % (split.blocks * size) != 0) {
    tag::kTp.fail("dimension ", split.dim, " of ", full.str(), " does not split into ",
                  split.blocks, " block(s) over ", size, " ranks");
  }
  const int64_t block = extent / split.blocks, part = block / size;
  std::vector<Tensor> parts;
  for (int64_t b = 0; b < split.blocks; ++b)
    parts.push_back(full.narrow(split.dim, b * block + rank * part, part));
  // A copy of its own: rows narrowed from a contiguous tensor are a contiguous view into the
  // whole, which would keep the whole weight alive on every rank.
  return parts.size() == 1 ? parts[0].clone() : concat(parts, split.dim).contiguous();
}

Tensor join_splits(const std::vector<Tensor>& parts, const TensorParallelSplit& split) {
  if (!split.split()) return parts.at(0);
  const int64_t part = parts.at(0).size(split.dim) / split.blocks;
  std::vector<Tensor> ordered;  // block by block, rank by rank
  for (int64_t b = 0; b < split.blocks; ++b)
    for (const Tensor& p : parts)
      ordered.push_back(p.narrow(split.dim, b * part, part));
  return concat(ordered, split.dim).contiguous();
}

// Note [Tensor-parallel ops on meta]
// The ops below compute in plain loops on the CPU. On the meta device (tensor/meta.h) they
// allocate what the CPU path allocates, run their collectives (a sim group's, on meta tensors)
// and report their cost instead; the loss reads 0. As elsewhere, a profiled CPU run reports the
// same costs (reports_op_cost).

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& weight, int64_t first) {
  if (weight.dtype() != DType::F32 || !(weight.device().is_cpu() || weight.device().is_meta()))
    tag::kTp.fail("vocab_parallel_embedding: f32 CPU (or meta) weights only, got ", weight.str());
  const Tensor index = ids.to(DType::I64).contiguous();
  const int64_t rows = weight.size(0), width = weight.size(1);
  autograd::CustomOp op{
      .name = "vocab_parallel_embedding",
      .forward =
          [index, rows, width, first](autograd::Context&, const std::vector<Tensor>& in) {
            Shape shape = index.shape();
            shape.push_back(width);
            Tensor out = Tensor::zeros(shape, DType::F32, in[0].device());
            if (reports_op_cost(out.device())) {  // reads the indices and a row per index
              record_meta_op("vocab_parallel_embedding", OpClass::Embedding, 0, {index, out},
                             {out});
            }
            if (out.device().is_meta()) return std::vector<Tensor>{out};
            const Tensor w = in[0].contiguous();
            const int64_t* id = index.data<int64_t>();
            for (int64_t i = 0; i < index.numel(); ++i) {
              const int64_t row = id[i] - first;
              if (row < 0 || row >= rows) continue;
              std::memcpy(out.data<float>() + i * width, w.data<float>() + row * width,
                          sizeof(float) * static_cast<size_t>(width));
            }
            return std::vector<Tensor>{out};
          },
      .backward =
          [index, rows, width, first](autograd::Context&, const std::vector<Tensor>& grad_out) {
            Tensor grad = Tensor::zeros({rows, width}, DType::F32, grad_out[0].device());
            const Tensor g = grad_out[0].contiguous();
            if (reports_op_cost(grad.device())) {  // adds each row of g into grad's
              record_meta_op("VocabParallelEmbedding", OpClass::Embedding, double(g.numel()),
                             {g, g}, {g});
            }
            if (grad.device().is_meta()) return std::vector<Tensor>{grad};
            const int64_t* id = index.data<int64_t>();
            for (int64_t i = 0; i < index.numel(); ++i) {
              const int64_t row = id[i] - first;
              if (row < 0 || row >= rows) continue;
              float* into = grad.data<float>() + row * width;
              const float* from = g.data<float>() + i * width;
              for (int64_t c = 0; c < width; ++c)
                into[c] += from[c];
            }
            return std::vector<Tensor>{grad};
          }};
  return autograd::apply(op, {weight})[0];
}

Tensor gradient_summed_over_group(const Tensor& x, const TensorParallelGroup& group) {
  const TensorParallelGroup* tp = &group;
  autograd::CustomOp op{
      .name = "gradient_summed_over_group",
      .forward = [](autograd::Context&,
                    const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].clone()}; },
      .backward =
          [tp](autograd::Context&, const std::vector<Tensor>& grad_out) {
            Tensor sum = grad_out[0].contiguous().clone();
            tp->sum(sum);
            return std::vector<Tensor>{sum};
          }};
  return autograd::apply(op, {x})[0];
}

Tensor parallel_cross_entropy(const Tensor& logits_in, const Tensor& targets, int64_t first,
                              const TensorParallelGroup& group) {
  const Tensor logits = autocast_f32_input(logits_in);  // as cross_entropy under autocast
  if (logits.dtype() != DType::F32 || logits.dim() != 2)
    tag::kTp.fail("parallel_cross_entropy: f32 logits [N, vocab part], got ", logits.str());
  // Per element: the maximum, the exponent, the sum and the normalisation (softmax's 4).
  constexpr double kFlops = 4;
  const Tensor target = targets.to(DType::I64).contiguous().reshape({-1});
  const int64_t n = logits.size(0), cols = logits.size(1);
  const TensorParallelGroup* tp = &group;
  autograd::CustomOp op{
      .name = "parallel_cross_entropy",
      .forward =
          [target, n, cols, first, tp](autograd::Context& ctx, const std::vector<Tensor>& in) {
            const Tensor l = in[0].contiguous();
            const Device device = l.device();
            Tensor max = Tensor::empty({n}, DType::F64, device);
            Tensor sum = Tensor::zeros({n}, DType::F64, device);
            Tensor picked = Tensor::zeros({n}, DType::F64, device);
            if (device.is_meta()) {  // the collectives run; the loss reads 0
              Tensor probs = Tensor::empty({n, cols}, DType::F32, device);
              record_meta_op("parallel_cross_entropy", OpClass::Normalization,
                             kFlops * double(l.numel()), {l}, {probs});
              tp->max(max);
              tp->sum(sum);
              tp->sum(picked);
              ctx.save(probs);
              return std::vector<Tensor>{Tensor::zeros({}, DType::F32, device)};
            }
            if (reports_op_cost(device)) {
              record_meta_op("parallel_cross_entropy", OpClass::Normalization,
                             kFlops * double(l.numel()), {l}, {l});
            }
            const float* x = l.data<float>();
            for (int64_t i = 0; i < n; ++i) {
              double m = -INFINITY;
              for (int64_t c = 0; c < cols; ++c)
                m = std::max(m, static_cast<double>(x[i * cols + c]));
              max.data<double>()[i] = m;
            }
            tp->max(max);
            Tensor probs = Tensor::empty({n, cols}, DType::F32);
            for (int64_t i = 0; i < n; ++i) {
              const double m = max.data<double>()[i];
              double s = 0;
              for (int64_t c = 0; c < cols; ++c)
                s += std::exp(static_cast<double>(x[i * cols + c]) - m);
              sum.data<double>()[i] = s;
              const int64_t col = target.data<int64_t>()[i] - first;
              if (col >= 0 && col < cols) picked.data<double>()[i] = x[i * cols + col];
            }
            tp->sum(sum);
            tp->sum(picked);
            double loss = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double m = max.data<double>()[i], s = sum.data<double>()[i];
              loss += std::log(s) + m - picked.data<double>()[i];
              for (int64_t c = 0; c < cols; ++c) {
                probs.data<float>()[i * cols + c] =
                    static_cast<float>(std::exp(static_cast<double>(x[i * cols + c]) - m) / s);
              }
            }
            ctx.save(probs);
            return std::vector<Tensor>{
                Tensor::full({}, loss / static_cast<double>(n), DType::F32)};
          },
      .backward =
          [target, n, cols, first](autograd::Context& ctx, const std::vector<Tensor>& grad_out) {
            Tensor grad = ctx.saved(0).clone();
            if (reports_op_cost(grad.device())) {
              record_meta_op("ParallelCrossEntropy", OpClass::Normalization, 2 * double(grad.numel()),
                             {grad}, {grad});
            }
            if (grad.device().is_meta()) return std::vector<Tensor>{grad};
            const double g = grad_out[0].item() / static_cast<double>(n);
            float* d = grad.data<float>();
            for (int64_t i = 0; i < n; ++i) {
              const int64_t col = target.data<int64_t>()[i] - first;
              if (col >= 0 && col < cols) d[i * cols + col] -= 1.0f;
              for (int64_t c = 0; c < cols; ++c)
                d[i * cols + c] = static_cast<float>(d[i * cols + c] * g);
            }
            return std::vector<Tensor>{grad};
          }};
  return autograd::apply(op, {logits})[0];
}

}  // namespace loom::nn
