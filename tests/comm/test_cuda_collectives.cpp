// CUDA tensors on a process group of forked ranks: every collective and send/recv, several
// dtypes and counts, closed-form expected values. Two backends:
//  - shm, which the process group feeds through pinned host memory (Note [Staging CUDA
//    tensors]): the ranks share one GPU;
//  - nccl, in the build against the emulated runtime and libnccl (LOOM_EMULATED_NCCL:
//    tests/cuda_emulation, Note [Emulated NCCL]), where each rank is a process with an
//    emulated GPU of its own. On a real GPU NCCL refuses two ranks on one device, so there
//    the nccl backend is tested at world size 1 (tests/comm/test_nccl.cpp).
//
// CUDA is initialised only in forked children: a process that initialised CUDA cannot use it
// in the children it forks afterwards. So even the check for a device runs in a child
// (cuda_probe), and the test process itself never calls into CUDA.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#if LOOM_EMULATED_NCCL
#include <nccl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <regex>
#include <string>

#include "collective_values.h"
#include "comm/error.h"
#include "comm/process_group.h"
#include "multiprocess.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::contribution;
using testing::describe;
using testing::expect_all_ok;
using testing::expected;
using testing::filled;
using testing::kAllOps;
using testing::kCounts;
using testing::run_ranks;
using testing::valid;

struct CudaProbe {
  bool available = false;
  std::string reason;
};

// loom::cuda::is_available() and unavailable_reason(), asked in a forked child.
const CudaProbe& cuda_probe() {
  static const CudaProbe probe = [] {
    int fds[2];
    if (pipe(fds) != 0) return CudaProbe{false, "pipe() failed"};
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const bool available = loom::cuda::is_available();
      const std::string reason = available ? "" : loom::cuda::unavailable_reason();
      ssize_t written = write(fds[1], reason.data(), reason.size());
      _exit(available && written >= 0 ? 0 : 1);
    }
    close(fds[1]);
    std::string reason;
    char buffer[256];
    for (ssize_t got; (got = read(fds[0], buffer, sizeof buffer)) > 0;) {
      reason.append(buffer, static_cast<size_t>(got));
    }
    close(fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return CudaProbe{false, "fork() failed"};
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return CudaProbe{true, ""};
    return CudaProbe{false, reason.empty() ? "the probe process failed" : reason};
  }();
  return probe;
}

Device gpu() {
  return Device::cuda(0);
}

Tensor on_gpu(DType dtype, int64_t n, const std::function<double(int64_t)>& value) {
  return filled(dtype, n, value).to(gpu());
}

// Checks that t is on the GPU, then its values (testing::expect_values).
void expect_gpu_values(const Tensor& t, const std::function<double(int64_t)>& want, ReduceOp op,
                       const std::string& context) {
  EXPECT_EQ(t.device(), gpu()) << context;
  testing::expect_values(t, want, op, context);
}

// The shared-memory segments the emulated NCCL names after a unique id rank 0 made (Note
// [Emulated NCCL]): a group's communicator, its subgroups', their collectives' and messages'.
std::vector<std::string> nccl_segments_of(pid_t rank0) {
  const std::string prefix = "loom-nccl-" + std::to_string(rank0) + "-";
  std::vector<std::string> found;
  for (const std::string& name : testing::loom_shm_entries())
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  return found;
}

class CudaCollectives : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    // loom::cuda::is_available(), asked in a child (see the top of the file).
    if (!cuda_probe().available) GTEST_SKIP() << "no CUDA device: " << cuda_probe().reason;
  }
  const std::string& backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  // Runs body on every rank (forked processes) with a fresh group of the backend. With the
  // emulated NCCL, rank 0 then checks that no segment of the group is left in /dev/shm (unless
  // a rank does not live to close its group).
  void on_ranks(const std::function<void(ProcessGroup&)>& body, bool every_rank_closes = true) {
    const std::string name = backend();
    expect_all_ok(run_ranks(world(), [&](int rank, int size, std::shared_ptr<Store> store) {
      {
        GroupOptions options{.backend = name, .timeout = 30s};
        if (name == "nccl") options.device = gpu();
        ProcessGroup pg(rank, size, store, options);
        body(pg);
      }
      if (name != "nccl" || !every_rank_closes) return;
      store->add("groups closed", 1);
      if (rank == 0) {
        store->wait({"groups closed"});
        while (store->add("groups closed", 0) < size)
          std::this_thread::sleep_for(1ms);
        EXPECT_EQ(nccl_segments_of(getpid()), std::vector<std::string>{});
      }
    }));
  }
};

