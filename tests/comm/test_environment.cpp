// detect_cluster_env over fake environments (a map, never the real one): every source, the
// precedence between them, explicit selection, each error message, and Slurm node lists.
// Then the LOOM_* variables read elsewhere in comm (LOOM_STORE_PORT, LOOM_SHM_*_BYTES,
// LOOM_DEBUG, LOOM_FLIGHT_RECORDER), from the real environment: the last three are read once
// per process, so each value is tried in a forked child (this process creates no group).

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include "comm/environment.h"
#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "core/error.h"

namespace loom::comm {
namespace {

using Vars = std::map<std::string, std::string>;

GetEnv env_of(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto found = vars.find(name);
    if (found == vars.end()) return std::nullopt;
    return found->second;
  };
}

ClusterEnv detect(const Vars& vars, std::optional<std::string> force = std::nullopt) {
  return detect_cluster_env(env_of(vars), std::move(force));
}

// Expects detection to throw loom::Error whose message contains every one of `parts`.
void expect_error(const Vars& vars, std::initializer_list<std::string> parts,
                  std::optional<std::string> force = std::nullopt) {
  try {
    ClusterEnv env = detect(vars, force);
    ADD_FAILURE() << "expected loom::Error, got source " << env.source << " rank " << env.rank;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[comm/env]"), std::string::npos) << what;
    for (const auto& part : parts) {
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
    }
  }
}

TEST(ClusterEnv, SingleWhenNothingIsSet) {
  ClusterEnv env = detect({});
  EXPECT_EQ(env.source, "single");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.store_secret, "");
  EXPECT_EQ(env.restart_count, 0);
  EXPECT_FALSE(env.multi_host());
}

// RANK for messages before any group: a whole number or nothing, never an exception.
TEST(ClusterEnv, LauncherRankIsAWholeNumberOrNothing) {
  EXPECT_EQ(launcher_rank(env_of({})), std::nullopt);
  EXPECT_EQ(launcher_rank(env_of({{"RANK", "3"}})), 3);
  EXPECT_EQ(launcher_rank(env_of({{"RANK", ""}})), std::nullopt);
  EXPECT_EQ(launcher_rank(env_of({{"RANK", "3x"}})), std::nullopt);
  EXPECT_EQ(launcher_rank(env_of({{"RANK", "99999999999"}})), std::nullopt);
}

// The layout of ranks started on this host without a launcher.
TEST(ClusterEnv, SingleHostJob) {
  const ClusterEnv job = single_host_job(3);
  EXPECT_EQ(job.source, "single");
  EXPECT_EQ(job.world_size, 3);
  EXPECT_EQ(job.local_world_size, 3);
  EXPECT_FALSE(job.multi_host());
}

