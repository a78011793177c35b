#include "strategies/fabric.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/distributed_state.h"

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
  barrier();
  if (chief) {
    std::filesystem::remove_all(staging);
    std::filesystem::create_directories(staging);
  }
  barrier();
  // Every rank writes what it holds (no gathering), rank 0 indexes it and commits.
  std::map<std::string, Tensor> extra;
  for (const auto& [name, tensor] : state.tensors)
    extra.emplace("tensors." + name, tensor);
  ckpt::write_pieces(staging / ckpt::rank_file(rank()),
                     ckpt::state_pieces(*strategy_, *module_, state.optimizer, true, extra));
  barrier();
  if (chief) {
    ckpt::write_index(staging, world_size());
    const nlohmann::json meta = {{"format", "loom-fabric-state"},
                                 {"version", 2},
                                 {"strategy", strategy_->name()},
                                 {"world_size", world_size()}};
    std::ofstream out(staging / "meta.json");
    out << meta.dump(1) << "\n";
    out.close();
    if (!out) fail("[fabric] save: writing ", (staging / "meta.json").string(), " failed");
    ckpt::commit_directory(staging, path);
  }
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
  // Any strategy and world size loads it: each rank reads the parts it holds.
  ckpt::CheckpointReader reader(path);
  ckpt::check_model(reader, *module_);
  ckpt::load_parameters(*strategy_, reader);
  if (state.optimizer != nullptr) ckpt::load_optimizer(*strategy_, *state.optimizer, reader);
  state.tensors.clear();
  const std::string prefix = "tensors.";
  for (const auto& [name, entry] : reader.index().tensors) {
    if (name.rfind(prefix, 0) == 0) state.tensors.emplace(name.substr(prefix.size()), reader.read(name));
  }
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
