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
#include <map>
#include <optional>
#include <string>
#include <vector>

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

// This process's RANK as its launcher set it, for messages and file names made before or
// without a process group (the flight recorder's dump, a tool's last error line); empty when
// unset or not a whole number. Never throws. Everything else reads the launcher's variables
// through detect_cluster_env.
std::optional<int> launcher_rank(const GetEnv& getenv = process_env);

// The layout of `ranks` ranks all on this host, as a job started without a launcher has it
// (a LocalJob's, or a process group made directly).
ClusterEnv single_host_job(int ranks);

// The other half of the contract: what a launcher tells each rank it starts. loomrun,
// loom-perf --np and ddp_spawn all write these variables through rank_variables(), and
// detect_cluster_env (source "torchrun") and comm::init read them back:
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (node rank),
//   GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT and
//   LOOM_STORE_PORT (both the port the launcher's store listens on; an inherited
//   LOOM_STORE_PORT would send ranks elsewhere), LOOM_STORE_SECRET, LOOM_RESTART_COUNT and
//   TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, LOOM_CLUSTER_ENV=torchrun,
//   LOOM_JOB_ID (names the job's shared-memory segments, comm/shm/segment.h; empty when the
//   launcher does not remove them), LOOM_STORE_SERVED_BY_LAUNCHER=1 (so rank 0 does not
//   serve a second store).
//
// Note [Restart attempts share one store]: loomrun serves one store for its whole lifetime,
// so keys written by a failed attempt are still there when the group restarts. Process
// groups therefore prefix their keys with the restart count ("attempt<k>/...",
// k = LOOM_RESTART_COUNT), and ranks of different attempts never see each other's keys.
struct RankAssignment {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int store_port = 0;
  std::string store_secret = {};
  int restart_count = 0;
  int max_restarts = 0;
  std::string job_id = {};
};
std::map<std::string, std::string> rank_variables(const RankAssignment& rank);
// `base` (a NULL-terminated environ) with `variables` set, replacing inherited values:
// "NAME=value" entries for exec.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& variables,
                                          char** base);

// First host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace loom::comm
