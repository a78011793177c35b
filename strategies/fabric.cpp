#include "strategies/fabric.h"

#include <nlohmann/json.hpp>

#include "core/tags.h"
#include "strategies/checkpoint/distributed_state.h"

#include "tensor/ops.h"

namespace loom {

namespace {

// A named object, not a designated-initializer temporary: GCC 12 at -O3 reports the temporary's
// strings "maybe uninitialized" once the registry call is inlined beside it (unity build).
strategies::StrategyOptions strategy_options(const FabricOptions& options) {
  strategies::StrategyOptions out;
  out.accelerator = options.accelerator;
  out.devices = options.devices;
  out.num_nodes = options.num_nodes;
  out.precision = options.precision;
  return out;
}

}  // namespace

Fabric::Fabric(const FabricOptions& options)
    : strategy_(strategies::StrategyRegistry::create(options.strategy, strategy_options(options))) {}

Fabric::~Fabric() {
  strategy_->teardown();
}

void Fabric::launch() {
  strategy_->setup_environment();
  launched_ = true;
}

void Fabric::setup_module(nn::Module& module) {
  if (!launched_) launch();
  strategy_->setup_module(module);
  module_ = &module;
}

void Fabric::setup_optimizer(optim::Optimizer& optimizer) {
  strategy_->setup_optimizer(optimizer);
}

void Fabric::backward(const Tensor& loss) {
  if (module_ == nullptr) tag::kFabric.fail("backward before setup_module()");
  const strategies::LossScaler* scaler = strategy_->loss_scaler();
  strategy_->backward(scaler != nullptr ? mul(loss, scaler->scale()) : loss);
}

void Fabric::unscale_once() {
  if (!unscaled_) strategy_->unscale_gradients();
  unscaled_ = true;
}

double Fabric::clip_gradients(const nn::Module& module, double max_norm) {
  unscale_once();
  if (&module != module_) {
    tag::kFabric.fail("clip_gradients: the module is not the one passed to setup_module()");
  }
  return strategy_->clip_gradients(max_norm);
}

void Fabric::step(optim::Optimizer& optimizer) {
  unscale_once();
  strategy_->optimizer_step(optimizer);
  unscaled_ = false;
}

Tensor Fabric::all_reduce(const Tensor& tensor, comm::ReduceOp op) {
  return strategy_->all_reduce(tensor.clone(), op);
}
Tensor Fabric::all_gather(const Tensor& tensor) {
  return strategy_->all_gather(tensor);
}
Tensor Fabric::broadcast(const Tensor& tensor, int source) {
  return strategy_->broadcast(tensor.clone(), source);
}
void Fabric::barrier() {
  strategy_->barrier();
}

void Fabric::save(const std::filesystem::path& path, const std::map<std::string, Tensor>& state) {
  strategy_->save_checkpoint(path, state);
}

std::map<std::string, Tensor> Fabric::load(const std::filesystem::path& path) {
  return strategy_->load_checkpoint(path);
}

void Fabric::save(const std::filesystem::path& path, const State& state) {
  if (state.module == nullptr || state.module != module_)
    tag::kFabric.fail("save: State::module must be the module passed to setup_module()");
  std::map<std::string, Tensor> extra;
  for (const auto& [name, tensor] : state.tensors)
    extra.emplace("tensors." + name, tensor);
  const nlohmann::json meta = {{"format", "loom-fabric-state"},
                               {"version", 2},
                               {"strategy", strategy_->name()},
                               {"world_size", world_size()}};
  strategies::checkpoint::save_checkpoint(*strategy_, *module_, state.optimizer, path, extra,
                                          meta.dump(1));
}

void Fabric::load(const std::filesystem::path& path, State& state) {
  if (state.module == nullptr || state.module != module_)
    tag::kFabric.fail("load: State::module must be the module passed to setup_module()");
  state.tensors = strategies::checkpoint::load_checkpoint(*strategy_, *module_, state.optimizer,
                                                          path, "tensors.");
}

int Fabric::rank() const {
  return strategy_->rank();
}
int Fabric::world_size() const {
  return strategy_->world_size();
}
bool Fabric::is_global_zero() const {
  return strategy_->is_global_zero();
}

Fabric::NoBackwardSync Fabric::no_backward_sync(const nn::Module& module) {
  if (&module != module_)
    tag::kFabric.fail("no_backward_sync: the module was not set up with this Fabric");
  return NoBackwardSync(*strategy_);
}

}  // namespace loom
