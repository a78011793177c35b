#pragma once
// The environment of one rank: loomrun's own environment plus the torchrun variables
// (overriding inherited ones):
//   RANK = node_rank * nproc_per_node + local_rank, LOCAL_RANK, WORLD_SIZE,
//   LOCAL_WORLD_SIZE, GROUP_RANK (node rank), GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE,
//   ROLE_NAME, MASTER_ADDR, MASTER_PORT (the port the store really listens on),
//   LOOM_STORE_SECRET, LOOM_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (0 on the first
//   attempt), TORCHELASTIC_MAX_RESTARTS, LOOM_CLUSTER_ENV=torchrun, LOOM_JOB_ID (names the
//   job's shared-memory segments, which loomrun removes after each attempt).
//
// Note [Restart attempts share one store]: loomrun serves one store for its whole
// lifetime, so keys written by a failed attempt are still there when the group restarts.
// Process groups therefore prefix their keys with the restart count ("attempt<k>/...",
// k = LOOM_RESTART_COUNT), and ranks of different attempts never see each other's keys.

#include <string>
#include <vector>

#include "tools/loomrun/options.h"

namespace loom::loomrun {

struct RankIdentity {
  int local_rank = 0;
  int master_port = 0;  // actual port (the store's, when loomrun picked it)
  int restart_count = 0;
  const std::string* secret = nullptr;
  const std::string* job_id = nullptr;
};

// "NAME=value" entries: `base` (a NULL-terminated environ) with the rank's variables set.
std::vector<std::string> rank_environment(const LaunchOptions& options, const RankIdentity& who,
                                          char** base);

}  // namespace loom::loomrun
