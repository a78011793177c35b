#pragma once
// Options of the pipeline strategy (strategies/pipeline/pipeline_strategy.h; docs/parallelism.md).

#include <cstdint>
#include <string>
#include <vector>

namespace loom::strategies::pipeline {

struct PipelineOptions {
  int stages = 1;          // --pp: pipeline stages; the data-parallel size is world / stages
  int micro_batches = 1;   // --micro-batches: each data-parallel rank's batch split by rows
  std::string schedule = "1f1b";  // --pp-schedule: gpipe, 1f1b, interleaved_1f1b, zero_bubble (schedule.h)
  int chunks = 2;  // --pp-chunks: model chunks per stage under interleaved_1f1b
  // Layers per model chunk (stages x chunks of them, summing to the model's layer count);
  // empty: balanced by `balance_by`.
  std::vector<int64_t> balance;
  // "parameters" (each layer's parameter elements) or "time" (each layer's forward time in a
  // short profiling pass on a sample micro-batch: PipelineStrategy::set_profile_input).
  std::string balance_by = "parameters";
  // Within each stage's data-parallel group: "ddp" (every replica keeps the whole optimizer
  // state) or "deepspeed_stage_1" (ZeRO-1: each replica updates and keeps the state of 1/dp
  // of every parameter, then the replicas exchange the updated parts).
  std::string data_parallel = "ddp";
};

}  // namespace loom::strategies::pipeline
