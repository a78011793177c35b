#pragma once
// Options of the pipeline strategy (strategies/pipeline/pipeline_strategy.h; docs/parallelism.md).

#include <cstdint>
#include <string>
#include <vector>

namespace loom::strategies::pipeline {

struct PipelineOptions {
  int stages = 1;          // --pp: pipeline stages; the data-parallel size is world / stages
  int micro_batches = 1;   // --micro-batches: each data-parallel rank's batch split by rows
  std::string schedule = "1f1b";  // --pp-schedule: gpipe, 1f1b, interleaved_1f1b (schedule.h)
  int chunks = 2;  // --pp-chunks: model chunks per stage under interleaved_1f1b
  // Layers per model chunk (stages x chunks of them, summing to the model's layer count);
  // empty: balanced by parameter count.
  std::vector<int64_t> balance;
};

}  // namespace loom::strategies::pipeline
