#include "tools/train_gpt/train_state.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "nn/gpt_io.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/training_state.h"
#include "tensor/error.h"

namespace loom::train_gpt {

namespace fs = std::filesystem;
using strategies::checkpoint::Directory;
using strategies::checkpoint::load_checked;
using strategies::checkpoint::save_checked;

namespace {

constexpr const char* kFormat = "loom-train-checkpoint";

nlohmann::json model_json(const nn::GPTConfig& c) {
  return {{"layers", c.layers}, {"heads", c.heads},   {"embd", c.embd},
          {"context", c.context}, {"vocab_size", c.vocab_size}};
}

nlohmann::json read_meta(const fs::path& checkpoint) {
  std::ifstream in(checkpoint / "meta.json");
  if (!in) fail("[checkpoint] ", checkpoint.string(), " has no meta.json; not a train_gpt checkpoint");
  try {
    nlohmann::json meta = nlohmann::json::parse(in);
    if (meta.value("format", "") != kFormat) fail("format is not ", kFormat);
    return meta;
  } catch (const std::exception& e) {
    fail("[checkpoint] ", (checkpoint / "meta.json").string(), " is unreadable: ", e.what());
  }
}

Tensor scalar_i64(int64_t v) {
  return Tensor::from_vector<int64_t>({v}, {});
}

}  // namespace

TrainCheckpoints::TrainCheckpoints(const TrainOptions& options, strategies::Strategy& strategy)
    : options_(options), strategy_(strategy) {
  if (!options.checkpoint_dir.empty()) directory_.emplace(options.checkpoint_dir);
  if (options.save_every < 0) fail("[train_gpt] --save-every must be >= 0, got ", options.save_every);
  if (options.save_every > 0 && !directory_)
    fail("[train_gpt] --save-every needs --checkpoint-dir DIR (where the checkpoints go)");
  if (options.resume == "auto" && !directory_)
    fail("[train_gpt] --resume auto needs --checkpoint-dir DIR (where to look)");
}

bool TrainCheckpoints::sharded_optimizer() const {
  return strategies::checkpoint::shards_optimizer_state(strategy_);
}

int64_t TrainCheckpoints::load_weights(nn::GPT& model) {
  if (options_.resume.empty()) return 0;
  if (options_.resume == "auto") {
    resume_from_ = directory_->latest();
    if (!resume_from_) {
      if (strategy_.is_global_zero()) {
        std::printf("train_gpt: no committed checkpoint under %s: starting at step 0\n",
                    directory_->root().string().c_str());
      }
      return 0;
    }
  } else {
    resume_from_ = fs::path(options_.resume);
    if (!Directory::is_committed(*resume_from_)) {
      fail("[train_gpt] --resume ", options_.resume, " is not a committed checkpoint (no ",
           Directory::kMarker, " marker: missing, or its save was interrupted); use an "
           "earlier one or --resume auto");
    }
  }
  const nlohmann::json meta = read_meta(*resume_from_);
  const nlohmann::json mine = model_json(model.config());
  if (meta.at("model") != mine) {
    fail("[train_gpt] ", resume_from_->string(), " is a checkpoint of another model (",
         meta.at("model").dump(), "; this run builds ", mine.dump(), ")");
  }
  const bool was_sharded = meta.at("sharded_optimizer").get<bool>();
  if (was_sharded || sharded_optimizer()) {
    const std::string strategy = meta.at("strategy").get<std::string>();
    const int world = meta.at("world_size").get<int>();
    if (was_sharded != sharded_optimizer() || strategy != strategy_.name() ||
        world != strategy_.world_size()) {
      fail("[train_gpt] ", resume_from_->string(), " was saved by ", strategy, " on ", world,
           " rank(s) with ", was_sharded ? "sharded" : "whole", " optimizer state; resume it "
           "with the same --strategy and --devices (resharding checkpoints on load is not "
           "built yet)");
    }
  }
  if (meta.at("optimizer").get<std::string>() != options_.optimizer) {
    fail("[train_gpt] ", resume_from_->string(), " holds ", meta.at("optimizer").get<std::string>(),
         " state; this run uses --optimizer ", options_.optimizer);
  }
  const safetensors::Contents weights = load_checked(*resume_from_ / "model.safetensors");
  model.load_state_dict(nn::gpt_state_from_checkpoint(weights));
  const int64_t steps = meta.at("step").get<int64_t>();
  if (steps > options_.steps) {
    fail("[train_gpt] ", resume_from_->string(), " has done ", steps, " steps, more than --steps ",
         options_.steps);
  }
  if (strategy_.is_global_zero()) {
    std::printf("train_gpt: resuming from %s (%lld steps done)\n", resume_from_->string().c_str(),
                static_cast<long long>(steps));
  }
  return steps;
}

void TrainCheckpoints::load_state(optim::Optimizer& optimizer) {
  if (!resume_from_) return;
  const fs::path file = *resume_from_ / strategies::checkpoint::optimizer_file(strategy_);
  strategies::checkpoint::restore_optimizer(load_checked(file).tensors, optimizer, strategy_,
                                            file.string());
}

void TrainCheckpoints::after_step(int64_t steps_done, nn::GPT& model,
                                  optim::Optimizer& optimizer) {
  if (options_.save_every <= 0 || steps_done % options_.save_every != 0) return;
  save(steps_done, model, optimizer);
}

void TrainCheckpoints::save(int64_t steps_done, nn::GPT& model, optim::Optimizer& optimizer) {
  finish();  // the previous asynchronous save, whose errors surface here
  const bool chief = strategy_.is_global_zero();
  const int rank = strategy_.rank(), world = strategy_.world_size();
  // The snapshot: copies in host memory, so that training may go on while they are written.
  // The weights are gathered by every rank (collective) and written by rank 0.
  Snapshot snap;
  snap.steps_done = steps_done;
  const std::map<std::string, Tensor> gathered = strategy_.gather_state(model.state_dict());
  if (chief) {
    for (const auto& [name, tensor] : gathered)
      snap.weights.emplace(name, tensor.to(Device::cpu()).clone());
  }
  if (chief || sharded_optimizer()) {
    snap.optimizer = strategies::checkpoint::optimizer_snapshot(optimizer, strategy_);
    snap.optimizer["train.steps_done"] = scalar_i64(steps_done);
  }
  if (chief) {
    snap.meta = {{"format", kFormat},
                 {"version", 1},
                 {"step", steps_done},
                 {"strategy", strategy_.name()},
                 {"world_size", world},
                 {"sharded_optimizer", sharded_optimizer()},
                 {"optimizer", options_.optimizer},
                 {"model", model_json(model.config())},
                 {"grad_accum", options_.grad_accum},
                 {"batch", options_.batch},
                 {"seed", options_.seed}};
    snap.model_metadata = nn::gpt_metadata(model.config());
  }
  strategy_.barrier();
  if (chief) directory_->prepare(steps_done);
  strategy_.barrier();
  if (!options_.async_save) {
    write(snap, rank, world, /*wait_for_ranks=*/false);
    strategy_.barrier();  // every rank's files are there
    if (chief) commit(steps_done);
    strategy_.barrier();
    return;
  }
  writer_ = std::thread([this, snap = std::move(snap), rank, world, chief] {
    try {
      write(snap, rank, world, /*wait_for_ranks=*/true);
      if (chief) commit(snap.steps_done);
    } catch (const std::exception& e) {
      writer_error_ = "[checkpoint] the asynchronous save of step " +
                      std::to_string(snap.steps_done) + " failed: " + e.what();
    }
  });
}

// Every rank's files into the staging directory. With wait_for_ranks (asynchronous saves,
// which must not use the process group beside training), ranks other than 0 then leave a
// marker file and rank 0 waits for all of them before it may commit.
void TrainCheckpoints::write(const Snapshot& snap, int rank, int world, bool wait_for_ranks) {
  const fs::path staging = directory_->staging(snap.steps_done);
  if (!snap.weights.empty())
    save_checked(staging / "model.safetensors", snap.weights, snap.model_metadata);
  if (!snap.optimizer.empty())
    save_checked(staging / strategies::checkpoint::optimizer_file(strategy_), snap.optimizer);
  if (rank == 0) {
    std::ofstream out(staging / "meta.json");
    out << snap.meta.dump(1) << "\n";
    out.close();
    if (!out) fail("writing ", (staging / "meta.json").string(), " failed");
  }
  if (!wait_for_ranks || world == 1) return;
  const fs::path mine = staging / (".rank-" + std::to_string(rank) + ".written");
  if (rank != 0) {
    std::ofstream(mine) << "ok\n";
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  for (int r = 1; r < world; ++r) {
    const fs::path theirs = staging / (".rank-" + std::to_string(r) + ".written");
    while (!fs::exists(theirs)) {
      if (std::chrono::steady_clock::now() > deadline)
        fail("rank ", r, " did not finish writing its files within 10 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    fs::remove(theirs);
  }
}

void TrainCheckpoints::commit(int64_t steps_done) {
  directory_->commit(steps_done);
  directory_->prune(options_.keep_last);
}

void TrainCheckpoints::finish() {
  if (writer_.joinable()) writer_.join();
  if (!writer_error_.empty()) {
    const std::string error = std::move(writer_error_);
    writer_error_.clear();
    fail(error);
  }
}

TrainCheckpoints::~TrainCheckpoints() {
  if (writer_.joinable()) writer_.join();  // errors were or will not be reported: finish()
}

}  // namespace loom::train_gpt
