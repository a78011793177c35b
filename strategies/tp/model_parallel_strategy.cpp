#include "strategies/tp/model_parallel_strategy.h"

#include <cmath>

#include "optim/clip_grad.h"
#include "strategies/ddp/reducer.h"
#include "tensor/autograd/function.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace loom::strategies {

namespace {

void reduce_in_place(comm::ProcessGroup& group, Tensor& t, comm::ReduceOp op) {
  group.allreduce(t, {.op = op})->wait();
}

}  // namespace

ProcessGroupTensorParallel::ProcessGroupTensorParallel(std::shared_ptr<comm::ProcessGroup> group)
    : group_(std::move(group)) {}

Tensor ProcessGroupTensorParallel::copy_in(const Tensor& x) const {
  auto group = group_;
  autograd::CustomOp op{
      .name = "tp_copy_in",
      .forward = [](autograd::Context&,
                    const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].detach()}; },
      .backward =
          [group](autograd::Context&, const std::vector<Tensor>& grad_out) {
            Tensor g = grad_out[0].contiguous().clone();
            reduce_in_place(*group, g, comm::ReduceOp::Sum);
            return std::vector<Tensor>{g};
          }};
  return autograd::apply(op, {x})[0];
}

Tensor ProcessGroupTensorParallel::reduce_out(const Tensor& x) const {
  auto group = group_;
  autograd::CustomOp op{
      .name = "tp_reduce_out",
      .forward =
          [group](autograd::Context&, const std::vector<Tensor>& in) {
            Tensor y = in[0].contiguous().clone();
            reduce_in_place(*group, y, comm::ReduceOp::Sum);
            return std::vector<Tensor>{y};
          },
      .backward = [](autograd::Context&, const std::vector<Tensor>& grad_out) {
        return std::vector<Tensor>{grad_out[0]};
      }};
  return autograd::apply(op, {x})[0];
}

void ProcessGroupTensorParallel::sum(Tensor& t) const {
  reduce_in_place(*group_, t, comm::ReduceOp::Sum);
}

void ProcessGroupTensorParallel::max(Tensor& t) const {
  reduce_in_place(*group_, t, comm::ReduceOp::Max);
}

ModelParallelStrategy::ModelParallelStrategy(StrategyOptions options)
    : ParallelStrategy(std::move(options)) {
  if (options_.tensor_parallel < 1)
    fail("[model_parallel] --tp must be >= 1, got ", options_.tensor_parallel);
  if (options_.precision == "16-mixed") {
    fail("[model_parallel] precision 16-mixed is not built; use bf16-mixed or 32-true");
  }
}

void ModelParallelStrategy::setup_environment() {
  join_or_start_ranks(LaunchMethod::Spawn);
  const int tp = options_.tensor_parallel;
  const int dp = DeviceMesh::data_parallel_size(group_->size(), 1, tp);
  mesh_.emplace(group_, DeviceMesh::Dims{{"dp", dp}, {"tp", tp}});
  tp_ = std::make_shared<ProcessGroupTensorParallel>(mesh_->group("tp"));
}

const DeviceMesh& ModelParallelStrategy::mesh() const {
  if (!mesh_) fail("[model_parallel] the mesh exists after setup_environment()");
  return *mesh_;
}

void ModelParallelStrategy::setup_module(nn::Module& module) {
  if (!mesh_) fail("[model_parallel] setup_module before setup_environment(): no process group");
  auto* model = dynamic_cast<nn::TensorParallelModel*>(&module);
  if (model == nullptr) {
    fail("[model_parallel] the module is not an nn::TensorParallelModel (a model that splits "
         "its own layers, as nn::GPT does)");
  }
  Strategy::setup_module(module);
  verify_same_parameters(module.named_parameters(), *group_);
  model->parallelize(tp_);
  splits_ = model->tensor_parallel_splits();
  params_ = module.named_parameters();
}

