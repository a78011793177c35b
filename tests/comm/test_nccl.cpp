// The nccl backend through the full ProcessGroup on CUDA tensors, at world size 1: NCCL
// refuses two ranks on one GPU, so multi-rank NCCL runs need a machine with several GPUs
// (every collective here still goes through a real communicator, its comm stream, events
// and the watchdog). Skips without NCCL or without a CUDA device.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>

#include "collective_values.h"
#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::describe;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::kCounts;
using testing::valid;

Device gpu() {
  return Device::cuda(0);
}

// A CUDA tensor of `dtype` with element i = value(i), converted on the host (exact for the
// small integers used here).
Tensor on_gpu(DType dtype, int64_t n, const std::function<double(int64_t)>& value) {
  return testing::filled(dtype, n, value).to(gpu());
}

std::vector<double> values_of(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F64).to_vector<double>();
}

// Rank 0's contribution to element i; at world size 1 every reduction returns it unchanged.
double contribution(ReduceOp op, int64_t i) {
  return testing::contribution(op, 0, i);
}

void expect_values(const Tensor& t, const std::function<double(int64_t)>& want,
                   const std::string& context) {
  EXPECT_EQ(t.device(), gpu()) << context;
  testing::expect_values(t, want, ReduceOp::Sum, context);  // exact
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LOOM_WITH_NCCL) GTEST_SKIP() << "built without NCCL (LOOM_WITH_NCCL=0)";
    if (!loom::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device: " << loom::cuda::unavailable_reason();
    }
  }

  static std::unique_ptr<ProcessGroup> group(Duration timeout = 30s, std::string name = "nccl") {
    return std::make_unique<ProcessGroup>(
        0, 1, std::make_shared<InProcessStore>(),
        GroupOptions{.backend = "nccl", .timeout = timeout, .device = gpu()}, std::move(name));
  }
};

TEST_F(Nccl, AllreduceEveryOpDtypeAndCount) {
  auto pg = group();
  EXPECT_EQ(pg->backend_name(), "nccl");
  for (DType d : kAllDtypes)
    for (ReduceOp op : kAllOps)
      for (int64_t n : kCounts) {
        if (!valid(op, d) || (n > 1000 && d != DType::F32 && d != DType::BF16)) continue;
        Tensor t = on_gpu(d, n, [&](int64_t i) { return contribution(op, i); });
        pg->allreduce(t, {.op = op})->wait();
        expect_values(
            t, [&](int64_t i) { return contribution(op, i); }, describe("allreduce", d, n, op));
      }
}

TEST_F(Nccl, AllreduceOutOfPlaceLeavesInput) {
  auto pg = group();
  for (DType d : {DType::F32, DType::BF16, DType::I64})
    for (int64_t n : kCounts) {
      Tensor in = on_gpu(d, n, [](int64_t i) { return i % 7 + 1; });
      Tensor out = on_gpu(d, n, [](int64_t) { return 0; });
      pg->allreduce(in, out)->wait();
      expect_values(
          in, [](int64_t i) { return i % 7 + 1; }, describe("allreduce input", d, n));
      expect_values(
          out, [](int64_t i) { return i % 7 + 1; }, describe("allreduce output", d, n));
    }
}

TEST_F(Nccl, BroadcastAndReduce) {
  auto pg = group();
  for (DType d : {DType::F32, DType::BF16, DType::I64, DType::U8})
    for (int64_t n : kCounts) {
      Tensor t = on_gpu(d, n, [](int64_t i) { return (i * 7) % 97; });
      pg->broadcast(t, {.root = 0})->wait();
      expect_values(
          t, [](int64_t i) { return (i * 7) % 97; }, describe("broadcast", d, n));
      pg->reduce(t, {.op = ReduceOp::Max, .root = 0})->wait();
      expect_values(
          t, [](int64_t i) { return (i * 7) % 97; }, describe("reduce", d, n, ReduceOp::Max));
    }
}

