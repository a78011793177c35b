#pragma once
// train_gpt's resumable checkpoints (docs/checkpoints.md): under --checkpoint-dir, every
// --save-every steps, a committed directory (strategies/checkpoint/directory.h) holding
//
//   model.safetensors               the whole model (gathered under sharded strategies), in
//                                   the Hugging Face GPT-2 layout, with per-tensor checksums
//   optimizer.safetensors           optimizer state of a replicating strategy (rank 0), or
//   optimizer.rank-00001.safetensors  each rank's shard of it under a sharded strategy; with
//                                   the steps done and the loss scaler's state
//   meta.json                       step, strategy, world size, model, optimizer, precision
//
// Everything else a step depends on is a function of the step (data order, learning rate)
// or fixed by the options (seed), so a resumed run repeats the uninterrupted one bit for bit.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/strategy.h"
#include "tensor/safetensors.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

class TrainCheckpoints {
 public:
  // Nothing happens unless options.checkpoint_dir or options.resume is set.
  TrainCheckpoints(const TrainOptions& options, strategies::Strategy& strategy);

  // Before setup_module: finds the checkpoint to resume from (options.resume: "auto" takes
  // the newest committed one under checkpoint_dir, or none; a path must be committed),
  // checks that it fits this run, and loads its weights into `model`. Returns the steps it
  // had done (0 when starting fresh).
  int64_t load_weights(nn::GPT& model);
  // After setup_optimizer: the optimizer's state and the loss scaler's.
  void load_state(optim::Optimizer& optimizer);
  // After a step: saves when `steps_done` is a multiple of save_every (collective). With
  // options.async_save the state is snapshotted to host memory and written by a background
  // thread while training goes on; the next save (or finish()) waits for it.
  void after_step(int64_t steps_done, nn::GPT& model, optim::Optimizer& optimizer);
  // Waits for an asynchronous save; throws loom::Error if it failed.
  void finish();
  ~TrainCheckpoints();

 private:
  struct Snapshot {
    int64_t steps_done = 0;
    std::map<std::string, Tensor> weights, optimizer;  // host copies
    nlohmann::json meta;
    safetensors::Metadata model_metadata;
  };
  void save(int64_t steps_done, nn::GPT& model, optim::Optimizer& optimizer);
  void write(const Snapshot& snap, int rank, int world, bool wait_for_ranks);
  void commit(int64_t steps_done);
  bool sharded_optimizer() const;

  const TrainOptions& options_;
  strategies::Strategy& strategy_;
  std::optional<strategies::checkpoint::Directory> directory_;
  std::optional<std::filesystem::path> resume_from_;
  std::thread writer_;        // the asynchronous save in flight, if any
  std::string writer_error_;  // its failure, reported by finish()
};

}  // namespace loom::train_gpt