TEST(ClusterEnv, Torchrun) {
  ClusterEnv env = detect({{"RANK", "5"},
                           {"WORLD_SIZE", "8"},
                           {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"GROUP_RANK", "1"},
                           {"MASTER_ADDR", "10.0.0.7"},
                           {"MASTER_PORT", "1234"},
                           {"LOOM_STORE_SECRET", "abc"},
                           {"LOOM_RESTART_COUNT", "2"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.store_secret, "abc");
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_TRUE(env.multi_host());
}

TEST(ClusterEnv, TorchrunDefaults) {
  // LOCAL_WORLD_SIZE defaults to WORLD_SIZE; LOCAL_RANK to RANK; master to 127.0.0.1:29500.
  ClusterEnv env = detect({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.multi_host());
  // Multi-host defaults: local rank and node from the rank.
  ClusterEnv multi =
      detect({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}});
  EXPECT_EQ(multi.local_rank, 2);
  EXPECT_EQ(multi.node_rank, 1);
}

TEST(ClusterEnv, RestartCountFallsBackToTorchelastic) {
  EXPECT_EQ(detect({{"TORCHELASTIC_RESTART_COUNT", "3"}}).restart_count, 3);
  EXPECT_EQ(
      detect({{"TORCHELASTIC_RESTART_COUNT", "3"}, {"LOOM_RESTART_COUNT", "1"}}).restart_count, 1);
  expect_error({{"LOOM_RESTART_COUNT", "x"}}, {"LOOM_RESTART_COUNT='x' is not an integer"});
}

TEST(ClusterEnv, Slurm) {
  ClusterEnv env = detect({{"SLURM_PROCID", "5"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_NODEID", "1"},
                           {"SLURM_TASKS_PER_NODE", "4(x2)"},
                           {"SLURM_JOB_NODELIST", "gpu[007-008]"}});
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "gpu007");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.multi_host());
}

TEST(ClusterEnv, SlurmUnevenTasksPerNodeAndNodelistFallback) {
  ClusterEnv env = detect({{"SLURM_PROCID", "6"},
                           {"SLURM_NTASKS", "7"},
                           {"SLURM_LOCALID", "0"},
                           {"SLURM_NODEID", "3"},
                           {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                           {"SLURM_NODELIST", "a,b,c,d"},
                           {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "a");
  EXPECT_EQ(env.master_port, 4000);
  expect_error({{"SLURM_PROCID", "0"},
                {"SLURM_NTASKS", "2"},
                {"SLURM_NODEID", "5"},
                {"SLURM_TASKS_PER_NODE", "1(x2)"},
                {"SLURM_NODELIST", "a,b"}},
               {"SLURM_TASKS_PER_NODE"});
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(y2)"}},
               {"SLURM_TASKS_PER_NODE='2(y2)'"});
}

TEST(ClusterEnv, SlurmSingleNodeNeedsNoNodelist) {
  ClusterEnv env = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}},
               {"MASTER_ADDR", "SLURM_JOB_NODELIST", "several hosts"});
}

TEST(ClusterEnv, MasterAddrOverridesTheSchedulersMaster) {
  ClusterEnv env = detect({{"SLURM_PROCID", "0"},
                           {"SLURM_NTASKS", "1"},
                           {"SLURM_JOB_NODELIST", "node[1-4]"},
                           {"MASTER_ADDR", "override.example"}});
  EXPECT_EQ(env.master_addr, "override.example");
}

TEST(ClusterEnv, OpenMPI) {
  ClusterEnv env = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  ClusterEnv multi = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                             {"MASTER_ADDR", "head"},
                             {"MASTER_PORT", "999"}});
  EXPECT_EQ(multi.master_addr, "head");
  EXPECT_EQ(multi.master_port, 999);
  EXPECT_EQ(multi.local_rank, 1);
  EXPECT_EQ(multi.node_rank, 1);
  expect_error({{"OMPI_COMM_WORLD_RANK", "3"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
               {"MASTER_ADDR", "several hosts"});
  expect_error({{"OMPI_COMM_WORLD_RANK", "3"}}, {"OMPI_COMM_WORLD_SIZE is not set"});
}

TEST(ClusterEnv, Pmi) {
  ClusterEnv env = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(env.source, "pmi");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  ClusterEnv local = detect({{"PMI_RANK", "3"},
                             {"PMI_SIZE", "4"},
                             {"MPI_LOCALRANKID", "1"},
                             {"MPI_LOCALNRANKS", "2"},
                             {"MASTER_ADDR", "h"}});
  EXPECT_EQ(local.local_rank, 1);
  EXPECT_EQ(local.local_world_size, 2);
  expect_error({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "2"}}, {"MASTER_ADDR"});
  expect_error({{"PMI_RANK", "0"}}, {"PMI_SIZE is not set"});
}