TEST_F(Nccl, AllGatherOutOfPlaceAndInPlace) {
  auto pg = group();
  for (DType d : {DType::F32, DType::BF16, DType::I64})
    for (int64_t n : kCounts) {
      Tensor in = on_gpu(d, n, [](int64_t i) { return i % 11; });
      Tensor out = on_gpu(d, n, [](int64_t) { return 99; });
      pg->all_gather(out, in)->wait();
      expect_values(
          out, [](int64_t i) { return i % 11; }, describe("all_gather", d, n));
      // In place: the input is this rank's slice of the output.
      Tensor whole = on_gpu(d, n, [](int64_t i) { return i % 13; });
      pg->all_gather(whole, whole.narrow(0, 0, n))->wait();
      expect_values(
          whole, [](int64_t i) { return i % 13; }, describe("all_gather in place", d, n));
    }
}

TEST_F(Nccl, ReduceScatterOutOfPlaceAndInPlace) {
  auto pg = group();
  for (DType d : {DType::F32, DType::BF16, DType::I64})
    for (ReduceOp op : kAllOps)
      for (int64_t n : kCounts) {
        if (!valid(op, d) || (n > 1000 && d != DType::F32)) continue;
        Tensor in = on_gpu(d, n, [&](int64_t i) { return contribution(op, i); });
        Tensor out = on_gpu(d, n, [](int64_t) { return 0; });
        pg->reduce_scatter(out, in, {.op = op})->wait();
        expect_values(
            out, [&](int64_t i) { return contribution(op, i); },
            describe("reduce_scatter", d, n, op));
        Tensor mine = in.narrow(0, 0, n);
        pg->reduce_scatter(mine, in, {.op = op})->wait();
        expect_values(
            mine, [&](int64_t i) { return contribution(op, i); },
            describe("reduce_scatter in place", d, n, op));
      }
}

// Grouped send/recv to this rank itself; in place goes through a temporary copy. (A process
// group's send/recv needs a peer other than itself, and NCCL refuses two ranks on one GPU,
// so two-rank send/recv is not tested here: it needs two GPUs.)
TEST_F(Nccl, AllToAllOutOfPlaceAndInPlace) {
  auto pg = group();
  for (DType d : {DType::F32, DType::BF16, DType::I64})
    for (int64_t n : kCounts) {
      Tensor in = on_gpu(d, n, [](int64_t i) { return i % 9 + 3; });
      Tensor out = on_gpu(d, n, [](int64_t) { return 0; });
      pg->all_to_all(out, in)->wait();
      expect_values(
          out, [](int64_t i) { return i % 9 + 3; }, describe("all_to_all", d, n));
      pg->all_to_all(in, in)->wait();
      expect_values(
          in, [](int64_t i) { return i % 9 + 3; }, describe("all_to_all in place", d, n));
    }
}

TEST_F(Nccl, BarrierAndAsyncCompletion) {
  auto pg = group();
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 20; ++k) {
    tensors.push_back(on_gpu(DType::F32, 1000, [k](int64_t) { return k + 1.0; }));
    works.push_back(pg->allreduce(tensors.back()));
  }
  works.push_back(pg->barrier());
  for (auto& w : works)
    w->wait();
  for (int k = 0; k < 20; ++k) {
    EXPECT_TRUE(works[static_cast<size_t>(k)]->is_completed());
    EXPECT_EQ(values_of(tensors[static_cast<size_t>(k)])[999], k + 1.0);
  }
  pg->barrier({.async_op = false});
}

TEST_F(Nccl, BlockingCallsReturnCompleted) {
  auto pg = group();
  Tensor queued = on_gpu(DType::F32, 100000, [](int64_t) { return 1; });
  WorkPtr behind = pg->allreduce(queued);
  for (int k = 0; k < 50; ++k) {
    Tensor t = on_gpu(DType::F32, 2, [k](int64_t) { return k; });
    WorkPtr w = pg->allreduce(t, {.async_op = false});
    EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(values_of(t)[1], k);
  }
  behind->wait();
  EXPECT_EQ(values_of(queued)[99999], 1);
}