void ModelParallelStrategy::backward(const Tensor& loss) {
  loss.backward();
  const auto& dp = mesh().group("dp");
  if (!sync_ || dp->size() == 1) return;
  NoGradGuard no_grad;
  std::vector<comm::WorkPtr> pending;
  for (auto& [name, param] : params_) {
    Tensor g = param.grad();
    if (!g.defined()) fail("[model_parallel] parameter ", name, " got no gradient");
    pending.push_back(dp->allreduce(g, {.op = comm::ReduceOp::Avg}));
  }
  for (const comm::WorkPtr& w : pending)
    w->wait();
}

// Per-parameter norms in the module's order, as one device computes them: a split
// parameter's from the sum of its parts' squares over the tp group (or their maximum).
double ModelParallelStrategy::gradient_norm(double norm_type) {
  if (!(norm_type == 2.0 || norm_type == optim::kInfNorm)) {
    fail("[model_parallel] gradient_norm: the 2-norm and the infinity norm are built, got ",
         norm_type);
  }
  const bool inf = norm_type == optim::kInfNorm;
  std::vector<double> norms;
  std::vector<size_t> split_at;
  std::vector<double> partial;
  for (const auto& [name, param] : params_) {
    const double n = param.grad().defined() ? optim::grad_norm({param}, norm_type) : 0.0;
    if (splits_.count(name)) {
      split_at.push_back(norms.size());
      partial.push_back(inf ? n : n * n);
    }
    norms.push_back(n);
  }
  if (!partial.empty()) {
    Tensor all = Tensor::from_vector(partial, {static_cast<int64_t>(partial.size())});
    reduce_in_place(*mesh().group("tp"), all, inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
    const std::vector<double> combined = all.to_vector<double>();
    for (size_t i = 0; i < split_at.size(); ++i)
      norms[split_at[i]] = inf ? combined[i] : std::sqrt(combined[i]);
  }
  return optim::total_norm(norms, norm_type);
}

double ModelParallelStrategy::clip_gradients(double max_norm, double norm_type) {
  std::vector<Tensor> params;
  for (const auto& [name, param] : params_)
    params.push_back(param);
  return optim::clip_grads_to_norm(params, max_norm, gradient_norm(norm_type), norm_type);
}

Tensor ModelParallelStrategy::whole(const std::string& name, const Tensor& part) const {
  auto found = splits_.find(name);
  if (found == splits_.end() || whole_) return part.detach().clone();
  const auto& tp = mesh().group("tp");
  const Tensor mine = part.detach().contiguous();
  Tensor gathered = Tensor::empty({tp->size() * mine.numel()}, mine.dtype());
  tp->all_gather(gathered, mine)->wait();
  std::vector<Tensor> parts;
  for (int r = 0; r < tp->size(); ++r)
    parts.push_back(gathered.narrow(0, r * mine.numel(), mine.numel()).reshape(mine.shape()));
  return nn::join_splits(parts, found->second);
}

std::map<std::string, Tensor> ModelParallelStrategy::gather_state(
    const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> out = state;
  for (const auto& [name, param] : params_) {
    Tensor value = whole(name, param);
    if (out.count(name)) out[name] = value;
  }
  return out;
}

void ModelParallelStrategy::gather_full_module() {
  if (whole_ || params_.empty()) return;
  NoGradGuard no_grad;
  for (auto& [name, param] : params_)
    if (splits_.count(name)) param.set_data(whole(name, param));
  whole_ = true;  // the module holds whole weights now: for saving, not for training on
}

int ModelParallelStrategy::data_parallel_rank() const {
  return mesh().coordinate("dp");
}

int ModelParallelStrategy::data_parallel_size() const {
  return mesh().size("dp");
}

Shape ModelParallelStrategy::parameter_shape(const std::string& name, const Tensor& param) const {
  auto found = splits_.find(name);
  if (found == splits_.end() || whole_) return param.shape();
  return whole_shape(param.shape(), found->second.dim, mesh().size("tp"));
}

std::vector<ModelParallelStrategy::Block> ModelParallelStrategy::blocks_of(const std::string& name,
                                                                        const Tensor& part) const {
  const nn::TensorParallelSplit& split = splits_.at(name);
  const int rank = mesh().coordinate("tp"), ranks = mesh().size("tp");
  const auto dim = static_cast<size_t>(split.dim);
  const int64_t piece = part.size(split.dim) / split.blocks;  // of one block, on this rank
  std::vector<Block> blocks;
  for (int64_t b = 0; b < split.blocks; ++b) {
    Block block{Shape(part.dim(), 0), part.shape(), Shape(part.dim(), 0)};
    block.offsets[dim] = (b * ranks + rank) * piece;
    block.sizes[dim] = piece;
    block.local_offsets[dim] = b * piece;
    blocks.push_back(block);
  }
  return blocks;
}

std::vector<ParameterPart> ModelParallelStrategy::held_parameters() {
  if (whole_) fail("[model_parallel] checkpoints after gather_full_module(): the model is whole");
  std::vector<ParameterPart> parts;
  for (const auto& [name, param] : params_) {
    if (!writes_state_of(name)) continue;
    if (!splits_.count(name)) {
      parts.push_back({name, 0, param.detach().contiguous().reshape({param.numel()})});
      continue;
    }
    for (const Block& block : blocks_of(name, param)) {
      Tensor values = param.detach();
      for (size_t d = 0; d < block.sizes.size(); ++d)
        values = values.narrow(static_cast<int64_t>(d), block.local_offsets[d], block.sizes[d]);
      values = values.contiguous();
      parts.push_back({name, 0, values.reshape({values.numel()}), block.offsets, block.sizes});
    }
  }
  return parts;
}

std::pair<int, int> ModelParallelStrategy::replica_of_held() const {
  return {data_parallel_rank(), data_parallel_size()};
}

bool ModelParallelStrategy::writes_state_of(const std::string& param) const {
  return splits_.count(param) != 0 || mesh().coordinate("tp") == 0;
}

OptimizerLayout ModelParallelStrategy::optimizer_layout(const optim::Optimizer& optimizer) const {
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, p] : params_)
    names.emplace(p.impl_ptr().get(), name);
  OptimizerLayout layout;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    layout.emplace_back();
    for (const Tensor& p : group.params) {
      auto found = names.find(p.impl_ptr().get());
      if (found == names.end()) {
        fail("[model_parallel] the optimizer holds a tensor (", p.str(), ") that is not a "
             "parameter of the set-up module");
      }
      std::vector<OptimizerPart> parts;
      if (!splits_.count(found->second)) {
        parts.push_back({found->second, 0, p.numel(), 0});
      } else {
        for (const Block& block : blocks_of(found->second, p)) {
          OptimizerPart part{found->second};
          part.offsets = block.offsets;
          part.sizes = block.sizes;
          part.local_offsets = block.local_offsets;
          parts.push_back(part);
        }
      }
      layout.back().push_back(std::move(parts));
    }
  }
  return layout;
}

void ModelParallelStrategy::load_parameter_parts(const ReadParameter& read) {
  if (whole_) fail("[model_parallel] loading after gather_full_module(): the model is whole");
  NoGradGuard no_grad;
  for (auto& [name, param] : params_) {
    if (!splits_.count(name)) {
      Tensor host = Tensor::empty({param.numel()}, param.dtype(), Device::cpu());
      read(name, 0, host);
      Tensor target = param.detach();
      copy_(target, host.reshape(param.shape()));
      continue;
    }
    for (const Block& block : blocks_of(name, param)) {
      int64_t count = 1;
      for (int64_t d : block.sizes)
        count *= d;
      Tensor host = Tensor::empty({count}, param.dtype(), Device::cpu());
      read.box(name, block.offsets, block.sizes, host);
      Tensor target = param.detach();
      copy_into_box(target, block.local_offsets, block.sizes, host);
    }
  }
}

}  // namespace loom::strategies
