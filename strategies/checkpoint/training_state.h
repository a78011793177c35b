#pragma once
// The pieces of a resumable checkpoint that every trainer shares (train_gpt's
// tools/train_gpt/train_state.h, Fabric::save/load of a State): the optimizer's state with
// the loss scaler's, and where each rank keeps it. A replicating strategy's optimizer state
// is the same on every rank (rank 0 writes "optimizer.safetensors"); a sharded strategy's is
// each rank's shard ("optimizer.rank-00001.safetensors"), which resumes under the same
// strategy and world size only (resharding is not built).

#include <map>
#include <string>

#include "optim/optimizer.h"
#include "strategies/strategy.h"
#include "tensor/safetensors.h"

namespace loom::strategies::checkpoint {

// True when `strategy` keeps a different part of the optimizer state on every rank.
bool shards_optimizer_state(const Strategy& strategy);
// The file this rank's optimizer state goes to (only rank 0 writes when not sharded).
std::string optimizer_file(const Strategy& strategy);

// Host copies of the optimizer's state (Strategy::optimizer_state) plus the loss scaler ("scaler.scale",
// "scaler.clean_steps", "scaler.skipped") when the strategy has one.
std::map<std::string, Tensor> optimizer_snapshot(const optim::Optimizer& optimizer,
                                                 Strategy& strategy);
// Loads what optimizer_snapshot() wrote (keys starting "train." are the caller's and are
// skipped). Throws loom::Error naming `origin` when the loss scaler is in one and not the
// other.
void restore_optimizer(const std::map<std::string, Tensor>& snapshot, optim::Optimizer& optimizer,
                       Strategy& strategy, const std::string& origin);

}  // namespace loom::strategies::checkpoint
