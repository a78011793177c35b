#include "strategies/strategy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "comm/backend_registry.h"
#include "core/tags.h"
#include "optim/clip_grad.h"
#include "strategies/devices.h"
#include "strategies/local_launch.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"

namespace loom::strategies {

void Strategy::setup_module(nn::Module& module) {
  module.to(root_device());
  module_ = &module;
}

std::map<std::string, Tensor> Strategy::optimizer_state(const optim::Optimizer& optimizer) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : optimizer.state_dict())
    out.emplace(name, tensor.clone());
  return out;
}

void Strategy::load_parameters(const std::map<std::string, Tensor>& state) {
  auto value_of = [&](const std::string& name, const Tensor& out) {
    auto found = state.find(name);
    if (found == state.end()) Tag(this->name()).fail("load_parameters: no value for ", name);
    const Tensor whole = found->second.to(Device::cpu()).contiguous();
    if (whole.dtype() != out.dtype()) {
      Tag(this->name())
          .fail("load_parameters: ", name, " is ", whole.str(), "; the parameter is ",
                dtype_name(out.dtype()));
    }
    return whole;
  };
  load_parameter_parts(
      {.run =
           [&](const std::string& name, int64_t begin, Tensor& out) {
             const Tensor whole = value_of(name, out);
             const Tensor flat = whole.reshape({whole.numel()});
             if (begin + out.numel() > flat.numel()) {
               Tag(this->name())
                   .fail("load_parameters: ", name, " is ", whole.str(),
                         "; the parameter needs elements [", begin, ", ", begin + out.numel(), ")");
             }
             copy_(out, Tensor::make_view(flat, {out.numel()}, {1}, flat.offset() + begin));
           },
       .box =
           [&](const std::string& name, const Shape& offsets, const Shape& sizes, Tensor& out) {
             Tensor part = value_of(name, out);
             for (size_t d = 0; d < sizes.size(); ++d)
               part = part.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
             copy_(out, part.contiguous().reshape({out.numel()}));
           }});
}

std::vector<Tensor> Strategy::parameters_held_through_step() const {
  return module_ != nullptr ? module_->parameters() : std::vector<Tensor>{};
}

std::vector<ParameterPart> Strategy::held_parameters() {
  if (module_ == nullptr) Tag(name()).fail("held_parameters before setup_module(): no module");
  std::vector<ParameterPart> parts;
  for (const auto& [name, p] : module_->named_parameters())
    parts.push_back({name, 0, p.detach().contiguous().reshape({p.numel()})});
  return parts;
}

OptimizerLayout Strategy::optimizer_layout(const optim::Optimizer& optimizer) const {
  if (module_ == nullptr) Tag(name()).fail("optimizer_layout before setup_module(): no module");
  PartsByTensor parts;
  for (const auto& [name, p] : module_->named_parameters())
    parts[p.impl_ptr().get()] = {{name, 0, p.numel(), 0}};
  return optimizer_layout_of(optimizer, parts, name());
}

void Strategy::load_parameter_parts(const ReadParameter& read) {
  if (module_ == nullptr) Tag(name()).fail("loading parameters before setup_module(): no module");
  NoGradGuard no_grad;
  for (auto& [name, p] : module_->named_parameters()) {
    Tensor host = Tensor::empty({p.numel()}, p.dtype(), Device::cpu());
    read(name, 0, host);
    Tensor target = p.detach();
    copy_(target, host.reshape(p.shape()));
  }
}

Strategy::Strategy(StrategyOptions options) : options_(std::move(options)) {
  set_accelerator(make_accelerator(options_.accelerator));  // parses devices: errors now
  set_precision(make_precision(options_.precision, options_.loss_scaler));
  if (options_.num_nodes < 1)
    tag::kStrategy.fail("num_nodes must be at least 1, got ", options_.num_nodes);
}

Tensor Strategy::forward_backward(const LossOfRows& loss_of_rows, int64_t rows, double scale) {
  if (module_ == nullptr) Tag(name()).fail("forward_backward before setup_module()");
  if (scaler_) scale *= scaler_->scale();
  Tensor loss;
  {
    AutocastGuard autocast(compute_dtype_);
    // What the backward below starts from (Note [The loss's gradient with the loss]).
    LossGradientScope loss_gradient(scale);
    loss = loss_of_rows(*module_, 0, rows);
  }
  backward(scale != 1.0 ? mul(loss, scale) : loss);
  return loss;
}

Tensor Strategy::train_batch(const Tensor& inputs, const Tensor& /*targets*/,
                             const LossOfRows& loss_of_rows, double scale) {
  return forward_backward(loss_of_rows, inputs.size(0), scale);
}

void Strategy::unscale_gradients() {
  if (scaler_ && module_ != nullptr) scaler_->unscale(module_->parameters());
}

double Strategy::gradient_norm(double norm_type) {
  if (module_ == nullptr) Tag(name()).fail("gradient_norm before setup_module()");
  return optim::grad_norm(module_->parameters(), norm_type);
}

double Strategy::clip_gradients(double max_norm, double norm_type) {
  if (module_ == nullptr) Tag(name()).fail("clip_gradients before setup_module()");
  return optim::clip_grad_norm(module_->parameters(), max_norm, norm_type);
}

