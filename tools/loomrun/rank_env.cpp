#include "tools/loomrun/rank_env.h"

#include <map>

#include "core/tunables.h"

namespace loom::loomrun {

std::vector<std::string> rank_environment(const LaunchOptions& options, const RankIdentity& who,
                                          char** base) {
  int rank = options.node_rank * options.nproc_per_node + who.local_rank;
  const std::map<std::string, std::string> ours = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(who.local_rank)},
      {"WORLD_SIZE", std::to_string(options.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(options.world_size())},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(who.master_port)},
      // Ranks prefer LOOM_STORE_PORT to MASTER_PORT (comm/init.cpp); an inherited value would
      // send them to some other port, to wait there for a store until their timeout.
      {tunables::kStorePort.name, std::to_string(who.master_port)},
      {tunables::kStoreSecret.name, who.secret != nullptr ? *who.secret : std::string()},
      {tunables::kRestartCount.name, std::to_string(who.restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(who.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {tunables::kClusterEnv.name, "torchrun"},
      {tunables::kJobId.name, who.job_id != nullptr ? *who.job_id : std::string()},
      // The store is served by loomrun itself (node 0), so rank 0 must not serve one too.
      {tunables::kStoreServedByLauncher.name, "1"},
  };
  std::vector<std::string> env;
  for (char** entry = base; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    std::string name = text.substr(0, text.find('='));
    if (ours.count(name) == 0) env.push_back(std::move(text));
  }
  for (const auto& [name, value] : ours)
    env.push_back(name + "=" + value);
  return env;
}

}  // namespace loom::loomrun
