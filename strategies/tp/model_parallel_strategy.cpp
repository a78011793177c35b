#include "strategies/tp/model_parallel_strategy.h"


#include "core/error.h"
#include "core/tags.h"
#include "optim/clip_grad.h"
#include "strategies/ddp/reducer.h"
#include "strategies/parameter_sync.h"
#include "tensor/autograd/function.h"
#include "tensor/ops.h"

namespace loom::strategies {

namespace {

// [B, t, ...] on each rank -> [B, n t, ...]: the sequence (dimension 1) in rank order.
Tensor gather_sequence(comm::ProcessGroup& group, const Tensor& x) {
  const Tensor part = x.contiguous();
  const int n = group.size();
  Tensor all = Tensor::empty({n * part.numel()}, part.dtype(), part.device());
  group.all_gather(all, part)->wait();
  Shape stacked{n};
  stacked.insert(stacked.end(), part.shape().begin(), part.shape().end());
  std::vector<int64_t> order{1, 0};  // [n, B, t, ...] -> [B, n, t, ...]
  for (int64_t d = 2; d < static_cast<int64_t>(stacked.size()); ++d)
    order.push_back(d);
  Shape whole = part.shape();
  whole[1] *= n;
  return all.reshape(stacked).permute(order).contiguous().reshape(whole);
}

// [B, T, ...] on each rank -> this rank's [B, T / n, ...] of their sum.
Tensor reduce_scatter_sequence(comm::ProcessGroup& group, const Tensor& x) {
  const int n = group.size();
  const Shape shape = x.shape();
  if (shape.size() < 2 || shape[1] % n != 0) {
    tag::kTp.fail("sequence parallelism over ", n,
                  " ranks needs a sequence length they divide, got ", x.str());
  }
  Shape split{shape[0], n, shape[1] / n};  // [B, n, t, ...] -> [n, B, t, ...]
  split.insert(split.end(), shape.begin() + 2, shape.end());
  std::vector<int64_t> order{1, 0};
  for (int64_t d = 2; d < static_cast<int64_t>(split.size()); ++d)
    order.push_back(d);
  const Tensor stacked = x.contiguous().reshape(split).permute(order).contiguous().reshape({x.numel()});
  Tensor mine = Tensor::empty({x.numel() / n}, x.dtype(), x.device());
  group.reduce_scatter(mine, stacked, {.op = comm::ReduceOp::Sum})->wait();
  Shape part = shape;
  part[1] /= n;
  return mine.reshape(part);
}

}  // namespace

ProcessGroupTensorParallel::ProcessGroupTensorParallel(std::shared_ptr<comm::ProcessGroup> group,
                                                       bool sequence_parallel)
    : group_(std::move(group)), sequence_parallel_(sequence_parallel) {}

namespace {

using GroupFunction = Tensor (*)(comm::ProcessGroup&, const Tensor&);

Tensor unchanged(comm::ProcessGroup&, const Tensor& x) {
  return x.detach();
}

// Out of place: the reduction writes the result where a clone would have gone, so x is read
// once (the backends reduce in the same rank order either way).
Tensor summed(comm::ProcessGroup& group, const Tensor& x) {
  const Tensor in = x.contiguous();
  Tensor y = Tensor::empty(in.shape(), in.dtype(), in.device());
  group.allreduce(in, y, {.op = comm::ReduceOp::Sum})->wait();
  return y;
}

// A differentiable op over the group: `forward` on the way in, `backward` on the gradient.
Tensor group_op(const char* name, const std::shared_ptr<comm::ProcessGroup>& group,
                GroupFunction forward, GroupFunction backward, const Tensor& x) {
  autograd::CustomOp op{
      .name = name,
      .forward = [group, forward](autograd::Context&,
                                  const std::vector<Tensor>& in) {
        return std::vector<Tensor>{forward(*group, in[0])};
      },
      .backward = [group, backward](autograd::Context&, const std::vector<Tensor>& grad_out) {
        return std::vector<Tensor>{backward(*group, grad_out[0])};
      }};
  return autograd::apply(op, {x})[0];
}

}  // namespace

Tensor ProcessGroupTensorParallel::copy_in(const Tensor& x) const {
  if (sequence_parallel_)
    return group_op("tp_gather_sequence", group_, gather_sequence, reduce_scatter_sequence, x);
  return group_op("tp_copy_in", group_, unchanged, summed, x);
}

Tensor ProcessGroupTensorParallel::reduce_out(const Tensor& x) const {
  if (sequence_parallel_)
    return group_op("tp_reduce_scatter_sequence", group_, reduce_scatter_sequence, gather_sequence, x);
  return group_op("tp_reduce_out", group_, summed, unchanged, x);
}

void ProcessGroupTensorParallel::sum(Tensor& t) const {
  group_->allreduce(t, {.op = comm::ReduceOp::Sum})->wait();
}

ModelParallelStrategy::ModelParallelStrategy(StrategyOptions options,
                                             TensorParallelOptions tensor_parallel)
    : ParallelStrategy(std::move(options)), tensor_parallel_(tensor_parallel) {
  if (tensor_parallel_.size < 1)
    tag::kModelParallel.fail("--tp must be >= 1, got ", tensor_parallel_.size);
}

void ModelParallelStrategy::setup_environment() {
  join_or_start_ranks(LaunchMethod::Spawn);
  const int tp = tensor_parallel_.size;
  const int dp = DeviceMesh::data_parallel_size(group_->size(), 1, tp);
  mesh_.emplace(group_, DeviceMesh::Dims{{"dp", dp}, {"tp", tp}});
  tp_ = std::make_shared<ProcessGroupTensorParallel>(mesh_->group("tp"),
                                                     tensor_parallel_.sequence_parallel);
}

const DeviceMesh& ModelParallelStrategy::mesh() const {
  if (!mesh_) tag::kModelParallel.fail("the mesh exists after setup_environment()");
  return *mesh_;
}

void ModelParallelStrategy::setup_module(nn::Module& module) {
  if (!mesh_) tag::kModelParallel.fail("setup_module before setup_environment(): no process group");
  auto* model = dynamic_cast<nn::TensorParallelModel*>(&module);
  if (model == nullptr) {
    tag::kModelParallel.fail(
        "the module is not an nn::TensorParallelModel (a model that splits "
        "its own layers, as nn::GPT does)");
  }
  Strategy::setup_module(module);
  verify_same_parameters(module.named_parameters(), *group_);
  model->parallelize(tp_);
  layout_ = TensorParallelLayout(mesh_->group("tp"), model->tensor_parallel_splits());
  params_ = module.named_parameters();
  make_reducer();
}

// Every parameter of the replica, averaged over the dp group in DDP's buckets. Under sequence
// parallelism the replicated parameters used on the split sequence (LayerNorms, wpe, the
// biases after the row-parallel layers) hold each rank's positions' share of their gradient:
// the bucket prologue sums them over the tp group first. Buckets launch in the same order on
// every rank and their sums run at the same point of every tp rank's backward (the ranks run
// the same graph), so they interleave with the split layers' collectives alike everywhere.
void ModelParallelStrategy::make_reducer() {
  reducer_.reset();
  const bool sequence_parallel = tensor_parallel_.sequence_parallel;
  if (mesh_->group("dp")->size() == 1 && !sequence_parallel) return;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, param] : params_) {
    params.push_back(param);
    names.push_back(name);
  }
  reducer_ = std::make_unique<Reducer>(params, mesh_->group("dp"), ReducerOptions{}, names);
  if (!sequence_parallel) return;
  std::vector<bool> replicated;
  for (const std::string& name : names)
    replicated.push_back(!layout_.is_split(name));
  reducer_->set_bucket_prologue(
      [this, replicated](const std::vector<size_t>& params, const std::vector<Tensor>& grads) {
        NoGradGuard no_grad;
        std::vector<comm::WorkPtr> pending;
        for (size_t i = 0; i < params.size(); ++i) {
          if (!replicated[params[i]]) continue;
          Tensor g = grads[i];
          pending.push_back(mesh().group("tp")->allreduce(g, {.op = comm::ReduceOp::Sum}));
        }
        for (const comm::WorkPtr& w : pending)
          w->wait();
      });
}