TEST(ClusterEnv, Precedence) {
  const Vars all{{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"SLURM_PROCID", "2"},
                 {"SLURM_NTASKS", "3"},
                 {"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"PMI_RANK", "4"},
                 {"PMI_SIZE", "5"}};
  EXPECT_EQ(detect(all).source, "torchrun");
  Vars rest = all;
  rest.erase("WORLD_SIZE");  // RANK alone is not torchrun
  EXPECT_EQ(detect(rest).source, "slurm");
  EXPECT_EQ(detect(rest).rank, 2);
  rest.erase("SLURM_NTASKS");
  EXPECT_EQ(detect(rest).source, "openmpi");
  rest.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(detect(rest).source, "pmi");
  rest.erase("PMI_RANK");
  rest.erase("RANK");
  EXPECT_EQ(detect(rest).source, "single");
}

// RANK without WORLD_SIZE (or the reverse) where no other launcher is found is a launcher
// set up by half: an error naming both, not a silent run as one process.
TEST(ClusterEnv, RankWithoutWorldSizeIsAnError) {
  expect_error({{"RANK", "1"}}, {"RANK='1' is set but WORLD_SIZE is not", "unset RANK"});
  expect_error({{"WORLD_SIZE", "2"}}, {"WORLD_SIZE='2' is set but RANK is not"});
  EXPECT_EQ(detect({{"RANK", "1"}}, "single").source, "single");  // forced: no question
  EXPECT_EQ(detect({{"RANK", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).source, "slurm");
}

TEST(ClusterEnv, ExplicitSelection) {
  const Vars all{{"RANK", "1"},         {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "2"},
                 {"SLURM_NTASKS", "3"}, {"PMI_RANK", "0"},   {"PMI_SIZE", "1"}};
  Vars chosen = all;
  chosen["LOOM_CLUSTER_ENV"] = "slurm";
  EXPECT_EQ(detect(chosen).source, "slurm");
  EXPECT_EQ(detect(chosen).rank, 2);
  chosen["LOOM_CLUSTER_ENV"] = "single";
  EXPECT_EQ(detect(chosen).world_size, 1);
  chosen["LOOM_CLUSTER_ENV"] = "auto";
  EXPECT_EQ(detect(chosen).source, "torchrun");
  // The `force` argument wins over LOOM_CLUSTER_ENV.
  chosen["LOOM_CLUSTER_ENV"] = "slurm";
  EXPECT_EQ(detect(chosen, "pmi").source, "pmi");
  EXPECT_EQ(detect(all, "torchrun").rank, 1);
}

TEST(ClusterEnv, UnknownSourceListsTheValidNames) {
  expect_error({{"LOOM_CLUSTER_ENV", "kubernetes"}},
               {"LOOM_CLUSTER_ENV='kubernetes'", "torchrun", "slurm", "openmpi", "pmi", "single"});
  expect_error({}, {"'mpich'", "torchrun, slurm, openmpi, pmi, single"}, "mpich");
}

TEST(ClusterEnv, ForcedSourceNamesItsMissingVariable) {
  expect_error({{"LOOM_CLUSTER_ENV", "torchrun"}}, {"RANK is not set", "LOOM_CLUSTER_ENV"});
  expect_error({{"RANK", "0"}}, {"WORLD_SIZE is not set"}, "torchrun");
  expect_error({{"SLURM_PROCID", "0"}}, {"SLURM_NTASKS is not set"}, "slurm");
  expect_error({}, {"OMPI_COMM_WORLD_RANK is not set"}, "openmpi");
  expect_error({}, {"PMI_RANK is not set"}, "pmi");
}

TEST(ClusterEnv, NonIntegerValues) {
  expect_error({{"RANK", "x"}, {"WORLD_SIZE", "4"}}, {"RANK='x' is not an integer"});
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "4.0"}}, {"WORLD_SIZE='4.0' is not an integer"});
  expect_error({{"RANK", ""}, {"WORLD_SIZE", "4"}}, {"RANK='' is not an integer"});
  expect_error({{"RANK", "99999999999"}, {"WORLD_SIZE", "4"}}, {"RANK='99999999999'"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", " 1"}}, {"LOCAL_RANK=' 1'"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}},
               {"MASTER_PORT='http' is not an integer"});
  expect_error({{"SLURM_PROCID", "a"}, {"SLURM_NTASKS", "4"}}, {"SLURM_PROCID='a'"});
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "two"}},
               {"OMPI_COMM_WORLD_SIZE='two'"});
}

