#include "strategies/fabric.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/training_state.h"

#include "tensor/ops.h"

namespace loom {

Fabric::Fabric(const FabricOptions& options)
    : strategy_(
          strategies::StrategyRegistry::get(options.strategy, {.accelerator = options.accelerator,
                                                               .devices = options.devices,
                                                               .num_nodes = options.num_nodes,
                                                               .precision = options.precision})) {}

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
  if (module_ == nullptr) fail("[fabric] backward before setup_module()");
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
    fail("[fabric] clip_gradients: the module is not the one passed to setup_module()");
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
  namespace ckpt = strategies::checkpoint;
  if (state.module == nullptr || state.module != module_)
    fail("[fabric] save: State::module must be the module passed to setup_module()");
  const bool chief = is_global_zero();
  const std::filesystem::path staging = path.string() + ".partial";
  // Gathered by every rank (collective), written by rank 0.
  const std::map<std::string, Tensor> weights = strategy_->gather_state(state.module->state_dict());
  barrier();
  if (chief) {
    std::filesystem::remove_all(staging);
    std::filesystem::create_directories(staging);
    ckpt::save_checked(staging / "model.safetensors", weights);
    ckpt::save_checked(staging / "tensors.safetensors", state.tensors);
    const nlohmann::json meta = {{"format", "loom-fabric-state"},
                                 {"version", 1},
                                 {"strategy", strategy_->name()},
                                 {"world_size", world_size()},
                                 {"sharded_optimizer", ckpt::shards_optimizer_state(*strategy_)}};
    std::ofstream(staging / "meta.json") << meta.dump(1) << "\n";
  }
  barrier();
  if (state.optimizer != nullptr && (chief || ckpt::shards_optimizer_state(*strategy_))) {
    ckpt::save_checked(staging / ckpt::optimizer_file(*strategy_),
                       ckpt::optimizer_snapshot(*state.optimizer, *strategy_));
  }
  barrier();
  if (chief) ckpt::commit_directory(staging, path);
  barrier();
}

void Fabric::load(const std::filesystem::path& path, State& state) {
  namespace ckpt = strategies::checkpoint;
  if (state.module == nullptr || state.module != module_)
    fail("[fabric] load: State::module must be the module passed to setup_module()");
  if (!ckpt::Directory::is_committed(path)) {
    fail("[fabric] load: ", path.string(), " is not a committed checkpoint (no ",
         ckpt::Directory::kMarker, "): its save did not finish, or it is not a Fabric state");
  }
  std::ifstream in(path / "meta.json");
  const nlohmann::json meta = nlohmann::json::parse(in);
  const bool sharded = meta.at("sharded_optimizer").get<bool>();
  if (state.optimizer != nullptr &&
      (sharded || ckpt::shards_optimizer_state(*strategy_)) &&
      (meta.at("strategy").get<std::string>() != strategy_->name() ||
       meta.at("world_size").get<int>() != world_size() ||
       sharded != ckpt::shards_optimizer_state(*strategy_))) {
    fail("[fabric] load: ", path.string(), " was saved by ", meta.at("strategy").get<std::string>(),
         " on ", meta.at("world_size").get<int>(), " rank(s); its optimizer state loads under "
         "the same strategy and world size only (resharding is not built yet)");
  }
  strategy_->load_parameters(ckpt::load_checked(path / "model.safetensors").tensors);
  if (state.optimizer != nullptr) {
    const std::filesystem::path file = path / ckpt::optimizer_file(*strategy_);
    ckpt::restore_optimizer(ckpt::load_checked(file).tensors, *state.optimizer, *strategy_,
                            file.string());
  }
  state.tensors = ckpt::load_checked(path / "tensors.safetensors").tensors;
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
    fail("[fabric] no_backward_sync: the module was not set up with this Fabric");
  return NoBackwardSync(*strategy_);
}

}  // namespace loom
