#include "tools/train_gpt/train_state.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "nn/gpt_io.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/distributed_state.h"

namespace loom::train_gpt {

namespace fs = std::filesystem;
using strategies::checkpoint::Directory;
using strategies::checkpoint::save_checked;

namespace {

// The sizes every architecture shares; a Llama's also its architecture and its own sizes
// (read back only as far as check_train_meta knows them: the shared ones and the
// architecture; the rest the parameters' shapes check).
nlohmann::json model_json(const nn::GPTConfig& c, nn::Architecture architecture) {
  nlohmann::json j = {{"layers", c.layers}, {"heads", c.heads},   {"embd", c.embd},
                      {"context", c.context}, {"vocab_size", c.vocab_size}};
  if (architecture != nn::Architecture::kGpt2) j["architecture"] = nn::architecture_name(architecture);
  return j;
}

nlohmann::json model_json(const TrainOptions& o) {
  nlohmann::json j = model_json(o.model, o.architecture);
  if (o.architecture == nn::Architecture::kLlama) {
    const nn::LlamaConfig& l = o.llama;
    j.update({{"kv_heads", l.kv_heads},
              {"intermediate", l.intermediate},
              {"head_dim", l.head_dim},
              {"rope_theta", l.rope_theta},
              {"rms_norm_eps", l.rms_norm_eps},
              {"tie_embeddings", l.tie_embeddings}});
  }
  return j;
}

}  // namespace

TrainMeta check_train_meta(const strategies::checkpoint::CheckpointMeta& meta) {
  constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
  if (meta.text("format") != kCheckpointFormat) {
    meta.refuse("format", std::string("\"") + kCheckpointFormat + "\" (a train_gpt checkpoint)");
  }
  const int64_t version = meta.integer("version", std::numeric_limits<int64_t>::min(), kLargest);
  if (version != kCheckpointVersion) {
    tag::kCheckpoint.fail(meta.path().string(), " has format version ", version,
                          "; this Loom reads version ", kCheckpointVersion,
                          " (checkpoints with an index.json)");
  }
  TrainMeta out;
  out.step = meta.integer("step", 0, kLargest);
  out.strategy = meta.text("strategy");
  out.world_size = meta.integer("world_size", 1, std::numeric_limits<int>::max());
  out.checkpoint_format = meta.text("checkpoint_format", {"full", "sharded"});
  out.optimizer = meta.text("optimizer");
  out.model.layers = meta.integer("model.layers", 1, kLargest);
  out.model.heads = meta.integer("model.heads", 1, kLargest);
  out.model.embd = meta.integer("model.embd", 1, kLargest);
  out.model.context = meta.integer("model.context", 1, kLargest);
  out.model.vocab_size = meta.integer("model.vocab_size", 1, kLargest);
  out.architecture = nn::parse_architecture(
      meta.has("model.architecture") ? meta.text("model.architecture") : "gpt2");
  // Recorded, not used on resume (the options given now hold), but of their type if there.
  for (const char* positive : {"grad_accum", "batch"})
    if (meta.has(positive)) meta.integer(positive, 1, kLargest);
  const int64_t accum = meta.has("grad_accum") ? meta.integer("grad_accum", 1, kLargest) : 1;
  if (meta.has("data_position")) {
    out.data_position = meta.integer("data_position", 0, kLargest);
  } else if (__builtin_mul_overflow(out.step, accum, &out.data_position) ||
             __builtin_mul_overflow(out.data_position, out.world_size, &out.data_position)) {
    meta.refuse("step", "a step count whose data position (step x grad_accum x world_size) "
                        "fits in 64 bits");
  }
  if (meta.has("seed")) meta.unsigned_integer("seed");
  return out;
}

void check_train_step(const TrainMeta& meta, strategies::checkpoint::CheckpointReader& reader) {
  const fs::path& checkpoint = reader.path();
  const fs::path named = checkpoint.filename().empty() ? checkpoint.parent_path() : checkpoint;
  if (const std::optional<int64_t> step = strategies::checkpoint::step_of(named);
      step && *step != meta.step) {
    tag::kCheckpoint.fail(checkpoint.string(), ": meta.json records step ", meta.step,
                          ", but the directory is the checkpoint of step ", *step,
                          " (a meta.json of another checkpoint?); use a checkpoint as it was saved");
  }
  bool scaled = false, adam_moments = false;
  std::string counted;  // an optimizer state tensor that counts the steps
  for (const auto& [name, entry] : reader.index().tensors) {
    if (name.rfind("scaler.", 0) == 0) scaled = true;
    if (!name.starts_with("optim.state.")) continue;
    if (name.ends_with(".exp_avg")) adam_moments = true;
    if (counted.empty() && name.ends_with(".step") && entry.dtype == DType::I64 && entry.shape.empty())
      counted = name;
  }
  // The optimizer meta.json names must be the one whose state is there: AdamW's moments (which
  // a run whose every step a loss scaler skipped has not made yet).
  const bool adamw = meta.optimizer == "adamw";
  if ((adam_moments && !adamw) || (!adam_moments && adamw && !scaled)) {
    tag::kCheckpoint.fail(checkpoint.string(), ": meta.json says the optimizer is ", meta.optimizer,
                          ", but the state holds ", adam_moments ? "" : "no ",
                          "AdamW moments (exp_avg); use a checkpoint as it was saved");
  }
  if (counted.empty()) return;  // an optimizer without a step count (SGD)
  const int64_t optimizer_steps = reader.read(counted).to_vector<int64_t>().at(0);
  if (optimizer_steps == meta.step || (scaled && optimizer_steps >= 0 && optimizer_steps < meta.step))
    return;
  tag::kCheckpoint.fail(checkpoint.string(), ": meta.json records step ", meta.step,
                        ", but the optimizer state has taken ", optimizer_steps, " steps (",
                        counted, "; a meta.json of another checkpoint?); use a checkpoint as it "
                        "was saved");
}

TrainCheckpoints::TrainCheckpoints(const TrainOptions& options, strategies::Strategy& strategy)
    : options_(options), strategy_(strategy) {
  if (!options.checkpoint_dir.empty()) {
    directory_.emplace(options.checkpoint_dir);
    if (strategy.is_global_zero()) lock_.emplace(options.checkpoint_dir);
  }
  if (options.save_every < 0)
    tag::kTrainGpt.fail("--save-every must be >= 0, got ", options.save_every);
  if (options.save_every > 0 && !directory_)
    tag::kTrainGpt.fail("--save-every needs --checkpoint-dir DIR (where the checkpoints go)");
  if (options.resume == "auto" && !directory_)
    tag::kTrainGpt.fail("--resume auto needs --checkpoint-dir DIR (where to look)");
}

bool TrainCheckpoints::sharded_format() const {
  if (options_.checkpoint_format == "auto")
    return strategy_.prefers_sharded_checkpoints();
  return options_.checkpoint_format == "sharded";
}

int64_t TrainCheckpoints::open(nn::CausalLM& model) {
  if (options_.resume.empty()) return 0;
  fs::path checkpoint;
  if (options_.resume == "auto") {
    const std::optional<fs::path> latest = directory_->latest();
    if (!latest) {
      if (strategy_.is_global_zero()) {
        std::printf("train_gpt: no committed checkpoint under %s: starting at step 0\n",
                    directory_->root().string().c_str());
      }
      return 0;
    }
    checkpoint = *latest;
  } else {
    checkpoint = fs::path(options_.resume);
    if (!Directory::is_committed(checkpoint)) {
      tag::kTrainGpt.fail("--resume ", options_.resume, " is not a committed checkpoint (no ",
                          Directory::kMarker,
                          " marker: missing, or its save was interrupted); use an "
                          "earlier one or --resume auto");
    }
  }
  const TrainMeta meta = check_train_meta(strategies::checkpoint::CheckpointMeta(checkpoint));
  const nlohmann::json saved = model_json(meta.model, meta.architecture),
                       mine = model_json(options_.model, options_.architecture);
  if (saved != mine) {
    tag::kTrainGpt.fail(checkpoint.string(), " is a checkpoint of another model (", saved.dump(),
                        "; this run builds ", mine.dump(), ")");
  }
  if (meta.optimizer != options_.optimizer) {
    tag::kTrainGpt.fail(checkpoint.string(), " holds ", meta.optimizer,
                        " state; this run uses --optimizer ", options_.optimizer);
  }
  const int64_t steps = meta.step;
  if (steps > options_.steps) {
    tag::kTrainGpt.fail(checkpoint.string(), " has done ", steps, " steps, more than --steps ",
                        options_.steps);
  }
  resume_from_ = std::make_unique<strategies::checkpoint::CheckpointReader>(checkpoint);
  data_position_ = meta.data_position;
  check_train_step(meta, *resume_from_);
  strategies::checkpoint::check_model(*resume_from_, strategy_, model);
  if (strategy_.is_global_zero()) {
    std::printf("train_gpt: resuming from %s (%lld steps done, saved by %s on %d rank(s))\n",
                checkpoint.string().c_str(), static_cast<long long>(steps), meta.strategy.c_str(),
                static_cast<int>(meta.world_size));
  }
  return steps;
}

void TrainCheckpoints::load_state(optim::Optimizer& optimizer) {
  if (!resume_from_) return;
  strategies::checkpoint::load_parameters(strategy_, *resume_from_);
  strategies::checkpoint::load_optimizer(strategy_, optimizer, *resume_from_);
  resume_from_.reset();  // closes the files
}

void TrainCheckpoints::after_step(int64_t steps_done, int64_t data_position,
                                  nn::CausalLM& model, optim::Optimizer& optimizer) {
  if (options_.save_every <= 0 || steps_done % options_.save_every != 0) return;
  save(steps_done, data_position, model, optimizer);
}

void TrainCheckpoints::save(int64_t steps_done, int64_t data_position, nn::CausalLM& model,
                            optim::Optimizer& optimizer) {
  finish();  // the previous asynchronous save, whose errors surface here
  const bool chief = strategy_.is_global_zero();
  const int rank = strategy_.rank(), world = strategy_.world_size();
  const bool sharded = sharded_format();
  // The snapshot: copies in host memory, so that training may go on while they are written.
  Snapshot snap;
  snap.steps_done = steps_done;
  if (!sharded) {  // the full format: gathered by every rank (collective), written by rank 0
    const std::map<std::string, Tensor> gathered = strategy_.gather_state(model.state_dict());
    if (chief) {
      for (const auto& [name, tensor] : gathered)
        snap.weights.emplace(name, tensor.to(Device::cpu()).clone());
      snap.model_metadata = nn::weights_metadata(model_spec(options_));
    }
  }
  snap.pieces = strategies::checkpoint::state_pieces(strategy_, model, &optimizer, sharded);
  if (chief) {
    snap.meta = {{"format", kCheckpointFormat},
                 {"version", kCheckpointVersion},
                 {"step", steps_done},
                 {"strategy", strategy_.name()},
                 {"world_size", world},
                 {"checkpoint_format", sharded ? "sharded" : "full"},
                 {"optimizer", options_.optimizer},
                 {"model", model_json(options_)},
                 {"grad_accum", options_.grad_accum},
                 {"data_position", data_position},
                 {"batch", options_.batch},
                 {"seed", options_.seed}};
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
      writer_error_ = tag::kCheckpoint.prefix() + "the asynchronous save of step " +
                      std::to_string(snap.steps_done) + " failed: " + e.what();
    }
  });
}

// Every rank's files into the staging directory. With wait_for_ranks (asynchronous saves,
// which must not use the process group beside training), ranks other than 0 then leave a
// marker file and rank 0 waits for all of them before it may commit.
void TrainCheckpoints::write(const Snapshot& snap, int rank, int world, bool wait_for_ranks) {
  namespace ckpt = strategies::checkpoint;
  const fs::path staging = directory_->staging(snap.steps_done);
  if (!snap.weights.empty())
    save_checked(staging / ckpt::kModelFile, snap.weights, snap.model_metadata);
  ckpt::write_pieces(staging / ckpt::rank_file(rank), snap.pieces);
  if (rank == 0) {
    write_file_atomically(staging / ckpt::kMetaFile, snap.meta.dump(1) + "\n", tag::kCheckpoint);
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

// Rank 0, once every rank's files are written: the index over them, then the commit.
void TrainCheckpoints::commit(int64_t steps_done) {
  strategies::checkpoint::write_index(directory_->staging(steps_done), strategy_.world_size());
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