TEST_P(CudaCollectives, AllreduceOpsDtypesAndCounts) {
  on_ranks([](ProcessGroup& pg) {
    for (DType d : {DType::F32, DType::BF16, DType::I64})
      for (ReduceOp op : kAllOps)
        for (int64_t n : kCounts) {
          if (!valid(op, d) || (n > 1000 && d != DType::F32)) continue;
          Tensor t = on_gpu(d, n, [&](int64_t i) { return contribution(op, pg.rank(), i); });
          pg.allreduce(t, {.op = op})->wait();
          expect_gpu_values(
              t, [&](int64_t i) { return expected(op, pg.size(), i); }, op,
              describe("allreduce", d, n, op, pg.rank()));
        }
  });
}

TEST_P(CudaCollectives, AllreduceOutOfPlaceLeavesInput) {
  on_ranks([](ProcessGroup& pg) {
    for (int64_t n : kCounts) {
      auto mine = [&](int64_t i) { return contribution(ReduceOp::Sum, pg.rank(), i); };
      Tensor in = on_gpu(DType::F32, n, mine);
      Tensor out = on_gpu(DType::F32, n, [](int64_t) { return -1; });
      pg.allreduce(in, out)->wait();
      expect_gpu_values(in, mine, ReduceOp::Sum,
                        describe("input", DType::F32, n, ReduceOp::Sum, 0));
      expect_gpu_values(
          out, [&](int64_t i) { return expected(ReduceOp::Sum, pg.size(), i); }, ReduceOp::Sum,
          describe("output", DType::F32, n, ReduceOp::Sum, pg.rank()));
    }
  });
}

TEST_P(CudaCollectives, BroadcastAndReduceEveryRoot) {
  on_ranks([](ProcessGroup& pg) {
    for (int root = 0; root < pg.size(); ++root)
      for (int64_t n : kCounts) {
        Tensor t = on_gpu(DType::BF16, n,
                          [&](int64_t i) { return pg.rank() == root ? (i * 7 + root) % 97 : 250; });
        pg.broadcast(t, {.root = root})->wait();
        expect_gpu_values(
            t, [&](int64_t i) { return (i * 7 + root) % 97; }, ReduceOp::Sum,
            describe("broadcast", DType::BF16, n, ReduceOp::Sum, pg.rank()));
        auto mine = [&](int64_t i) { return contribution(ReduceOp::Max, pg.rank(), i); };
        Tensor r = on_gpu(DType::F32, n, mine);
        pg.reduce(r, {.op = ReduceOp::Max, .root = root})->wait();
        if (pg.rank() == root) {
          expect_gpu_values(
              r, [&](int64_t i) { return expected(ReduceOp::Max, pg.size(), i); }, ReduceOp::Max,
              describe("reduce", DType::F32, n, ReduceOp::Max, root));
        } else {
          expect_gpu_values(
              r, mine, ReduceOp::Max,
              describe("reduce leaves non-roots", DType::F32, n, ReduceOp::Max, pg.rank()));
        }
      }
  });
}