void Strategy::optimizer_step(optim::Optimizer& optimizer) {
  if (!skips_step()) optimizer.step();
  if (scaler_) scaler_->update();
}

Tensor Strategy::all_reduce(Tensor tensor, comm::ReduceOp) {
  return tensor;
}
Tensor Strategy::all_gather(const Tensor& tensor) {
  Shape shape = tensor.shape();
  shape.insert(shape.begin(), 1);
  return tensor.contiguous().reshape(shape);
}
Tensor Strategy::broadcast(Tensor tensor, int) {
  return tensor;
}

void Strategy::set_accelerator(std::shared_ptr<Accelerator> accelerator) {
  if (!accelerator) tag::kStrategy.fail("set_accelerator: null accelerator");
  DeviceSelection devices = parse_devices(options_.devices, *accelerator);
  accelerator->select(devices.indices);
  accelerator_ = std::move(accelerator);
  devices_ = std::move(devices);
}

void Strategy::set_precision(std::shared_ptr<Precision> precision) {
  if (!precision) tag::kStrategy.fail("set_precision: null precision");
  compute_dtype_ = precision->compute_dtype();
  scaler_ = precision->make_scaler();
}

void Strategy::set_checkpoint_io(std::shared_ptr<CheckpointIO> io) {
  if (!io) tag::kStrategy.fail("set_checkpoint_io: null checkpoint I/O");
  checkpoint_io_ = std::move(io);
}

void Strategy::save_checkpoint(const std::filesystem::path& path,
                               const std::map<std::string, Tensor>& state) {
  if (is_global_zero()) checkpoint_io_->save(path, state);
  barrier();
}

std::map<std::string, Tensor> Strategy::load_checkpoint(const std::filesystem::path& path) {
  return checkpoint_io_->load(path);
}

std::string ParallelStrategy::group_backend(const comm::ClusterEnv& job) const {
  if (options_.process_group_backend != "auto") return options_.process_group_backend;
  return comm::resolve_auto_backend(comm::backend_needs(job, root_device(), devices_.count));
}

void ParallelStrategy::setup_environment() {
  if (group_) return;
  comm::ClusterEnv env = environment_ ? *environment_ : comm::detect_cluster_env();
  environment_ = env;
  const std::string backend = group_backend(env);
  std::optional<Device> device;
  if (root_device().is_cuda()) device = root_device();
  group_ = comm::init(
      {.backend = backend, .timeout = options_.timeout, .environment = env, .device = device});
}

int ParallelStrategy::local_rank() const {
  return environment_ ? environment_->local_rank : 0;
}

int ParallelStrategy::local_world_size() const {
  if (environment_) return environment_->local_world_size;
  return job_ ? world_size() : 1;  // the ranks this process started, itself included
}

int ParallelStrategy::rank() const {
  return group_ ? group_->rank() : 0;
}
int ParallelStrategy::world_size() const {
  return group_ ? group_->size() : 1;
}

comm::ProcessGroup& ParallelStrategy::group_for(const char* what) const {
  if (!group_) tag::kStrategy.fail(what, " before setup_environment(): no process group yet");
  return *group_;
}

Tensor ParallelStrategy::all_reduce(Tensor tensor, comm::ReduceOp op) {
  Tensor t = tensor.contiguous();
  group_for("all_reduce").allreduce(t, {.op = op})->wait();
  return t;
}

Tensor ParallelStrategy::all_gather(const Tensor& tensor) {
  Tensor in = tensor.contiguous();
  Shape shape = in.shape();
  shape.insert(shape.begin(), world_size());
  Tensor out = Tensor::empty(shape, in.dtype(), in.device());
  Tensor flat_out = out.reshape({-1});
  group_for("all_gather").all_gather(flat_out, in.reshape({-1}))->wait();
  return out;
}

Tensor ParallelStrategy::broadcast(Tensor tensor, int source) {
  Tensor t = tensor.contiguous();
  group_for("broadcast").broadcast(t, {.root = source})->wait();
  return t;
}

void ParallelStrategy::barrier() {
  if (group_) group_->barrier()->wait();
}

std::string ParallelStrategy::communication_backend() const {
  return group_ ? group_->backend_name() : std::string();
}

void ParallelStrategy::teardown() {
  group_.reset();
  if (job_) job_->join();
  job_.reset();
}

ParallelStrategy::~ParallelStrategy() = default;

void ParallelStrategy::join_or_start_ranks(LaunchMethod method) {
  if (group_) return;
  // A launcher's job (loomrun, torchrun, Slurm, MPI, or the ranks a LocalJob spawned): join
  // it, as Lightning does where the cluster environment creates the processes.
  const comm::ClusterEnv env = environment_ ? *environment_ : comm::detect_cluster_env();
  if (env.source != "single") {
    environment_ = env;
    ParallelStrategy::setup_environment();
    return;
  }
  const int count = devices_.count;
  const LocalJobOptions job_options{
      .backend = group_backend(comm::single_host_job(count)),
      .device = root_device(),
      .timeout = options_.timeout};
  job_ = std::make_unique<LocalJob>(count, method, job_options);
  group_ = job_->group();
}

}  // namespace loom::strategies
