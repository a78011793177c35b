// loomrun end to end: runs the real binary with loomrun_probe as its ranks and checks exit
// codes, relayed output and loomrun's messages. Every run has a deadline; a run that
// outlives it is killed and fails the test.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef LOOMRUN_PATH
#error "LOOMRUN_PATH must name the loomrun binary"
#endif
#ifndef LOOMRUN_PROBE_PATH
#error "LOOMRUN_PROBE_PATH must name the loomrun_probe binary"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kLoomrun = LOOMRUN_PATH;
const std::string kProbe = LOOMRUN_PROBE_PATH;

struct Result {
  int status = 0;  // raw waitpid status
  std::string out, err;
  double seconds = 0;
  bool exited() const { return WIFEXITED(status); }
  int code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// One loomrun process with its stdout and stderr captured.
class Loomrun {
 public:
  // env: NAME -> value (nullopt: unset). LOOM_STORE_SECRET is unset unless given.
  explicit Loomrun(const std::vector<std::string>& args,
                   std::map<std::string, std::optional<std::string>> env = {}) {
    env.try_emplace("LOOM_STORE_SECRET", std::nullopt);
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) std::abort();
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      close(out[0]);
      close(err[0]);
      close(out[1]);
      close(err[1]);
      for (const auto& [name, value] : env) {
        if (value) {
          setenv(name.c_str(), value->c_str(), 1);
        } else {
          unsetenv(name.c_str());
        }
      }
      std::vector<char*> argv{const_cast<char*>(kLoomrun.c_str())};
      for (const std::string& arg : args)
        argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(126);
    }
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }

  ~Loomrun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  // Reads output until `done(out)` holds or `timeout` passes; returns whether it held.
  template <typename Pred>
  bool read_until(Pred done, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!done(result_.out)) {
      if (Clock::now() >= deadline || (fds_[0] < 0 && fds_[1] < 0)) return false;
      read_some(deadline);
    }
    return true;
  }

  void signal(int signo) { kill(pid_, signo); }

  // Reads everything and reaps loomrun; kills it and fails the test after `timeout`.
  Result finish(std::chrono::milliseconds timeout = 15s) {
    auto deadline = Clock::now() + timeout;
    while ((fds_[0] >= 0 || fds_[1] >= 0) && Clock::now() < deadline)
      read_some(deadline);
    while (Clock::now() < deadline) {
      if (waitpid(pid_, &result_.status, WNOHANG) == pid_) {
        reaped_ = true;
        break;
      }
      usleep(5000);
    }
    if (!reaped_) {
      ADD_FAILURE() << "loomrun did not finish within " << timeout.count() << " ms; killed it\n"
                    << "stdout:\n"
                    << result_.out << "stderr:\n"
                    << result_.err;
      kill(pid_, SIGKILL);
      waitpid(pid_, &result_.status, 0);
      reaped_ = true;
    }
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return result_;
  }

 private:
  void read_some(Clock::time_point deadline) {
    pollfd fds[2] = {{fds_[0], POLLIN, 0}, {fds_[1], POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    int ready = poll(fds, 2, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready <= 0) return;
    for (int i = 0; i < 2; ++i) {
      if (fds_[i] < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = read(fds_[i], buffer, sizeof(buffer));
      if (n > 0) {
        (i == 0 ? result_.out : result_.err).append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds_[i]);
        fds_[i] = -1;
      }
    }
  }

  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  bool reaped_ = false;
  Clock::time_point start_;
  Result result_;
};

Result run(const std::vector<std::string>& args,
           std::map<std::string, std::optional<std::string>> env = {}) {
  return Loomrun(args, std::move(env)).finish();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

// The value of "<prefix>NAME=value" in the relayed output.
std::string value_of(const std::string& out, const std::string& prefix, const std::string& name) {
  std::istringstream lines(out);
  std::string line;
  std::string key = prefix + name + "=";
  while (std::getline(lines, line)) {
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return "<missing>";
}

// "[3] ", the prefix loomrun puts on rank 3's lines. (Appended piecewise: GCC 12 warns
// falsely (-Wrestrict) about "literal" + std::to_string(...).)
std::string rank_prefix(int rank) {
  std::string prefix = "[";
  prefix += std::to_string(rank);
  prefix += "] ";
  return prefix;
}

std::string dump(const Result& r) {
  return "exit status " + std::to_string(r.status) + "\nstdout:\n" + r.out + "stderr:\n" + r.err;
}

TEST(Loomrun, GivesEachRankItsEnvironment) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "env"});
  ASSERT_EQ(r.code(), 0) << dump(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::string p = rank_prefix(rank);
    EXPECT_EQ(value_of(r.out, p, "RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(r.out, p, "LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(r.out, p, "WORLD_SIZE"), "2");
    EXPECT_EQ(value_of(r.out, p, "LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(value_of(r.out, p, "GROUP_RANK"), "0");
    EXPECT_EQ(value_of(r.out, p, "MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(value_of(r.out, p, "LOOM_RESTART_COUNT"), "0");
    EXPECT_EQ(value_of(r.out, p, "TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(value_of(r.out, p, "LOOM_CLUSTER_ENV"), "torchrun");
  }
  std::string job = value_of(r.out, "[0] ", "LOOM_JOB_ID");
  EXPECT_EQ(job.size(), 16u) << job;
  EXPECT_EQ(value_of(r.out, "[1] ", "LOOM_JOB_ID"), job);
  std::string port = value_of(r.out, "[0] ", "MASTER_PORT");
  EXPECT_NE(port, "0") << "port 0 must become the store's real port";
  EXPECT_GT(std::atoi(port.c_str()), 0);
  EXPECT_EQ(value_of(r.out, "[1] ", "MASTER_PORT"), port);
  std::string secret = value_of(r.out, "[0] ", "LOOM_STORE_SECRET");
  EXPECT_GE(secret.size(), 32u) << secret;
  EXPECT_EQ(value_of(r.out, "[1] ", "LOOM_STORE_SECRET"), secret);
}

TEST(Loomrun, OtherNodeTakesTorchrunSpellingsAndTheSecretFromItsEnvironment) {
  // Node 1 of 2 serves nothing; its ranks are 2 and 3 of 4.
  Result r = run({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                  "--master_port=29999", kProbe, "env"},
                 {{"LOOM_STORE_SECRET", "0123abcd"}});
  ASSERT_EQ(r.code(), 0) << dump(r);
  for (int rank = 2; rank < 4; ++rank) {
    std::string p = rank_prefix(rank);
    EXPECT_EQ(value_of(r.out, p, "RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(r.out, p, "LOCAL_RANK"), std::to_string(rank - 2));
    EXPECT_EQ(value_of(r.out, p, "WORLD_SIZE"), "4");
    EXPECT_EQ(value_of(r.out, p, "GROUP_RANK"), "1");
    EXPECT_EQ(value_of(r.out, p, "MASTER_PORT"), "29999");
    EXPECT_EQ(value_of(r.out, p, "LOOM_STORE_SECRET"), "0123abcd");
  }
}

TEST(Loomrun, MultiNodeNeedsASharedSecret) {
  Result r = run({"--nnodes", "2", "--node-rank", "0", "--master-port", "29999", kProbe, "env"});
  EXPECT_EQ(r.code(), 2) << dump(r);
  EXPECT_TRUE(contains(r.err, "export LOOM_STORE_SECRET=")) << r.err;
}

TEST(Loomrun, PrefixesEveryLineWithTheRank) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "output"});
  ASSERT_EQ(r.code(), 0) << dump(r);
  for (const std::string p : {"[0] ", "[1] "}) {
    EXPECT_TRUE(contains(r.out, p + "out line 1\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "out line 2\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "partial\n")) << "partial last line not flushed:\n" << r.out;
    EXPECT_TRUE(contains(r.err, p + "err line\n")) << r.err;
  }
  EXPECT_FALSE(contains(r.out, "err line"));
  EXPECT_FALSE(contains(r.err, "out line"));
}

TEST(Loomrun, FailingRankStopsTheOthers) {
  Result r = run({"--nproc-per-node", "3", "--master-port", "0", kProbe, "fail", "1", "3"});
  EXPECT_EQ(r.code(), 3) << dump(r);
  EXPECT_TRUE(contains(r.err, "loomrun: rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, ") exited with code 3")) << r.err;
  EXPECT_LT(r.seconds, 4.0) << "the sleeping ranks were not stopped";
}

TEST(Loomrun, RankThatIgnoresSigtermIsKilledAfterTheGracePeriod) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", "--grace-period", "0.5", kProbe,
                  "stubborn", "0", "5"});
  EXPECT_EQ(r.code(), 5) << dump(r);
  EXPECT_TRUE(contains(r.err, "sending SIGKILL")) << r.err;
  EXPECT_LT(r.seconds, 4.0);
}

TEST(Loomrun, ReportsARankKilledByASignal) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "kill-self", "1"});
  EXPECT_EQ(r.code(), 128 + SIGKILL) << dump(r);
  EXPECT_TRUE(contains(r.err, "rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
  EXPECT_LT(r.seconds, 4.0);
}

TEST(Loomrun, RemovesTheSegmentsOfRanksKilledBeforeTheyUnlinked) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "leak-segment"});
  EXPECT_EQ(r.code(), 128 + SIGKILL) << dump(r);
  EXPECT_TRUE(contains(r.err, "removed 2 shared-memory segment(s)")) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    std::string name = value_of(r.out, rank_prefix(rank), "SEGMENT");
    ASSERT_EQ(name.rfind("/loom-", 0), 0u) << r.out;
    EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name)) << name << " was left behind";
  }
}

