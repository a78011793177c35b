#include "strategies/tp/layout.h"

#include <cmath>

#include "core/error.h"
#include "core/tags.h"
#include "optim/clip_grad.h"
#include "tensor/ops.h"

namespace loom::strategies {

TensorParallelLayout::TensorParallelLayout(std::shared_ptr<comm::ProcessGroup> tp,
                                           std::map<std::string, nn::TensorParallelSplit> splits)
    : tp_(std::move(tp)), splits_(std::move(splits)) {}

Shape TensorParallelLayout::whole_shape(const std::string& name, const Tensor& part) const {
  auto found = splits_.find(name);
  if (found == splits_.end()) return part.shape();
  return strategies::whole_shape(part.shape(), found->second.dim, tp_->size());
}

Tensor TensorParallelLayout::whole(const std::string& name, const Tensor& part) const {
  auto found = splits_.find(name);
  if (found == splits_.end()) return part.detach().clone();
  const Tensor mine = part.detach().contiguous();
  Tensor gathered = Tensor::empty({tp_->size() * mine.numel()}, mine.dtype(), mine.device());
  tp_->all_gather(gathered, mine)->wait();
  std::vector<Tensor> parts;
  for (int r = 0; r < tp_->size(); ++r)
    parts.push_back(gathered.narrow(0, r * mine.numel(), mine.numel()).reshape(mine.shape()));
  return nn::join_splits(parts, found->second);
}

void TensorParallelLayout::complete_norms(const std::vector<std::string>& names,
                                          std::vector<double>& norms, double norm_type) const {
  if (splits_.empty()) return;
  if (!(norm_type == 2.0 || norm_type == optim::kInfNorm)) {
    tag::kTp.fail(
        "gradient norms of split parameters: the 2-norm and the infinity norm are built, "
        "got ",
        norm_type);
  }
  const bool inf = norm_type == optim::kInfNorm;
  std::vector<size_t> at;
  std::vector<double> partial;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!is_split(names[i])) continue;
    at.push_back(i);
    partial.push_back(inf ? norms[i] : norms[i] * norms[i]);
  }
  if (partial.empty()) return;
  // On the group's device (a simulated group's is meta, whose values read as 0).
  Tensor all =
      Tensor::from_vector(partial, {static_cast<int64_t>(partial.size())}).to(tp_->device());
  tp_->allreduce(all, {.op = inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum})->wait();
  const std::vector<double> combined = all.to(Device::cpu()).to_vector<double>();
  for (size_t k = 0; k < at.size(); ++k)
    norms[at[k]] = inf ? combined[k] : std::sqrt(combined[k]);
}

std::vector<TensorParallelLayout::Block> TensorParallelLayout::blocks(const std::string& name,
                                                                      const Tensor& part) const {
  const nn::TensorParallelSplit& split = splits_.at(name);
  const auto dim = static_cast<size_t>(split.dim);
  const int64_t piece = part.size(split.dim) / split.blocks;  // of one block, on this rank
  std::vector<Block> out;
  for (int64_t b = 0; b < split.blocks; ++b) {
    Block block{Shape(part.dim(), 0), part.shape(), Shape(part.dim(), 0)};
    block.offsets[dim] = (b * tp_->size() + tp_->rank()) * piece;
    block.sizes[dim] = piece;
    block.local_offsets[dim] = b * piece;
    out.push_back(block);
  }
  return out;
}

bool TensorParallelLayout::writes(const std::string& name) const {
  return is_split(name) || !tp_ || tp_->rank() == 0;
}

void TensorParallelLayout::add_parts(const std::string& name, const Tensor& param,
                                     std::vector<ParameterPart>& out) const {
  if (!is_split(name)) {
    out.push_back({name, 0, param.detach().contiguous().reshape({param.numel()})});
    return;
  }
  for (const Block& block : blocks(name, param)) {
    Tensor values = param.detach();
    for (size_t d = 0; d < block.sizes.size(); ++d)
      values = values.narrow(static_cast<int64_t>(d), block.local_offsets[d], block.sizes[d]);
    values = values.contiguous();
    out.push_back({name, 0, values.reshape({values.numel()}), block.offsets, block.sizes});
  }
}

std::vector<OptimizerPart> TensorParallelLayout::optimizer_parts(const std::string& name,
                                                                 const Tensor& tensor) const {
  if (!is_split(name)) return {{name, 0, tensor.numel(), 0}};
  std::vector<OptimizerPart> parts;
  for (const Block& block : blocks(name, tensor)) {
    OptimizerPart part{name};
    part.offsets = block.offsets;
    part.sizes = block.sizes;
    part.local_offsets = block.local_offsets;
    parts.push_back(part);
  }
  return parts;
}

void TensorParallelLayout::load(const std::string& name, const Tensor& param,
                                const ReadParameter& read) const {
  NoGradGuard no_grad;
  Tensor target = param.detach();
  if (!is_split(name)) {
    Tensor host = Tensor::empty({param.numel()}, param.dtype(), Device::cpu());
    read(name, 0, host);
    copy_(target, host.reshape(param.shape()));
    return;
  }
  for (const Block& block : blocks(name, param)) {
    int64_t count = 1;
    for (int64_t d : block.sizes)
      count *= d;
    Tensor host = Tensor::empty({count}, param.dtype(), Device::cpu());
    read.box(name, block.offsets, block.sizes, host);
    copy_into_box(target, block.local_offsets, block.sizes, host);
  }
}

}  // namespace loom::strategies
