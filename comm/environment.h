#pragma once
// Where this process sits in the job, read from the launcher's or scheduler's variables.
// Precedence (first match wins), unless LOOM_CLUSTER_ENV (or the `force` argument, which wins
// over it) names one source explicitly ("auto" or empty: detect):
//   "torchrun": chosen when RANK and WORLD_SIZE are set. LOCAL_RANK, LOCAL_WORLD_SIZE,
//               GROUP_RANK, MASTER_ADDR, MASTER_PORT (loomrun sets these, plus
//               LOOM_STORE_SECRET)
//   "slurm":    chosen when SLURM_PROCID and SLURM_NTASKS are set. SLURM_LOCALID,
//               SLURM_NODEID; local world size from SLURM_TASKS_PER_NODE ("4(x2),3", the
//               entry of node SLURM_NODEID) or SLURM_NTASKS_PER_NODE; master = first host of
//               SLURM_JOB_NODELIST (or SLURM_NODELIST), port MASTER_PORT or 29500
//   "openmpi":  chosen when OMPI_COMM_WORLD_RANK is set. OMPI_COMM_WORLD_SIZE, _LOCAL_RANK,
//               _LOCAL_SIZE
//   "pmi":      chosen when PMI_RANK is set. PMI_SIZE (MPICH, Intel MPI); MPI_LOCALRANKID and
//               MPI_LOCALNRANKS (Hydra) for the local rank and size
//   "single":   none of the above: rank 0 of 1
// Defaults for what a source leaves unset: local world size = world size, local rank =
// rank % local world size, node rank = rank / local world size, master port 29500, master
// 127.0.0.1 when the world is on one host.
// MASTER_ADDR/MASTER_PORT, when set, override the master a scheduler source derives.
// restart_count comes from LOOM_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT, else 0.
// Inconsistent values are loom::Error naming the variable (rank >= world size, a
// non-number, a negative number, local rank >= local world size, a multi-host world without
// a master address, a forced source whose variables are missing, an unknown source name).
// Reads nothing but `getenv`, so tests pass a lambda over a map.

#include <functional>
#include <optional>
#include <string>

namespace loom::comm {

struct ClusterEnv {
  std::string source;  // "torchrun", "slurm", "openmpi", "pmi", "single"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string store_secret;  // LOOM_STORE_SECRET, may be empty
  int restart_count = 0;     // LOOM_RESTART_COUNT (TORCHELASTIC_RESTART_COUNT) set by loomrun
  bool multi_host() const { return world_size > local_world_size; }
};

using GetEnv = std::function<std::optional<std::string>(const std::string&)>;
// The process environment (std::getenv).
std::optional<std::string> process_env(const std::string& name);

ClusterEnv detect_cluster_env(const GetEnv& getenv = process_env,
                              std::optional<std::string> force = std::nullopt);

// First host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace loom::comm
