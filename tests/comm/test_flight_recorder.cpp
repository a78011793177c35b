// The flight recorder (comm/flight_recorder.h) and loom-trace analyze on real jobs of two
// forked ranks: one that stalls (rank 1 skips a collective: rank 0 times out and dumps,
// rank 1 dumps on SIGUSR1) and one whose ranks disagree on a collective's dtype.

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "comm/error.h"
#include "comm/flight_recorder.h"
#include "comm/process_group.h"
#include "multiprocess.h"
#include "test_support.h"
#include "tools/loom_trace/analyze.h"

namespace loom::comm {
namespace {

using testing::expect_all_ok;
using testing::run_ranks;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A temporary directory named in LOOM_FLIGHT_RECORDER_DIR, which the ranks inherit.
class DumpDir : public loom::testing::TempDir {
 public:
  DumpDir() : TempDir("loom-flight") {
    ::setenv("LOOM_FLIGHT_RECORDER_DIR", path().c_str(), 1);
  }
  ~DumpDir() { ::unsetenv("LOOM_FLIGHT_RECORDER_DIR"); }
};

void wait_for_file(const fs::path& path) {
  for (int i = 0; i < 500 && !fs::exists(path); ++i)
    std::this_thread::sleep_for(10ms);
}

TEST(FlightRecorder, AStalledJobNamesTheCollectiveOneRankNeverReached) {
  DumpDir dir;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup group(rank, size, store, GroupOptions{.timeout = 1s}, "stall");
    Tensor t = Tensor::full({4}, 1.0);
    group.allreduce(t)->wait();
    group.allreduce(t)->wait();
    if (rank == 1) {  // leaves the job "hanging" at its third collective: dumps on SIGUSR1
      ::raise(SIGUSR1);
      wait_for_file(fs::path(dir.path()) / "flight.rank-1.json");
      return;
    }
    EXPECT_THROW(group.allreduce(t)->wait(), CommError);  // times out, dumps by itself
  }));
  ASSERT_TRUE(fs::exists(fs::path(dir.path()) / "flight.rank-0.json"));
  ASSERT_TRUE(fs::exists(fs::path(dir.path()) / "flight.rank-1.json"));
  const trace::Analysis a = trace::analyze_flight_dumps(dir.path());
  EXPECT_TRUE(a.found) << a.report;
  EXPECT_NE(a.report.find("seq 2: not every rank reached it"), std::string::npos) << a.report;
  EXPECT_NE(a.report.find("rank 1: never issued it (its last: seq 1, allreduce 16 B f32 "
                          "(completed))"),
            std::string::npos)
      << a.report;
  EXPECT_NE(a.report.find("rank 0: allreduce 16 B f32 (failed)"), std::string::npos) << a.report;
  std::printf("%s", a.report.c_str());
}

TEST(FlightRecorder, RanksThatDisagreeOnACollectiveAreNamed) {
  DumpDir dir;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup group(rank, size, store, GroupOptions{.timeout = 5s}, "mismatch");
    Tensor same = Tensor::full({4}, 1.0);
    group.allreduce(same)->wait();
    // The same bytes, another dtype: the shm backend refuses it (Note [Fingerprints]) and the
    // recorder's dumps name it too.
    Tensor odd = rank == 0 ? Tensor::full({4}, 1.0) : Tensor::full({4}, 1.0, DType::I32);
    EXPECT_THROW(group.allreduce(odd)->wait(), CommError);
    FlightRecorder::global().dump(fs::path(dir.path()) /
                                      ("flight.rank-" + std::to_string(rank) + ".json"),
                                  rank);
  }));
  const trace::Analysis a = trace::analyze_flight_dumps(dir.path());
  EXPECT_TRUE(a.found) << a.report;
  EXPECT_NE(a.report.find("seq 1: the ranks disagree on the operation"), std::string::npos)
      << a.report;
  EXPECT_NE(a.report.find("rank 1: allreduce 16 B i32"), std::string::npos) << a.report;
}

TEST(FlightRecorder, NoDumpsIsAClearError) {
  const fs::path empty = fs::temp_directory_path();
  try {
    trace::analyze_flight_dumps(empty / "loom-no-such-dir");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_FLIGHT_RECORDER_DIR"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom::comm
