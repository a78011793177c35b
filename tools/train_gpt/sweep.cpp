#include "tools/train_gpt/sweep.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/tags.h"

namespace loom::train_gpt {

std::string SweepCandidate::str() const {
  return strategy + (pp > 1 ? " pp " + std::to_string(pp) : "") +
         (tp > 1 ? " tp " + std::to_string(tp) : "") +
         (hybrid_shard ? " HYBRID_SHARD" : "") + ", micro-batch " + std::to_string(micro_batch) +
         " x " + std::to_string(grad_accum) + (checkpointing ? ", checkpointing" : "");
}

namespace {

// The strategies whose ranks the simulator runs (tools/train_gpt/simulation.cpp), and their
// variants: tensor-parallel sizes, hybrid sharding.
std::vector<SweepCandidate> families(const TrainOptions& o, int world_size) {
  std::vector<SweepCandidate> out;
  for (const char* s : {"ddp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3", "fsdp"})
    out.push_back({.strategy = s});
  out.push_back({.strategy = "fsdp", .hybrid_shard = true});
  std::vector<int> tps;  // the tensor-parallel sizes the model and the world allow
  for (int tp = 2; tp <= world_size; tp *= 2) {
    if (world_size % tp == 0 && o.model.heads % tp == 0 && o.model.vocab_size % tp == 0)
      tps.push_back(tp);
  }
  for (int tp : tps) out.push_back({.strategy = "model_parallel", .tp = tp});
  for (int pp = 2; pp <= world_size && pp <= o.model.layers; pp *= 2) {
    if (world_size % pp != 0 || o.model.layers % pp != 0) continue;
    out.push_back({.strategy = "pipeline", .pp = pp});
    for (int tp : tps) {
      if (world_size % (pp * tp) == 0) out.push_back({.strategy = "pipeline", .tp = tp, .pp = pp});
    }
  }
  return out;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

Sweep sweep(const TrainOptions& options, const strategies::StrategyConfig& config, int world_size,
            const sim::Cluster& cluster, double memory_limit_bytes) {
  Sweep out;
  out.memory_limit_bytes = memory_limit_bytes > 0 ? memory_limit_bytes : cluster.device.memory_bytes;
  const int64_t samples = options.batch * std::max<int64_t>(options.grad_accum, 1);
  for (const SweepCandidate& family : families(options, world_size)) {
    for (int64_t micro = 1; micro <= samples; micro *= 2) {
      if (samples % micro != 0) continue;
      for (const bool checkpointing : {false, true}) {
        SweepCandidate c = family;
        c.micro_batch = micro;
        c.grad_accum = samples / micro;
        c.checkpointing = checkpointing;
        TrainOptions o = options;
        o.batch = c.micro_batch;
        o.grad_accum = c.grad_accum;
        o.model.checkpoint_activations = checkpointing;
        strategies::StrategyConfig with = config;
        with.tensor_parallel.size = c.tp;
        if (c.pp > 1) {  // one batch of the samples, in micro-batches
          with.pipeline.stages = c.pp;
          with.pipeline.micro_batches = static_cast<int>(c.grad_accum);
          o.batch = samples;
          o.grad_accum = 1;
        }
        if (c.hybrid_shard) with.fsdp_sharding_strategy = "HYBRID_SHARD";
        try {
          std::unique_ptr<strategies::Strategy> s =
              strategies::StrategyRegistry::create(c.strategy, with);
          SimulatedRank rank =
              simulate_rank(model_spec(o), o, *s, c.strategy, with, world_size, cluster);
          if (static_cast<double>(rank.peak_bytes) > out.memory_limit_bytes) {
            out.rejected.push_back({c.str(), "peak " + gib(static_cast<double>(rank.peak_bytes)) +
                                                 " per rank, over the limit of " +
                                                 gib(out.memory_limit_bytes)});
            continue;
          }
          // Each data-parallel replica (pp x tp ranks) takes `samples` sequences per step.
          const double tokens = static_cast<double>(world_size / (c.pp * c.tp)) *
                                static_cast<double>(samples) * static_cast<double>(o.model.context);
          const double tokens_per_s = rank.step_s > 0 ? tokens / rank.step_s : 0;
          out.ranked.push_back({c, std::move(rank), tokens_per_s});
        } catch (const Error& e) {
          out.rejected.push_back({c.str(), e.what()});
        }
      }
    }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const SweepResult& a, const SweepResult& b) {
                     return a.tokens_per_s > b.tokens_per_s;
                   });
  return out;
}

std::string sweep_text(const Sweep& s) {
  std::string text;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-62s %10s %14s %7s %12s\n", "rank", "configuration",
                "ms/step", "tokens/s", "MFU", "peak");
  text += line;
  for (size_t i = 0; i < s.ranked.size(); ++i) {
    const SweepResult& r = s.ranked[i];
    std::snprintf(line, sizeof line, "%-4zu %-62s %10.3f %14.0f %6.1f%% %12s\n", i + 1,
                  r.candidate.str().c_str(), r.rank.step_s * 1e3, r.tokens_per_s,
                  100 * r.rank.mfu, gib(static_cast<double>(r.rank.peak_bytes)).c_str());
    text += line;
  }
  text += "rejected (" + std::to_string(s.rejected.size()) + "):\n";
  for (const SweepRejection& r : s.rejected) text += "  " + r.what + ": " + r.why + "\n";
  return text;
}

std::string sweep_json(const Sweep& s) {
  nlohmann::json ranked = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const SweepResult& r : s.ranked) {
    ranked.push_back({{"strategy", r.candidate.strategy},
                      {"tp", r.candidate.tp},
                      {"pp", r.candidate.pp},
                      {"hybrid_shard", r.candidate.hybrid_shard},
                      {"micro_batch", r.candidate.micro_batch},
                      {"grad_accum", r.candidate.grad_accum},
                      {"activation_checkpointing", r.candidate.checkpointing},
                      {"ms_per_step", r.rank.step_s * 1e3},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.rank.mfu},
                      {"peak_bytes", r.rank.peak_bytes}});
  }
  for (const SweepRejection& r : s.rejected) rejected.push_back({{"what", r.what}, {"why", r.why}});
  return nlohmann::json{{"memory_limit_bytes", s.memory_limit_bytes},
                        {"ranked", ranked},
                        {"rejected", rejected}}
      .dump();
}

}  // namespace loom::train_gpt