TEST_P(CudaCollectives, AllGatherOutOfPlaceAndInPlace) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (DType d : {DType::F32, DType::I64})
      for (int64_t n : kCounts) {
        const int64_t m = std::max<int64_t>(n, 1);
        auto want = [&](int64_t j) { return (j / m) * 10 + (j % m) % 7; };
        Tensor in = on_gpu(d, n, [&](int64_t i) { return pg.rank() * 10 + i % 7; });
        Tensor out = on_gpu(d, w * n, [](int64_t) { return 0; });
        pg.all_gather(out, in)->wait();
        expect_gpu_values(out, want, ReduceOp::Sum,
                          describe("all_gather", d, n, ReduceOp::Sum, pg.rank()));
        // In place: this rank's slice of the output already holds its input.
        Tensor whole =
            on_gpu(d, w * n, [&](int64_t j) { return j / m == pg.rank() ? want(j) : -1; });
        pg.all_gather(whole, whole.narrow(0, pg.rank() * n, n))->wait();
        expect_gpu_values(whole, want, ReduceOp::Sum,
                          describe("all_gather in place", d, n, ReduceOp::Sum, pg.rank()));
      }
  });
}

TEST_P(CudaCollectives, ReduceScatterOutOfPlaceAndInPlace) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (DType d : {DType::F32, DType::BF16})
      for (ReduceOp op : kAllOps)
        for (int64_t n : kCounts) {
          if (n > 1000 && d != DType::F32) continue;
          Tensor in = on_gpu(d, w * n, [&](int64_t i) { return contribution(op, pg.rank(), i); });
          Tensor out = on_gpu(d, n, [](int64_t) { return 0; });
          auto want = [&](int64_t i) { return expected(op, pg.size(), pg.rank() * n + i); };
          pg.reduce_scatter(out, in, {.op = op})->wait();
          expect_gpu_values(out, want, op, describe("reduce_scatter", d, n, op, pg.rank()));
          Tensor mine = in.narrow(0, pg.rank() * n, n);
          pg.reduce_scatter(mine, in, {.op = op})->wait();
          expect_gpu_values(mine, want, op,
                            describe("reduce_scatter in place", d, n, op, pg.rank()));
        }
  });
}

TEST_P(CudaCollectives, AllToAll) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (int64_t n : kCounts) {
      const int64_t m = std::max<int64_t>(n, 1);
      Tensor in = on_gpu(DType::F32, w * n,
                         [&](int64_t i) { return pg.rank() * 64 + (i / m) * 8 + (i % m) % 7; });
      Tensor out = on_gpu(DType::F32, w * n, [](int64_t) { return 0; });
      pg.all_to_all(out, in)->wait();
      expect_gpu_values(
          out, [&](int64_t i) { return (i / m) * 64 + pg.rank() * 8 + (i % m) % 7; }, ReduceOp::Sum,
          describe("all_to_all", DType::F32, n, ReduceOp::Sum, pg.rank()));
    }
  });
}

// Point-to-point needs a peer other than the rank itself: instantiated from world size 2.
class CudaPointToPoint : public CudaCollectives {};

TEST_P(CudaPointToPoint, SendRecvAroundARing) {
  const int tag = backend() == "nccl" ? 0 : 7;  // NCCL has no tags: it matches by order
  on_ranks([tag](ProcessGroup& pg) {
    const int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
    for (int64_t n : kCounts) {
      Tensor out = on_gpu(DType::F32, n, [&](int64_t i) { return pg.rank() * 100000.0 + i; });
      Tensor in = on_gpu(DType::F32, n, [](int64_t) { return 0; });
      WorkPtr a, b;
      if (pg.rank() % 2 == 0) {
        a = pg.send(out, next, {.tag = tag});
        b = pg.recv(in, prev, {.tag = tag});
      } else {
        b = pg.recv(in, prev, {.tag = tag});
        a = pg.send(out, next, {.tag = tag});
      }
      a->wait();
      b->wait();
      expect_gpu_values(
          in, [&](int64_t i) { return prev * 100000.0 + i; }, ReduceOp::Sum,
          describe("recv", DType::F32, n, ReduceOp::Sum, pg.rank()));
    }
  });
}

