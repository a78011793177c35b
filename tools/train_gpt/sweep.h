#pragma once
// loom-sim --sweep (docs/simulation.md, "Sweep"): ranks the configurations of a model on a
// simulated cluster by predicted throughput within a memory limit. The candidates are the
// strategies the simulator runs (ddp, ZeRO 1-3, FSDP full and hybrid sharding, tensor
// parallelism of every power of two that divides the heads, the vocabulary and the world, and
// pipelines of every power of two of stages from 2 that divides the layers and the world, each
// with every such tp) x micro-batch sizes that divide the samples a data-parallel rank takes per
// step (--batch x --grad-accum, held fixed: the same global batch; a pipeline takes them as one
// batch of --micro-batches) x activation checkpointing off and on. Each candidate is
// simulate_rank() itself; those over the limit or failing are listed as rejected with the
// reason.

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "strategies/registry.h"
#include "tools/train_gpt/simulation.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

struct SweepCandidate {
  std::string strategy;
  int tp = 1;                   // model_parallel's and pipeline's --tp
  int pp = 1;                   // pipeline's --pp (data parallel over world / (pp x tp))
  bool hybrid_shard = false;    // fsdp's HYBRID_SHARD (sharded within a node of --devices)
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  bool checkpointing = false;
  // "model_parallel tp 4, micro-batch 4 x 2, checkpointing"; a pipeline's "x 2" is its
  // --micro-batches.
  std::string str() const;
};

struct SweepResult {
  SweepCandidate candidate;
  SimulatedRank rank;
  double tokens_per_s = 0;  // the whole job's: world / (pp x tp) replicas of the samples per step
};

struct SweepRejection {
  std::string what;  // a candidate's str(), or a family ("tensor parallelism (--tp)")
  std::string why;
};

struct Sweep {
  std::vector<SweepResult> ranked;  // fastest first
  std::vector<SweepRejection> rejected;
  double memory_limit_bytes = 0;
};

// Sweeps `options`' model on `world_size` ranks of `cluster` with `config`'s flags (each
// candidate strategy adds its registry defaults), within `memory_limit_bytes` of device memory
// per rank (0: the cluster's device memory).
Sweep sweep(const TrainOptions& options, const strategies::StrategyConfig& config, int world_size,
            const sim::Cluster& cluster, double memory_limit_bytes = 0);

std::string sweep_text(const Sweep& sweep);
std::string sweep_json(const Sweep& sweep);

}  // namespace loom::train_gpt