TEST(Loomrun, RestartsTheGroupUntilItSucceeds) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", "--max-restarts", "2", kProbe,
                  "fail-until", "2"});
  EXPECT_EQ(r.code(), 0) << dump(r);
  EXPECT_EQ(count(r.err, "loomrun: restarting"), 2) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 2 of 3)")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting (attempt 3 of 3)")) << r.err;
  EXPECT_TRUE(contains(r.out, "[0] attempt 2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] attempt 2\n")) << r.out;
}

TEST(Loomrun, GivesUpWhenRestartsRunOut) {
  Result r = run({"--nproc-per-node", "1", "--master-port", "0", "--max_restarts=1", kProbe,
                  "fail-until", "5"});
  EXPECT_EQ(r.code(), 1) << dump(r);
  EXPECT_EQ(count(r.err, "loomrun: restarting"), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "giving up after 2 attempts")) << r.err;
}

TEST(Loomrun, TimeoutStopsAHangingGroup) {
  Result r =
      run({"--nproc-per-node", "2", "--master-port", "0", "--timeout", "1", kProbe, "sleep", "30"});
  EXPECT_EQ(r.code(), 124) << dump(r);
  EXPECT_TRUE(contains(r.err, "--timeout")) << r.err;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 5.0);
}

TEST(Loomrun, ForwardsSigtermToTheRanks) {
  Loomrun loomrun({"--nproc-per-node", "2", "--master-port", "0", kProbe, "wait-signal"});
  bool ready = loomrun.read_until(
      [](const std::string& out) {
        return contains(out, "[0] ready\n") && contains(out, "[1] ready\n");
      },
      10s);
  ASSERT_TRUE(ready) << "ranks did not start";
  loomrun.signal(SIGTERM);
  Result r = loomrun.finish();
  EXPECT_EQ(r.code(), 128 + SIGTERM) << dump(r);
  EXPECT_TRUE(contains(r.out, "[0] got signal 15\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[1] got signal 15\n")) << r.out;
  EXPECT_TRUE(contains(r.err, "received SIGTERM")) << r.err;
}