// Data produced on a user stream (StreamGuard on the issuing thread) is reduced after it is
// written, and the result is visible to that stream's later work (Note [Issue streams]).
TEST_F(Nccl, FollowsTheIssuingThreadsStream) {
  auto pg = group();
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  {
    loom::cuda::StreamGuard guard(0, user);
    for (int k = 0; k < 10; ++k) {
      Tensor t = on_gpu(DType::F32, 1 << 20, [k](int64_t i) { return (i + k) % 17; });
      pg->allreduce(t)->wait();
      expect_values(
          t, [k](int64_t i) { return (i + k) % 17; }, "allreduce on a user stream");
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(user), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(user), cudaSuccess);
}

TEST_F(Nccl, SplitUsesTheCommunicator) {
  auto pg = group();
  auto sub = pg->split(0, 5);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend_name(), "nccl");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  Tensor t = on_gpu(DType::BF16, 7, [](int64_t i) { return i; });
  sub->allreduce(t, {.op = ReduceOp::Avg})->wait();
  expect_values(
      t, [](int64_t i) { return i; }, "allreduce in a subgroup");
  EXPECT_EQ(pg->split(-1, 0), nullptr);  // still a collective of the parent communicator
  pg->allreduce(t)->wait();              // the parent stays usable
  auto nested = sub->split(3, 0);
  ASSERT_NE(nested, nullptr);
  nested->barrier()->wait();
}

TEST_F(Nccl, AutoPicksNcclForCudaTensors) {
  ProcessGroup pg(0, 1, std::make_shared<InProcessStore>(),
                  {.backend = "auto", .timeout = 30s, .device = gpu()});
  EXPECT_EQ(pg.backend_name(), "nccl");
}

TEST_F(Nccl, MisplacedTensorsAreRefused) {
  auto pg = group();
  Tensor cpu = Tensor::zeros({4});
  EXPECT_THROW(pg->allreduce(cpu), Error);
  Tensor cuda = on_gpu(DType::F32, 4, [](int64_t) { return 0; });
  EXPECT_THROW(pg->allreduce(cuda, cpu), Error);  // two devices
  EXPECT_THROW(ProcessGroup(0, 1, std::make_shared<InProcessStore>(),
                            {.backend = "nccl", .device = Device::cpu()}),
               Error);
}

// The watchdog: a collective that cannot finish by its deadline aborts the communicator and
// fails its Work with a CommError; the group is broken afterwards. The collective is held
// back by a host function that blocks the issuing stream until the test releases it.
TEST_F(Nccl, TimeoutAbortsTheCommunicator) {
  auto pg = group(30s, "watchdog");
  Tensor t = on_gpu(DType::F32, 1024, [](int64_t) { return 1; });
  struct BlockedStream {
    cudaStream_t stream = loom::cuda::compute_stream(0);
    std::atomic<bool> released{false};
    BlockedStream() {
      cudaHostFn_t block = [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      };
      EXPECT_EQ(cudaLaunchHostFunc(stream, block, &released), cudaSuccess);
    }
    ~BlockedStream() {
      released = true;
      LOOM_CUDA_WARN(cudaStreamSynchronize(stream));
    }
  };
  {
    BlockedStream blocked;
    auto start = std::chrono::steady_clock::now();
    WorkPtr work = pg->allreduce(t, {.timeout = 300ms});
    try {
      work->wait();
      ADD_FAILURE() << "the allreduce completed behind a blocked stream";
    } catch (const CommError& e) {
      std::string what = e.what();
      for (const char* part : {"allreduce", "watchdog", "aborted", "timeout 300 ms"}) {
        EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
      }
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  }
  // Broken: later operations fail fast instead of touching the aborted communicator.
  EXPECT_THROW(pg->allreduce(t)->wait(), CommError);
}

}  // namespace
}  // namespace loom::comm