TEST(ClusterEnv, NegativeValues) {
  expect_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, {"RANK=-1 is negative"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "-2"}}, {"LOCAL_RANK=-2"});
  expect_error({{"PMI_RANK", "-3"}, {"PMI_SIZE", "4"}}, {"PMI_RANK=-3"});
}

TEST(ClusterEnv, InconsistentSizes) {
  expect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}, {"RANK=4 is not below WORLD_SIZE=4"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0 is not positive"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "0"}},
               {"LOCAL_WORLD_SIZE=0 is not positive"});
  expect_error({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "3"}},
               {"SLURM_PROCID=3 is not below SLURM_NTASKS=3"});
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}},
               {"SLURM_LOCALID=2 is not below SLURM_NTASKS=2"});
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"},
                {"OMPI_COMM_WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                {"MASTER_ADDR", "h"}},
               {"OMPI_COMM_WORLD_LOCAL_RANK=1 is not below OMPI_COMM_WORLD_LOCAL_SIZE=1"});
}

TEST(ClusterEnv, MultiHostTorchrunNeedsMasterAddr) {
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"MASTER_ADDR", "WORLD_SIZE=8", "LOCAL_WORLD_SIZE=4"});
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", ""}}, {"MASTER_ADDR"});
}

TEST(ClusterEnv, MasterPortRange) {
  expect_error({{"MASTER_PORT", "70000"}}, {"MASTER_PORT=70000", "1-65535"});
  expect_error({{"MASTER_PORT", "0"}}, {"MASTER_PORT=0"});
  EXPECT_EQ(detect({{"MASTER_PORT", "65535"}}).master_port, 65535);
}

TEST(ClusterEnv, ProcessEnvReadsTheRealEnvironment) {
  EXPECT_FALSE(process_env("LOOM_TEST_SURELY_UNSET_VARIABLE_1234").has_value());
  EXPECT_TRUE(process_env("PATH").has_value());
}

TEST(SlurmNodelist, FirstHost) {
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("host"), "host");
  EXPECT_EQ(first_slurm_host("node[9,03-05]"), "node9");
  EXPECT_EQ(first_slurm_host("node[001-128]"), "node001");
  EXPECT_EQ(first_slurm_host("gpu-[10-12]-ib"), "gpu-10-ib");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[07-08]"), "rack2-n07");
  EXPECT_EQ(first_slurm_host("  node1.cluster.org,node2"), "node1.cluster.org");
  EXPECT_EQ(first_slurm_host("x[5]"), "x5");
}