TEST(Loomrun, BindsRanksToTheirCores) {
  Result r =
      run({"--nproc-per-node", "2", "--master-port", "0", "--bind", "core", kProbe, "affinity"});
  ASSERT_EQ(r.code(), 0) << dump(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::string tag = "loomrun: rank " + std::to_string(rank) + " -> cores ";
    size_t at = r.err.find(tag);
    ASSERT_NE(at, std::string::npos) << r.err;
    // "... -> cores 0-0 (cpus 0)": the rank's affinity is exactly the cpus printed.
    size_t open = r.err.find("(cpus ", at);
    size_t close = r.err.find(')', open);
    ASSERT_NE(close, std::string::npos) << r.err;
    std::string cpus = r.err.substr(open + 6, close - open - 6);
    EXPECT_EQ(value_of(r.out, rank_prefix(rank), "CPUS"), cpus) << dump(r);
  }
}

TEST(Loomrun, BindsRanksToNumaNodes) {
  Result r =
      run({"--nproc-per-node", "1", "--master-port", "0", "--bind", "numa", kProbe, "affinity"});
  ASSERT_EQ(r.code(), 0) << dump(r);
  EXPECT_TRUE(contains(r.err, "loomrun: rank 0 -> numa 0-")) << r.err;
}

TEST(Loomrun, ServesTheStoreToItsRanks) {
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "store"});
  EXPECT_EQ(r.code(), 0) << dump(r);
  EXPECT_TRUE(contains(r.out, "[1] rank 1 got 'hello from rank 0'\n")) << dump(r);
  EXPECT_TRUE(contains(r.out, "[0] rank 0 got 'hello from rank 1'\n")) << dump(r);
}