// Async operations queued back to back, a barrier; with shm, CPU and CUDA tensors in one
// group (nccl moves CUDA tensors only).
TEST_P(CudaCollectives, MixedDevicesAndAsyncCompletion) {
  const bool mixed = backend() == "shm";
  on_ranks([mixed](ProcessGroup& pg) {
    std::vector<Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int k = 0; k < 20; ++k) {
      Tensor t = Tensor::full({1000}, k + 1.0);
      tensors.push_back(mixed && k % 2 == 0 ? t : t.to(gpu()));
      works.push_back(pg.allreduce(tensors.back()));
    }
    works.push_back(pg.barrier());
    for (auto& w : works)
      w->wait();
    for (int k = 0; k < 20; ++k) {
      EXPECT_TRUE(works[static_cast<size_t>(k)]->is_completed());
      EXPECT_EQ(tensors[static_cast<size_t>(k)].to(Device::cpu()).to_vector<float>()[999],
                (k + 1.0f) * pg.size());
    }
    Tensor gpu_tensor = on_gpu(DType::F32, 4, [](int64_t) { return 1; });
    Tensor cpu_tensor = Tensor::zeros({4});
    EXPECT_THROW(pg.allreduce(gpu_tensor, cpu_tensor), Error);  // one device per operation
  });
}

// Data produced on a user stream (StreamGuard) is staged after it was written, and the
// upload is visible to that stream's later work (Note [Issue streams]).
TEST_P(CudaCollectives, FollowsTheIssuingThreadsStream) {
  on_ranks([](ProcessGroup& pg) {
    cudaStream_t user = nullptr;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
    {
      loom::cuda::StreamGuard guard(0, user);
      for (int k = 0; k < 5; ++k) {
        Tensor t = on_gpu(DType::F32, 1 << 20, [&](int64_t i) { return (i + k) % 17; });
        pg.allreduce(t)->wait();
        expect_gpu_values(
            t, [&](int64_t i) { return (i + k) % 17 * pg.size(); }, ReduceOp::Sum,
            "allreduce on a user stream");
      }
    }
    EXPECT_EQ(cudaStreamSynchronize(user), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(user), cudaSuccess);
  });
}

TEST_P(CudaCollectives, SplitByParity) {
  const std::string name = backend();
  on_ranks([&](ProcessGroup& pg) {
    auto sub = pg.split(pg.rank() % 2, -pg.rank());
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->backend_name(), name);
    Tensor t = on_gpu(DType::F32, 5, [&](int64_t) { return pg.rank(); });
    sub->allreduce(t)->wait();
    double want = 0;
    for (int r = pg.rank() % 2; r < pg.size(); r += 2)
      want += r;
    expect_gpu_values(
        t, [&](int64_t) { return want; }, ReduceOp::Sum, "allreduce in a subgroup");
  });
}

// A rank whose process exits leaves its peers an error, not a wait: world sizes from 2.
TEST_P(CudaPointToPoint, ARankThatExitsFailsItsPeersCollective) {
  on_ranks([](ProcessGroup& pg) {
    Tensor t = on_gpu(DType::F32, 1000, [](int64_t) { return 1; });
    pg.allreduce(t)->wait();
    if (pg.rank() == pg.size() - 1) {
      std::fflush(stdout);
      _exit(0);  // gone, without a word to its group
    }
    const auto start = std::chrono::steady_clock::now();
    const int gone = pg.size() - 1;
    try {
      pg.allreduce(t, {.timeout = 20s})->wait();
      ADD_FAILURE() << "the allreduce completed without rank " << gone;
    } catch (const CommError& e) {
      // shm: "peer 1 (pid N) died ..."; the emulated NCCL: "rank 1 (pid N) ... exited ...",
      // or, to a survivor that has not looked yet, "rank 0 aborted communicator ..." (the
      // survivor that saw it first aborts, as on NCCL).
      const std::regex names_it("(peer|rank) " + std::to_string(gone) +
                                " \\(pid [0-9]+\\)|rank [0-9]+ aborted communicator");
      EXPECT_TRUE(std::regex_search(e.what(), names_it)) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  }, /*every_rank_closes=*/false);
}

std::string backend_and_world(
    const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param));
}
INSTANTIATE_TEST_SUITE_P(Shm, CudaCollectives, ::testing::Combine(::testing::Values("shm"),
                         ::testing::Values(1, 2, 3)), backend_and_world);