TEST(SlurmNodelist, MalformedListsAreErrors) {
  for (const char* bad : {"", "   ", "node[1-3", "node]1", "node[]", "node[a-b]", ",a"}) {
    try {
      first_slurm_host(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Slurm node list"), std::string::npos) << e.what();
    }
  }
}

// Runs `body` in a forked child with `name`=`value` set; returns the message of the
// loom::Error it threw, or "accepted".
std::string outcome_in_child(const std::string& name, const std::string& value,
                             const std::function<void()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::setenv(name.c_str(), value.c_str(), 1);
    std::string outcome = "accepted";
    try {
      body();
    } catch (const Error& e) {
      outcome = e.what();
    }
    (void)!::write(fds[1], outcome.data(), outcome.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string outcome;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;)
    outcome.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return outcome;
}

// A one-rank shm group: enough to read every setting a group reads.
void create_one_rank_group() {
  ProcessGroup group(0, 1, std::make_shared<InProcessStore>(), {.backend = "shm"});
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CommVariables, ShmSizesAreDigitsFromOneByteToOneGiB) {
  for (const char* name :
       {"LOOM_SHM_SLICE_BYTES", "LOOM_SHM_ONE_SHOT_BYTES", "LOOM_SHM_CHANNEL_BYTES"}) {
    for (const char* bad : {"abc", "-1", "+5", " 5", "5 ", "1e3", "64K", "0x40"}) {
      const std::string what = outcome_in_child(name, bad, create_one_rank_group);
      EXPECT_TRUE(has(what, std::string(name) + "='" + bad + "' is not a number of bytes")) << what;
      EXPECT_TRUE(has(what, "from 1 to 1073741824 (1 GiB)")) << what;
    }
    // 2^64 - 1 and past it (strtoull saturates there), past 1 GiB, and 0.
    for (const char* big :
         {"18446744073709551615", "99999999999999999999", "1099511627776000", "1073741825", "0"}) {
      const std::string what = outcome_in_child(name, big, create_one_rank_group);
      EXPECT_TRUE(has(what, std::string(name) + "=" + big + " is out of range")) << what;
      EXPECT_TRUE(has(what, "expected 1 to 1073741824 bytes")) << what;
    }
    for (const char* good : {"1", "4096", "1073741824"}) {
      EXPECT_EQ(outcome_in_child(name, good, create_one_rank_group), "accepted") << good;
    }
  }
}

TEST(CommVariables, LoomDebugTakesDetailOnly) {
  for (const char* bad : {"verbose", "DETAIL", "1", "info"}) {
    const std::string what = outcome_in_child("LOOM_DEBUG", bad, create_one_rank_group);
    EXPECT_TRUE(has(what, std::string("LOOM_DEBUG='") + bad + "' is not a known setting")) << what;
    EXPECT_TRUE(has(what, "expected 'detail'")) << what;
  }
  EXPECT_EQ(outcome_in_child("LOOM_DEBUG", "detail", create_one_rank_group), "accepted");
  EXPECT_EQ(outcome_in_child("LOOM_DEBUG", "", create_one_rank_group), "accepted");
}

TEST(CommVariables, FlightRecorderTakesZeroOrOne) {
  for (const char* bad : {"abc", "2", "off", "true"}) {
    const std::string what = outcome_in_child("LOOM_FLIGHT_RECORDER", bad, create_one_rank_group);
    EXPECT_TRUE(has(what, std::string("LOOM_FLIGHT_RECORDER='") + bad + "' is not a known setting"))
        << what;
    EXPECT_TRUE(has(what, "expected 1 (record, the default) or 0 (off)")) << what;
  }
  for (const char* good : {"0", "1", ""}) {
    EXPECT_EQ(outcome_in_child("LOOM_FLIGHT_RECORDER", good, create_one_rank_group), "accepted")
        << good;
  }
}

TEST(CommVariables, CommTimingTakesZeroOrOne) {
  for (const char* bad : {"yes", "2", "precise", "true"}) {
    const std::string what = outcome_in_child("LOOM_COMM_TIMING", bad, create_one_rank_group);
    EXPECT_TRUE(has(what, std::string("LOOM_COMM_TIMING='") + bad + "' is not a known setting"))
        << what;
    EXPECT_TRUE(has(what, "expected 1 (the precise clock) or 0 (the coarse one, the default)"))
        << what;
  }
  for (const char* good : {"0", "1", ""}) {
    EXPECT_EQ(outcome_in_child("LOOM_COMM_TIMING", good, create_one_rank_group), "accepted")
        << good;
  }
}

TEST(CommVariables, StorePortIsOneTo65535) {
  ClusterEnv env;
  env.world_size = 2;
  env.local_world_size = 2;
  env.store_secret = "s3cret";
  // Rank 1 connects to the store: the port is read before it tries.
  auto join_as_rank_1 = [&] {
    init({.timeout = std::chrono::seconds(1), .rank = 1, .environment = env});
  };
  for (const char* bad : {"abc", "99999", "65536", "-1", "0", " 80", "80x"}) {
    const std::string what = outcome_in_child("LOOM_STORE_PORT", bad, join_as_rank_1);
    EXPECT_TRUE(has(what, std::string("LOOM_STORE_PORT='") + bad + "' is not a TCP port")) << what;
    EXPECT_TRUE(has(what, "expected a number from 1 to 65535")) << what;
  }
}

}  // namespace
}  // namespace loom::comm
