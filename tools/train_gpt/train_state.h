#pragma once
// train_gpt's resumable checkpoints (docs/checkpoints.md): under --checkpoint-dir, every
// --save-every steps, a committed directory (strategies/checkpoint/directory.h) holding
//
//   rank-00000.safetensors ...  every rank's parts of the training state
//                               (strategies/checkpoint/distributed_state.h): the optimizer's
//                               state it holds, the loss scaler's, and with the sharded
//                               format its parts of the weights
//   model.safetensors           with the full format: the whole model (gathered), in the
//                               Hugging Face GPT-2 layout
//   index.json                  every tensor's shape, dtype and shards
//   meta.json                   step, strategy, world size, model, optimizer, format
//
// Any strategy and world size resumes any of them (each rank reads the parts it holds).
// Everything else a step depends on is a function of the step (data order, learning rate)
// or fixed by the options (seed), so a run resumed under the strategy and world size that
// saved it repeats the uninterrupted one bit for bit.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/checkpoint/tensor_index.h"
#include "strategies/strategy.h"
#include "tensor/safetensors.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

// train_gpt's meta.json (docs/checkpoints.md, "What a checkpoint holds"), as read back.
inline constexpr const char* kCheckpointFormat = "loom-train-checkpoint";
inline constexpr int64_t kCheckpointVersion = 2;
struct TrainMeta {
  int64_t step = 0;  // the steps done
  std::string strategy, checkpoint_format, optimizer;
  int64_t world_size = 0;
  nn::GPTConfig model;  // the sizes every architecture shares
  nn::Architecture architecture = nn::Architecture::kGpt2;
  // Data blocks every rank together had read (data_position; for checkpoints written before
  // it was recorded: step x grad_accum x world_size, what they read).
  int64_t data_position = 0;
};
// Checks `meta` as train_gpt writes it: its format and version, then every field's type and
// range (step >= 0, world_size >= 1, checkpoint_format full or sharded, the model's sizes
// positive, ...). Throws loom::Error naming meta.json, the field, its value and what is
// expected. Fields it does not know are left alone.
TrainMeta check_train_meta(const strategies::checkpoint::CheckpointMeta& meta);
// Checks that the steps meta.json says were done are the steps the rest of the checkpoint
// says: its directory's name (step-N) and its optimizer's step count (AdamW's per-parameter
// `step`: equal, or at most meta's when a loss scaler skipped steps). A meta.json copied from
// another checkpoint is then refused, naming both counts; so is one naming another optimizer
// than the state's (AdamW's moments, or none). Throws loom::Error.
void check_train_step(const TrainMeta& meta, strategies::checkpoint::CheckpointReader& reader);

class TrainCheckpoints {
 public:
  // Nothing happens unless options.checkpoint_dir or options.resume is set.
  TrainCheckpoints(const TrainOptions& options, strategies::Strategy& strategy);

  // Before setup_module: finds the checkpoint to resume from (options.resume: "auto" takes
  // the newest committed one under checkpoint_dir, or none; a path must be committed) and
  // checks that it fits this run. Returns the steps it had done (0 when starting fresh).
  int64_t open(nn::CausalLM& model);
  // The data position (TrainMeta::data_position) of the checkpoint open() resumes from; 0
  // when starting fresh. The data order goes on from there at any world size.
  int64_t data_position() const { return data_position_; }
  // After setup_optimizer: the parts of the weights and of the optimizer's and loss
  // scaler's state this rank holds.
  void load_state(optim::Optimizer& optimizer);
  // After a step: saves when `steps_done` is a multiple of save_every (collective). With
  // options.async_save the state is snapshotted to host memory and written by a background
  // thread while training goes on; the next save (or finish()) waits for it.
  // `data_position`: the data blocks read by every rank together so far.
  void after_step(int64_t steps_done, int64_t data_position, nn::CausalLM& model,
                  optim::Optimizer& optimizer);
  // Waits for an asynchronous save; throws loom::Error if it failed.
  void finish();
  ~TrainCheckpoints();

 private:
  struct Snapshot {
    int64_t steps_done = 0;
    std::vector<strategies::checkpoint::TensorPiece> pieces;  // host copies
    std::map<std::string, Tensor> weights;  // the full format's gathered model (rank 0)
    nlohmann::json meta;
    safetensors::Metadata model_metadata;
  };
  bool sharded_format() const;
  void save(int64_t steps_done, int64_t data_position, nn::CausalLM& model,
            optim::Optimizer& optimizer);
  void write(const Snapshot& snap, int rank, int world, bool wait_for_ranks);
  void commit(int64_t steps_done);

  const TrainOptions& options_;
  strategies::Strategy& strategy_;
  std::optional<strategies::checkpoint::Directory> directory_;
  std::optional<strategies::checkpoint::DirectoryLock> lock_;  // rank 0's, while it runs
  std::unique_ptr<strategies::checkpoint::CheckpointReader> resume_from_;
  int64_t data_position_ = 0;
  std::thread writer_;           // the asynchronous save in flight, if any
  std::string writer_error_;     // its failure, reported by finish()
};

}  // namespace loom::train_gpt
