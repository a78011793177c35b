#pragma once
// The training state of a checkpoint as global tensors, written in parts by the ranks that
// hold them and read back in parts by whatever strategy and world size loads it
// (docs/checkpoints.md). Shared by train_gpt (tools/train_gpt/train_state.h) and Fabric.
//
// Global names:
//   <param>                          the module's parameters, as named_parameters() names them
//   optim.state.<param>.<entry>      per-parameter optimizer state: shaped like the parameter
//                                    (exp_avg, exp_avg_sq, momentum_buffer), or one number
//                                    per parameter (AdamW's step; Optimizer::is_scalar_state)
//   optim.step_count, optim.param_groups.<g>.lr, optim.param_groups.<g>.weight_decay
//   scaler.scale, scaler.clean_steps, scaler.skipped   the loss scaler (16-mixed)
//   anything the caller adds (train.steps_done, Fabric's tensors.<name>), whole
//
// A checkpoint directory holds rank-<R>.safetensors from every rank (its pieces,
// tensor_index.h), optionally model.safetensors (the whole model in the Hugging Face GPT-2
// layout, when the weights are saved gathered), and index.json over all of them.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/tensor_index.h"
#include "strategies/strategy.h"

namespace loom::strategies::checkpoint {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kMetaFile = "meta.json";
// "rank-00001.safetensors"
std::string rank_file(int rank);

// This rank's pieces of the training state, as host copies (a snapshot: training may go on
// while they are written): with `parameters`, its share of the parameter parts it holds
// (ranks holding the same part each write an even share of it); with an optimizer, its share
// of the optimizer state it holds; on rank 0, the optimizer's counters and hyper-parameters,
// the loss scaler's state, and `extra` (whole). Between steps; no collectives (NVMe offload:
// the optimizer state is read in from the swap file for it).
std::vector<TensorPiece> state_pieces(Strategy& strategy, const nn::Module& module,
                                      const optim::Optimizer* optimizer, bool parameters,
                                      const std::map<std::string, Tensor>& extra = {});

// Rank 0, once every rank's file is in `staging`: writes index.json over the world's rank
// files and model.safetensors when there.
void write_index(const std::filesystem::path& staging, int world_size);

// The whole save, as Fabric::save does it (collective: every rank, between steps): an empty
// `path`.partial, every rank's file, rank 0's index and meta.json (`meta_json`, a JSON
// object's text), then the commit (directory.h: COMMITTED last).
void save_checkpoint(Strategy& strategy, const nn::Module& module,
                     const optim::Optimizer* optimizer, const std::filesystem::path& path,
                     const std::map<std::string, Tensor>& extra, const std::string& meta_json);
// The whole load into the set-up module and optimizer (may be null), under any strategy and
// world size. Returns the tensors whose names start with `extra_prefix`, without it.
std::map<std::string, Tensor> load_checkpoint(Strategy& strategy, const nn::Module& module,
                                              optim::Optimizer* optimizer,
                                              const std::filesystem::path& path,
                                              const std::string& extra_prefix);

// Throws loom::Error unless the checkpoint holds every parameter of `module`, with its whole
// shape (Strategy::parameter_shape) and dtype, naming the first that differs.
void check_model(const CheckpointReader& checkpoint, const Strategy& strategy,
                 const nn::Module& module);
// Reads this rank's parts of the parameters into the set-up module (after setup_module).
void load_parameters(Strategy& strategy, CheckpointReader& checkpoint);
// Reads the optimizer state this rank holds, and the loss scaler's, into the set-up
// optimizer (after setup_optimizer). Throws loom::Error when the checkpoint has another
// optimizer's state, other groups, or a loss scaler where this run has none (or none where
// it has one).
void load_optimizer(Strategy& strategy, optim::Optimizer& optimizer, CheckpointReader& checkpoint);

// A checkpoint's meta.json: one JSON object saying what saved it (docs/checkpoints.md). The
// program that writes it defines its fields (train_gpt: tools/train_gpt/train_state.h;
// Fabric::save); this reads them with their types and ranges checked. A field is named by its
// path of keys ("step", "model.heads"). Every error is a loom::Error naming the file, the
// field, the value found and what is expected.
class CheckpointMeta {
 public:
  // Reads `checkpoint`/meta.json; throws when it is missing, not JSON, not a JSON object, or
  // gives a key twice.
  explicit CheckpointMeta(const std::filesystem::path& checkpoint);
  ~CheckpointMeta();
  CheckpointMeta(const CheckpointMeta&) = delete;
  CheckpointMeta& operator=(const CheckpointMeta&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The whole object, as read.
  const nlohmann::json& json() const { return *json_; }
  bool has(const std::string& field) const;
  // The string `field`; with `choices`, one of them.
  std::string text(const std::string& field, const std::vector<std::string>& choices = {}) const;
  // The integer `field` (a JSON integer: not 2.0, not "2"), within [min, max].
  int64_t integer(const std::string& field, int64_t min, int64_t max) const;
  // The non-negative integer `field`, up to 2^64 - 1.
  uint64_t unsigned_integer(const std::string& field) const;
  // Throws: `field` has the value it has; `expected` says what it should be.
  [[noreturn]] void refuse(const std::string& field, const std::string& expected) const;

 private:
  // The value at `field`, or null when it (or an object on its path) is missing.
  const nlohmann::json* find(const std::string& field) const;
  // The value at `field`; throws saying `expected` when it (or an object on its path) is
  // missing.
  const nlohmann::json& at(const std::string& field, const std::string& expected) const;

  std::filesystem::path path_;
  std::unique_ptr<nlohmann::json> json_;
};

}  // namespace loom::strategies::checkpoint