TEST(Loomrun, StoreRejectsAWrongSecret) {
  Result r = run({"--nproc-per-node", "1", "--master-port", "0", kProbe, "store-bad-secret"});
  EXPECT_EQ(r.code(), 0) << dump(r);
  EXPECT_TRUE(contains(r.out, "[0] rejected: ")) << dump(r);
}

TEST(Loomrun, BadUsageExitsTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no program given"},
      {{"--nproc-per-node", "2"}, "no program given"},
      {{"--nproc-per-node", "0", kProbe}, "--nproc-per-node must be at least 1"},
      {{"--nnodes", "2", "--node-rank", "2", kProbe}, "--node-rank 2 is outside 0..1"},
      {{"--node-rank", "1", kProbe}, "--node-rank 1 is outside 0..0"},
      {{"/nonexistent/program"}, "program not found"},
      {{"loomrun-no-such-program"}, "program not found"},
      {{"--bind", "socket", kProbe}, "--bind"},
      {{"--master-port", "70000", kProbe}, "--master-port must be a number from 0 to 65535"},
      {{"--master-port", "", kProbe}, "single node only), got ''"},
      {{"--master-port", "-1", kProbe}, "--master-port must be a number from 0 to 65535"},
      {{"--master-port", "29500x", kProbe}, "got '29500x'"},
      {{"--rdzv-endpoint", "localhost:99999", kProbe},
       "the port of --rdzv-endpoint localhost:99999 must be a number from 0 to 65535"},
      {{"--rdzv-endpoint", "localhost:-5", kProbe}, "--rdzv-endpoint localhost:-5"},
      {{"--rdzv-endpoint", "localhost:abc", kProbe}, "--rdzv-endpoint localhost:abc"},
      {{"--no-such-flag", kProbe}, "--no-such-flag"},
  };
  for (const auto& [args, message] : cases) {
    Result r = run(args);
    std::string shown;
    for (const std::string& arg : args)
      shown += " " + arg;
    EXPECT_EQ(r.code(), 2) << "loomrun" << shown << "\n" << dump(r);
    EXPECT_TRUE(contains(r.err, message)) << "loomrun" << shown << "\n" << r.err;
  }
}

TEST(Loomrun, RefusesALoomStorePortThatIsNotAPort) {
  for (const char* bad : {"abc", "99999", "-1", "0"}) {
    Result r = run({"--master-port", "0", kProbe, "env"}, {{"LOOM_STORE_PORT", bad}});
    EXPECT_EQ(r.code(), 2) << dump(r);
    EXPECT_TRUE(contains(r.err, "LOOM_STORE_PORT (in loomrun's environment"))
        << bad << ": " << r.err;
    EXPECT_TRUE(contains(r.err, std::string("got '") + bad + "'")) << r.err;
  }
}

TEST(Loomrun, GivesItsRanksItsStorePortInLoomStorePort) {
  // A port the ranks would otherwise prefer to MASTER_PORT, and find no store on.
  Result r = run({"--nproc-per-node", "2", "--master-port", "0", kProbe, "env"},
                 {{"LOOM_STORE_PORT", "29999"}});
  ASSERT_EQ(r.code(), 0) << dump(r);
  const std::string port = value_of(r.out, "[0] ", "MASTER_PORT");
  EXPECT_EQ(value_of(r.out, "[0] ", "LOOM_STORE_PORT"), port);
  EXPECT_EQ(value_of(r.out, "[1] ", "LOOM_STORE_PORT"), port);
}

TEST(Loomrun, ReportsAnExecFailure) {
  // Executable, but its interpreter does not exist: execvp fails in the child.
  std::string script = ::testing::TempDir() + "loomrun_bad_interpreter.sh";
  {
    std::ofstream out(script);
    out << "#!/nonexistent/interpreter\n";
  }
  chmod(script.c_str(), 0755);
  Result r = run({"--nproc-per-node", "1", "--master-port", "0", script});
  EXPECT_EQ(r.code(), 127) << dump(r);
  EXPECT_TRUE(contains(r.err, "[0] loomrun: rank 0: cannot execute")) << r.err;
  unlink(script.c_str());
}

}  // namespace