INSTANTIATE_TEST_SUITE_P(Shm, CudaPointToPoint, ::testing::Combine(::testing::Values("shm"),
                         ::testing::Values(2, 3)), backend_and_world);
#if LOOM_EMULATED_NCCL
INSTANTIATE_TEST_SUITE_P(EmulatedNccl, CudaCollectives,
                         ::testing::Combine(::testing::Values("nccl"), ::testing::Values(1, 2, 3)),
                         backend_and_world);
INSTANTIATE_TEST_SUITE_P(EmulatedNccl, CudaPointToPoint,
                         ::testing::Combine(::testing::Values("nccl"), ::testing::Values(2, 3)),
                         backend_and_world);

// The emulated NCCL's own limit (Note [Emulated NCCL]): an emulated collective waits in its
// call for its peers, so a peer that lives but never comes is caught by
// LOOM_EMULATED_NCCL_TIMEOUT_S, not by the group's timeout; the wait ends with an error
// naming the limit, and the peer's later arrival finds the communicator aborted.
TEST(EmulatedNcclLimits, ACollectiveNoPeerJoinsEndsAtTheLimit) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
    setenv("LOOM_EMULATED_NCCL_TIMEOUT_S", "1", 1);
    ProcessGroup pg(rank, size, store, {.backend = "nccl", .timeout = 30s, .device = gpu()});
    Tensor t = on_gpu(DType::F32, 10, [](int64_t) { return 1; });
    if (rank == 1) {
      store->wait({"rank 0 gave up"});
      EXPECT_THROW(pg.allreduce(t)->wait(), CommError);  // rank 0 aborted it
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      pg.allreduce(t)->wait();
      ADD_FAILURE() << "the allreduce completed without rank 1";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("LOOM_EMULATED_NCCL_TIMEOUT_S"), std::string::npos)
          << e.what();
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, 1s);
    EXPECT_LT(waited, 10s);
    store->set("rank 0 gave up", {1});
  }));
}

// A handle that goes before its board settled leaves nothing in /dev/shm: a split's child
// whose parent is aborted mid-split (the child never delivered), and a communicator destroyed
// before its second rank joined.
TEST(EmulatedNcclLimits, AHandleGoneBeforeItsBoardSettledLeavesNothingInDevShm) {
  expect_all_ok(run_ranks(1, [](int, int, std::shared_ptr<Store>) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t parent = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&parent, 1, id, 0, &config), ncclSuccess);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress)
      ASSERT_EQ(ncclCommGetAsyncError(parent, &state), ncclSuccess);
    ASSERT_EQ(state, ncclSuccess);
    ncclComm_t child = nullptr;
    ASSERT_EQ(ncclCommSplit(parent, 0, 0, &child, &config), ncclSuccess);
    EXPECT_EQ(child, nullptr) << "a non-blocking split delivers its child at a later poll";
    EXPECT_FALSE(nccl_segments_of(getpid()).empty()) << "the child's board should exist";
    EXPECT_EQ(ncclCommAbort(parent), ncclSuccess);
    EXPECT_EQ(nccl_segments_of(getpid()), std::vector<std::string>{});

    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t lone = nullptr;
    const ncclResult_t started = ncclCommInitRankConfig(&lone, 2, id, 0, &config);
    ASSERT_TRUE(started == ncclSuccess || started == ncclInProgress) << started;
    EXPECT_FALSE(nccl_segments_of(getpid()).empty()) << "the board should exist";
    EXPECT_EQ(ncclCommDestroy(lone), ncclSuccess);
    EXPECT_EQ(nccl_segments_of(getpid()), std::vector<std::string>{});
  }));
}
#endif

}  // namespace
}  // namespace loom::comm
