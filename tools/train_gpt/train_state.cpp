#include "tools/train_gpt/train_state.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/gpt_io.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/sharded/sharded_strategy.h"
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
  return dynamic_cast<const strategies::ShardedStrategy*>(&strategy_) != nullptr;
}

std::string TrainCheckpoints::optimizer_file(int rank) const {
  if (!sharded_optimizer()) return "optimizer.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "optimizer.rank-%05d.safetensors", rank);
  return name;
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
  safetensors::Contents contents =
      load_checked(*resume_from_ / optimizer_file(strategy_.rank()));
  std::map<std::string, Tensor> state;
  std::optional<strategies::LossScaler::State> scaler;
  for (auto& [name, tensor] : contents.tensors) {
    if (name.rfind("scaler.", 0) == 0) {
      if (!scaler) scaler.emplace();
      if (name == "scaler.scale") scaler->scale = tensor.item();
      if (name == "scaler.clean_steps") scaler->clean_steps = static_cast<int>(tensor.item());
      if (name == "scaler.skipped") scaler->skipped = static_cast<int64_t>(tensor.item());
    } else if (name.rfind("train.", 0) != 0) {
      state.emplace(name, tensor);
    }
  }
  optimizer.load_state_dict(state);
  strategies::LossScaler* mine = strategy_.loss_scaler();
  if (scaler && mine == nullptr) {
    fail("[train_gpt] ", resume_from_->string(), " holds a loss scaler (16-mixed) but this run's "
         "--precision has none; resume with --precision 16-mixed");
  }
  if (mine != nullptr) {
    if (!scaler) {
      fail("[train_gpt] ", resume_from_->string(), " has no loss scaler state; it was not "
           "saved under --precision 16-mixed");
    }
    mine->restore(*scaler);
  }
}

void TrainCheckpoints::after_step(int64_t steps_done, nn::GPT& model,
                                  optim::Optimizer& optimizer) {
  if (options_.save_every <= 0 || steps_done % options_.save_every != 0) return;
  save(steps_done, model, optimizer);
}

void TrainCheckpoints::save(int64_t steps_done, nn::GPT& model, optim::Optimizer& optimizer) {
  const bool chief = strategy_.is_global_zero();
  // Gathered by every rank first (collective), written by rank 0.
  const std::map<std::string, Tensor> weights = strategy_.gather_state(model.state_dict());
  strategy_.barrier();
  if (chief) directory_->prepare(steps_done);
  strategy_.barrier();
  const fs::path staging = directory_->staging(steps_done);
  if (chief) save_checked(staging / "model.safetensors", weights, nn::gpt_metadata(model.config()));
  if (chief || sharded_optimizer()) {
    std::map<std::string, Tensor> state = optimizer.state_dict();
    for (auto& [name, tensor] : state)
      tensor = tensor.clone();  // the live state, as it is at this step
    state["train.steps_done"] = scalar_i64(steps_done);
    if (const strategies::LossScaler* scaler = strategy_.loss_scaler()) {
      const strategies::LossScaler::State s = scaler->state();
      state["scaler.scale"] = Tensor::from_vector<double>({s.scale}, {});
      state["scaler.clean_steps"] = scalar_i64(s.clean_steps);
      state["scaler.skipped"] = scalar_i64(s.skipped);
    }
    save_checked(staging / optimizer_file(strategy_.rank()), state);
  }
  if (chief) {
    const nlohmann::json meta = {{"format", kFormat},
                                 {"version", 1},
                                 {"step", steps_done},
                                 {"strategy", strategy_.name()},
                                 {"world_size", strategy_.world_size()},
                                 {"sharded_optimizer", sharded_optimizer()},
                                 {"optimizer", options_.optimizer},
                                 {"model", model_json(model.config())},
                                 {"grad_accum", options_.grad_accum},
                                 {"batch", options_.batch},
                                 {"seed", options_.seed}};
    std::ofstream out(staging / "meta.json");
    out << meta.dump(1) << "\n";
    out.close();
    if (!out) fail("[checkpoint] writing ", (staging / "meta.json").string(), " failed");
  }
  strategy_.barrier();
  if (chief) {
    directory_->commit(steps_done);
    directory_->prune(options_.keep_last);
  }
  strategy_.barrier();
}

}  // namespace loom::train_gpt