void ModelParallelStrategy::backward(const Tensor& loss) {
  if (!reducer_) {
    loss.backward();
    return;
  }
  reducer_->set_sync(sync_);
  reducer_->prepare_for_backward(loss);
  loss.backward();
  reducer_->finalize_backward();
}

void ModelParallelStrategy::teardown() {
  reducer_.reset();
  ParallelStrategy::teardown();
}

void ModelParallelStrategy::unscale_gradients() {
  if (!scaler_) return;
  std::vector<Tensor> params;
  for (const auto& [name, param] : params_)
    params.push_back(param);
  scaler_->unscale(params);
  // Every rank skips the step, or none.
  Tensor found = Tensor::full({1}, scaler_->found_inf() ? 1.0 : 0.0, DType::F64, group_->device());
  group_->allreduce(found, {.op = comm::ReduceOp::Max})->wait();
  scaler_->set_found_inf(found.item() > 0.0);
}

// Per-parameter norms in the module's order, as one device computes them.
double ModelParallelStrategy::gradient_norm(double norm_type) {
  std::vector<std::string> names;
  std::vector<double> norms;
  for (const auto& [name, param] : params_) {
    names.push_back(name);
    norms.push_back(param.grad().defined() ? optim::grad_norm({param}, norm_type) : 0.0);
  }
  layout_.complete_norms(names, norms, norm_type);
  return optim::total_norm(norms, norm_type);
}

