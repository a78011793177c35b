#pragma once
// dp: Lightning's DataParallel in one process. The module given to setup_module is the
// master (the "first device"); N-1 replicas come from a factory the caller registers (a
// Module cannot copy itself). Each forward_backward copies the master's weights into the
// replicas, splits the batch's rows into N contiguous slices (the first rows % N slices one
// row longer), runs slice 0 on the master on the calling thread and slice i on replica i on
// thread i, then adds each replica's gradient into the master's: the loss of a slice is a
// mean over its rows, so slice i is weighted by rows_i / rows and the master ends with the
// gradient of the whole batch's mean loss, up to float rounding. Devices are CPUs here, so a
// "device" is a thread. `devices` is the replica count N ("auto" means 1).
//
// Threading: forward_backward blocks until every replica is done; call it, like the rest of
// the strategy, from the training thread only.

#include <memory>
#include <vector>

#include "strategies/strategy.h"

namespace loom::strategies {

class DataParallelStrategy : public Strategy {
 public:
  using ReplicaFactory = std::function<std::unique_ptr<nn::Module>()>;

  explicit DataParallelStrategy(StrategyOptions options);
  std::string name() const override { return "dp"; }
  int num_replicas() const { return replicas_; }
  int local_world_size() const override { return replicas_; }
  int devices() const override { return replicas_; }

  // Makes a module with the master's structure (its weights are overwritten each step).
  // Required before the first forward_backward when num_replicas() > 1.
  void set_replica_factory(ReplicaFactory factory) { factory_ = std::move(factory); }
  // recipe.make_replica, when given, is the replica factory.
  void set_model_recipe(const ModelRecipe& recipe) override {
    if (recipe.make_replica) set_replica_factory(recipe.make_replica);
  }
  void setup_module(nn::Module& module) override;
  Tensor forward_backward(const LossOfRows& loss_of_rows, int64_t rows,
                          double scale = 1.0) override;
  void teardown() override;

 private:
  int replicas_ = 1;
  ReplicaFactory factory_;
  std::vector<std::unique_ptr<nn::Module>> copies_;  // replicas 1..N-1
};

}  // namespace loom::strategies
