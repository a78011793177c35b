#include "nn/tensor_parallel.h"

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

// Note [The vocabulary-parallel loss]
// Each rank holds a part of every row's logits. cross_entropy_part gives per row the part's
// logsumexp l_r and the target's logit where this part holds it. Combined over the group: the
// row's logsumexp is log(sum_r exp(l_r)), and the target's logit is the sum of the parts' (one
// is non-zero). Both combine on the logits' device, so a step on a GPU never waits for the
// host here (whether a CUDA Graph then captures a tensor-parallel step is untested): the l_r
// cross the group as the rows of a [ranks, N] tensor (each rank fills its own row, zeros
// elsewhere, and the group sums it: adding zeros is exact), whose columns' logsumexp is
// cross_entropy_part's again, with a part that starts beyond the vocabulary (so no target
// falls in it); the loss is the mean of the differences. Backward, each rank's part of the
// gradient is cross_entropy_part_backward with the whole rows' logsumexp.
Tensor parallel_cross_entropy(const Tensor& logits_in, const Tensor& targets, int64_t first,
                              const TensorParallelGroup& group) {
  const Tensor logits = autocast_f32_input(logits_in);  // as cross_entropy under autocast
  if (logits.dim() != 2)
    tag::kTp.fail("parallel_cross_entropy: logits [N, vocab part], got ", logits.str());
  const TensorParallelGroup* tp = &group;
  autograd::CustomOp op{
      .name = "parallel_cross_entropy",
      .forward =
          [targets, first, tp](autograd::Context& ctx, const std::vector<Tensor>& in) {
            const Tensor& l = in[0];
            const int64_t n = l.size(0), ranks = tp->size();
            const std::vector<Tensor> part = cross_entropy_part(l, targets, first);
            Tensor parts_lse = Tensor::zeros({ranks, n}, part[0].dtype(), l.device());
            Tensor mine = parts_lse.narrow(0, tp->rank(), 1);
            copy_(mine, part[0].reshape({1, n}));
            tp->sum(parts_lse);
            Tensor picked = part[1];
            tp->sum(picked);
            // Every part [first, first + V/ranks) lies below V = l.size(1) * ranks.
            const Tensor lse =
                cross_entropy_part(transpose(parts_lse, 0, 1), targets, l.size(1) * ranks)[0];
            ctx.save(l);
            ctx.save(lse);
            return std::vector<Tensor>{n > 0 ? mean(lse - picked).to(DType::F32)
                                             : Tensor::zeros({}, DType::F32, l.device())};
          },
      .backward =
          [targets, first](autograd::Context& ctx, const std::vector<Tensor>& grad_out) {
            return std::vector<Tensor>{cross_entropy_part_backward(
                ctx.saved(0), targets, first, ctx.saved(1), grad_out[0])};
          }};
  return autograd::apply(op, {logits})[0];
}

}  // namespace loom::nn
