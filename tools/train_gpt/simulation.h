#pragma once
// One simulated rank of a training job (docs/simulation.md): train_gpt's own loop (train())
// under a real strategy, on the meta device with a process group of the sim backend whose
// other ranks do not exist. Under the strategies whose ranks all do the same work (single
// device, DDP, ZeRO 1-3, FSDP with hybrid sharding, tensor parallelism) that rank is every
// rank: its peak memory by kind, its compute and its collectives' bytes per step are the
// job's per rank, and its step time on a described cluster is theirs. A pipeline's stages do
// different work: one rank per stage is simulated (each on its own thread, meeting the others
// in a sim::RankExchange), their data- and tensor-parallel peers implied. loom-sim prints them.

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/sim/sim_backend.h"
#include "nn/pretrained.h"
#include "sim/cluster.h"
#include "strategies/registry.h"
#include "strategies/strategy.h"
#include "strategies/trace.h"
#include "tensor/allocator.h"
#include "tensor/meta.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

struct SimulatedRank {
  int world_size = 1;
  int rank = 0;   // in the world
  int stage = 0;  // a pipeline's stage
  int64_t parameters = 0;
  // Peak bytes per MemoryKind over the steps (offloaded: in host memory, the rest on the
  // meta device), and their sum without offloaded: train_gpt's peak_bytes.
  std::array<int64_t, kMemoryKindCount> peak_bytes_by_kind{};
  int64_t peak_bytes = 0;
  // The last step's compute (the meta device's op costs) and collectives, in issue order.
  MetaCostTotals::Sum compute;
  std::vector<comm::CommCost> comm;
  // The last step's simulated time on `cluster` (sim/timeline.h), in seconds: the whole step,
  // the compute stream's busy time, its waits for communication (exposed), and the
  // communication streams' busy time.
  std::string cluster;
  // The cluster's device memory per rank (0: not given): a peak above it would not fit.
  int64_t device_memory_bytes = 0;
  bool fits_device_memory() const {
    return device_memory_bytes <= 0 || peak_bytes <= device_memory_bytes;
  }
  // A pipeline's stages also wait for their neighbours' activations and gradients (bubble_s).
  double step_s = 0, compute_s = 0, exposed_comm_s = 0, bubble_s = 0, comm_busy_s = 0;
  // The step's GEMM and attention FLOPs (recomputation under activation checkpointing
  // included, as Megatron-LM counts), and their rate over the device's dense peak for the
  // precision's compute dtype.
  double model_flops = 0, mfu = 0;
  // A pipeline's stages, in order; the fields above are then the job's: the slowest stage's
  // time, compute and operations, each kind's largest peak over the stages, model FLOPs per
  // rank averaged over the stages, and MFU over all of them.
  std::vector<SimulatedRank> stages;
  // With record_trace: each simulated rank's timeline of both steps, by world rank.
  std::vector<std::pair<int, std::shared_ptr<strategies::Trace>>> traces;

  // The last step's bytes of this rank's buffers by operation ("allreduce", "all_gather"...).
  std::map<std::string, int64_t> comm_bytes() const;
};

// Rank 0 of `world_size` simulated ranks (a pipeline: the first rank of each stage, under
// strategies made from `config`) training the model `spec` for two steps of
// `options.batch` sequences of options.model.context tokens under `strategy`, registered as
// `strategy_name` and created from `config` (not yet set up: its accelerator and process
// group are replaced). Data, checkpoints, evaluation
// and samples are not simulated: options' fields for them are ignored. Meshes (tensor
// parallelism, hybrid sharding) split their groups with ProcessGroup::split_by, which a sim
// group answers alone; a pipeline balanced by time times its layers on the cost model.
// Throws loom::Error for single_device on more than 1 rank and a pipeline whose --pp x --tp
// does not divide the world.
// Its time is `cluster`'s (sim/cluster.h); with `record_trace`, every op and operation of both
// steps is recorded in SimulatedRank::traces in simulated time.
SimulatedRank simulate_rank(const nn::ModelSpec& spec, const TrainOptions& options,
                            strategies::Strategy& strategy, const std::string& strategy_name,
                            const strategies::StrategyConfig& config, int world_size,
                            const sim::Cluster& cluster, bool record_trace = false);

// {"world_size", "cluster", "parameters", "peak_bytes", "peak_bytes_by_kind": {...},
// "flops_per_step", "bytes_per_step", "comm_bytes_per_step": {op: bytes}, "ms_per_step",
// "compute_ms", "exposed_comm_ms", "bubble_ms", "comm_busy_ms", "tflops_per_rank", "mfu"}, and
// for a pipeline "stages": [the same for each stage, with "stage" and "rank"].
std::string simulated_rank_json(const SimulatedRank& rank);

}  // namespace loom::train_gpt