double ModelParallelStrategy::clip_gradients(double max_norm, double norm_type) {
  std::vector<Tensor> params;
  for (const auto& [name, param] : params_)
    params.push_back(param);
  return optim::clip_grads_to_norm(params, max_norm, gradient_norm(norm_type), norm_type);
}

std::map<std::string, Tensor> ModelParallelStrategy::gather_state(
    const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> out = state;
  for (const auto& [name, param] : params_) {
    Tensor value = whole_ ? param.detach().clone() : layout_.whole(name, param);
    if (out.count(name)) out[name] = value;
  }
  return out;
}

void ModelParallelStrategy::gather_full_module() {
  if (whole_ || params_.empty()) return;
  NoGradGuard no_grad;
  for (auto& [name, param] : params_)
    if (layout_.is_split(name)) param.set_data(layout_.whole(name, param));
  whole_ = true;  // the module holds whole weights now: for saving, not for training on
}

int ModelParallelStrategy::data_parallel_rank() const {
  return mesh().coordinate("dp");
}

int ModelParallelStrategy::data_parallel_size() const {
  return mesh().size("dp");
}

Shape ModelParallelStrategy::parameter_shape(const std::string& name, const Tensor& param) const {
  return whole_ ? param.shape() : layout_.whole_shape(name, param);
}

std::vector<ParameterPart> ModelParallelStrategy::held_parameters() {
  if (whole_)
    tag::kModelParallel.fail("checkpoints after gather_full_module(): the model is whole");
  std::vector<ParameterPart> parts;
  for (const auto& [name, param] : params_)
    if (layout_.writes(name)) layout_.add_parts(name, param, parts);
  return parts;
}

std::pair<int, int> ModelParallelStrategy::replica_of_held() const {
  return {data_parallel_rank(), data_parallel_size()};
}

bool ModelParallelStrategy::writes_state_of(const std::string& param) const {
  return layout_.writes(param);
}

OptimizerLayout ModelParallelStrategy::optimizer_layout(const optim::Optimizer& optimizer) const {
  PartsByTensor parts;
  for (const auto& [name, p] : params_)
    parts[p.impl_ptr().get()] = layout_.optimizer_parts(name, p);
  return optimizer_layout_of(optimizer, parts, name());
}

void ModelParallelStrategy::load_parameter_parts(const ReadParameter& read) {
  if (whole_) tag::kModelParallel.fail("loading after gather_full_module(): the model is whole");
  for (const auto& [name, param] : params_)
    layout_.load(name, param, read);
}

}  // namespace loom::strategies
