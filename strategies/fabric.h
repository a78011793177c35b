#pragma once
// Fabric: the front a C++ trainer adopts by changing a handful of lines (Lightning Fabric).
//
//   loom::Fabric fabric({.strategy = "ddp"});   // under loomrun --nproc-per-node N
//   fabric.launch();
//   fabric.setup_module(model);                  // broadcast from rank 0, gradient buckets
//   fabric.setup_optimizer(optimizer);
//   for (...) {
//     Tensor loss = model.loss(x, y);
//     fabric.backward(loss);                     // instead of loss.backward()
//     optimizer.step();
//     optimizer.zero_grad();
//   }
//   if (fabric.is_global_zero()) ...             // logging, checkpoints
//
// The strategy comes from the StrategyRegistry by name, so user-registered strategies work
// here exactly like the built-ins.

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "strategies/registry.h"
#include "tensor/autocast.h"

namespace loom {

struct FabricOptions {
  std::string strategy = "single_device";
  std::string accelerator = "auto";
  std::string devices = "auto";
  int num_nodes = 1;
  std::string precision = "32-true";
};

class Fabric {
 public:
  explicit Fabric(const FabricOptions& options = {});
  ~Fabric();

  // Joins the job's ranks (the launcher started them) and creates the process group.
  void launch();
  void setup_module(nn::Module& module);
  void setup_optimizer(optim::Optimizer& optimizer);
  // Backward of `loss` (times the loss scale under 16-mixed) with the strategy's gradient
  // synchronisation.
  void backward(const Tensor& loss);
  // The forward's precision scope: `auto guard = fabric.autocast();` before computing the
  // loss (matmul/linear round to bf16/f16 under the mixed precisions; nothing under 32-true).
  [[nodiscard]] AutocastGuard autocast() const { return AutocastGuard(strategy_->compute_dtype()); }
  // optimizer.step() through the strategy: gradients unscaled first (16-mixed), the step
  // skipped when they are not finite, then the scale updated. Use instead of
  // optimizer.step() when the precision is 16-mixed (equivalent otherwise).
  void step(optim::Optimizer& optimizer);
  // Global-norm clipping of the module's gradients (after backward: they are synchronised;
  // unscaled first under 16-mixed).
  double clip_gradients(const nn::Module& module, double max_norm);

  Tensor all_reduce(const Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::Avg);
  Tensor all_gather(const Tensor& tensor);
  Tensor broadcast(const Tensor& tensor, int source = 0);
  void barrier();

  // Rank 0 writes `state` atomically (safetensors); every rank can load it.
  void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& state);
  std::map<std::string, Tensor> load(const std::filesystem::path& path);

  // Training state to resume from (Lightning's fabric.save(path, {"model": model,
  // "optimizer": optimizer, "step": step})): the set-up module, its set-up optimizer (may be
  // null) and the caller's own tensors.
  struct State {
    nn::Module* module = nullptr;
    optim::Optimizer* optimizer = nullptr;
    std::map<std::string, Tensor> tensors;
  };
  // Writes `state` as a committed distributed checkpoint at `path` (docs/checkpoints.md:
  // every rank writes the parameters and optimizer state it holds, rank 0 the index and
  // `state.tensors`, with checksums, COMMITTED last; nothing is gathered). Collective: every
  // rank calls it between steps.
  void save(const std::filesystem::path& path, const State& state);
  // Restores a save(path, State) into `state` in place, under any strategy and world size:
  // the module's parameters and the optimizer's and loss scaler's state (each rank reads the
  // parts it holds), and fills `state.tensors`. After setup_module / setup_optimizer.
  void load(const std::filesystem::path& path, State& state);

  int rank() const;
  int world_size() const;
  bool is_global_zero() const;
  strategies::Strategy& strategy() { return *strategy_; }

  // While the returned guard lives, backward() accumulates gradients locally without
  // synchronising them (gradient accumulation); the first backward after it synchronises
  // the accumulated sums.
  class NoBackwardSync {
   public:
    explicit NoBackwardSync(strategies::Strategy& strategy) : strategy_(&strategy) {
      strategy_->set_backward_sync(false);
    }
    ~NoBackwardSync() { strategy_->set_backward_sync(true); }
    NoBackwardSync(const NoBackwardSync&) = delete;
    NoBackwardSync& operator=(const NoBackwardSync&) = delete;

   private:
    strategies::Strategy* strategy_;
  };
  [[nodiscard]] NoBackwardSync no_backward_sync(const nn::Module& module);

 private:
  std::unique_ptr<strategies::Strategy> strategy_;
  const nn::Module* module_ = nullptr;
  bool launched_ = false;
  bool unscaled_ = false;  // 16-mixed: gradients of this step already divided by the scale
  void unscale_once();
};

}  // namespace loom
