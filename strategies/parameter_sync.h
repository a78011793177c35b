#pragma once
// The model check and parameter broadcast that data-parallel strategies (ddp, the sharded
// engine) run at setup, before any training step.

#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::strategies {

// Every rank must hold the same parameters (names, shapes, dtypes), then
// rank 0's values are broadcast to all. The check all-gathers a fingerprint per parameter
// and throws loom::Error naming the first parameter that differs and the rank it differs on.
void verify_same_parameters(const std::vector<std::pair<std::string, Tensor>>& named,
                            comm::ProcessGroup& group);
void broadcast_parameters(const std::vector<Tensor>& params, comm::ProcessGroup& group);

}  // namespace loom::strategies
