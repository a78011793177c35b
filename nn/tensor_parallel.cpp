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
// logsumexp l_r and the target's logit where this part holds it. Combined over the group: with
// M the largest l_r, the row's logsumexp is M + log(sum_r exp(l_r - M)), and the target's
// logit is the sum of the parts' (one is non-zero). The [N]-long combination runs on the host
// in f64 (a device's rows cross once: one synchronisation per forward); the shares cross the
// ranks on the logits' device. Backward, each rank's part of the gradient is
// cross_entropy_part_backward with the whole rows' logsumexp. On the meta device the ops and
// collectives run for their costs and the loss reads 0.
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
            const Device device = l.device();
            const int64_t n = l.size(0);
            const std::vector<Tensor> part = cross_entropy_part(l, targets, first);
            Tensor top = part[0].clone();
            tp->max(top);
            const std::vector<double> mine = part[0].to_vector<double>(),
                                      most = top.to_vector<double>();
            std::vector<double> share(static_cast<size_t>(n));
            for (size_t i = 0; i < share.size(); ++i)
              share[i] = device.is_meta() ? 0.0 : std::exp(mine[i] - most[i]);
            Tensor shares = Tensor::from_vector(share, {n}, device);
            Tensor picked = part[1];
            tp->sum(shares);
            tp->sum(picked);
            const std::vector<double> summed = shares.to_vector<double>(),
                                      target = picked.to_vector<double>();
            std::vector<double> lse(static_cast<size_t>(n));
            double loss = 0;
            for (size_t i = 0; i < lse.size(); ++i) {
              lse[i] = device.is_meta() ? 0.0 : most[i] + std::log(summed[i]);
              loss += lse[i] - target[i];
            }
            ctx.save(l);
            ctx.save(Tensor::from_vector(lse, {n}, device).to(part[0].dtype()));
            return std::vector<Tensor>{
                Tensor::full({}, n > 0 ? loss / static_cast<double>(n) : 0.0, DType::F32, device)};
          },
      .backward =
          [targets, first](autograd::Context& ctx, const std::vector<Tensor>& grad_out) {
            return std::vector<Tensor>{cross_entropy_part_backward(
                ctx.saved(0), targets, first, ctx.saved(1), grad_out[0])};
          }};
  return autograd::apply(op, {logits})[0];
}

}  // namespace loom::nn
