// The device runtime's stream and event rules (tensor/cuda/stream.cpp, device.cpp) against a
// fake CUDA runtime with two devices whose work finishes only when the test says so
// (fake_cuda_driver.h): per-device compute, comm and copy streams, StreamGuard nesting per thread,
// events that complete with their stream's work, re-created on another device's stream.

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "core/error.h"
#include "fake_cuda_driver.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

TEST(DeviceRuntime, EachDeviceHasItsOwnNonBlockingComputeCommAndCopyStreams) {
  ASSERT_EQ(device_count(), fake_cuda::kDevices);
  cudaStream_t c0 = compute_stream(0), m0 = comm_stream(0), c1 = compute_stream(1);
  cudaStream_t k0 = copy_stream(0), k1 = copy_stream(1);
  EXPECT_NE(c0, m0);
  EXPECT_NE(c0, c1);
  EXPECT_NE(k0, c0);
  EXPECT_NE(k0, m0);
  EXPECT_NE(k0, k1);
  EXPECT_EQ(compute_stream(0), c0) << "created once, then reused";
  EXPECT_EQ(copy_stream(0), k0) << "created once, then reused";
  for (cudaStream_t s : {c0, m0, c1, k0, k1})
    EXPECT_EQ(fake_cuda::stream_flags(s), cudaStreamNonBlocking);
  int device = -1;
  ASSERT_EQ(cudaStreamGetDevice(c1, &device), cudaSuccess);
  EXPECT_EQ(device, 1) << "a device's streams are created on that device";
  ASSERT_EQ(cudaStreamGetDevice(k1, &device), cudaSuccess);
  EXPECT_EQ(device, 1);
  int current = -1;
  cudaGetDevice(&current);
  EXPECT_EQ(current, 0) << "creating device 1's stream must restore the current device";
}

TEST(DeviceRuntime, ABadDeviceIndexNamesTheValidRange) {
  try {
    compute_stream(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 0..1"), std::string::npos) << e.what();
  }
}

TEST(DeviceRuntime, StreamGuardsNestPerDeviceAndPerThread) {
  cudaStream_t a = comm_stream(0), b = comm_stream(1);
  EXPECT_EQ(current_stream(0), compute_stream(0));
  {
    StreamGuard outer(0, a);
    EXPECT_EQ(current_stream(0), a);
    EXPECT_EQ(current_stream(1), compute_stream(1)) << "a guard is for its device only";
    {
      StreamGuard inner(0, compute_stream(0));
      EXPECT_EQ(current_stream(0), compute_stream(0));
      StreamGuard other(1, b);
      EXPECT_EQ(current_stream(1), b);
    }
    EXPECT_EQ(current_stream(0), a) << "the inner guard restores the outer one";
    EXPECT_EQ(current_stream(1), compute_stream(1));
    cudaStream_t seen = nullptr;
    std::thread([&] { seen = current_stream(0); }).join();
    EXPECT_EQ(seen, compute_stream(0)) << "guards belong to the thread that made them";
  }
  EXPECT_EQ(current_stream(0), compute_stream(0));
}

TEST(DeviceRuntime, AnEventCompletesWithTheWorkItCaptured) {
  cudaStream_t s = compute_stream(0);
  Event e;
  EXPECT_TRUE(e.query()) << "never recorded: complete";
  fake_cuda::enqueue(s);
  e.record(s);
  EXPECT_FALSE(e.query());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "'not ready' must not linger as an error";
  fake_cuda::enqueue(s);  // later work is not part of the event
  e.synchronize();
  EXPECT_TRUE(e.query());
  Event later;
  later.record(s);
  EXPECT_FALSE(later.query()) << "the second piece of work is still running";
  fake_cuda::finish(s);
  EXPECT_TRUE(later.query());
}

TEST(DeviceRuntime, RecordingOnAnotherDevicesStreamRecreatesTheEventThere) {
  const auto before = fake_cuda::counts();
  Event e;  // on device 0, the current one
  EXPECT_EQ(e.device(), 0);
  cudaStream_t s1 = compute_stream(1);
  fake_cuda::enqueue(s1);
  e.record(s1);  // the fake refuses a stream of another device, as CUDA does
  EXPECT_EQ(e.device(), 1);
  EXPECT_FALSE(e.query());
  fake_cuda::finish(s1);
  EXPECT_TRUE(e.query());
  EXPECT_EQ(fake_cuda::counts().events_created - before.events_created, 2);
  EXPECT_EQ(fake_cuda::counts().events_destroyed - before.events_destroyed, 1);
}

TEST(DeviceRuntime, OnlyARecordedEventMakesAStreamWait) {
  const int waits = fake_cuda::counts().stream_waits;
  Event e;
  e.wait_on(comm_stream(0));
  EXPECT_EQ(fake_cuda::counts().stream_waits, waits) << "nothing captured, nothing to wait for";
  e.record(compute_stream(0));
  e.wait_on(comm_stream(0));
  EXPECT_EQ(fake_cuda::counts().stream_waits, waits + 1);
}

TEST(DeviceRuntime, ElapsedTimeNeedsTwoRecordedTimingEvents) {
  Event start(true), end(true), plain;
  EXPECT_THROW(start.elapsed_ms(end), Error) << "not recorded";
  start.record(compute_stream(0));
  end.record(compute_stream(0));
  EXPECT_EQ(start.elapsed_ms(end), 1.5f);
  plain.record(compute_stream(0));
  EXPECT_THROW(start.elapsed_ms(plain), Error);
}

TEST(DeviceRuntime, AMovedFromEventRefusesToRecordAndEveryEventIsDestroyed) {
  const auto before = fake_cuda::counts();
  {
    Event a;
    Event b = std::move(a);
    EXPECT_THROW(a.record(compute_stream(0)), Error);
    EXPECT_TRUE(a.query());
    Event c;
    c = std::move(b);
  }
  const auto after = fake_cuda::counts();
  EXPECT_EQ(after.events_created - before.events_created,
            after.events_destroyed - before.events_destroyed);
}

TEST(DeviceRuntime, DeviceGuardSwitchesAndRestores) {
  int current = -1;
  {
    DeviceGuard guard(1);
    cudaGetDevice(&current);
    EXPECT_EQ(current, 1);
  }
  cudaGetDevice(&current);
  EXPECT_EQ(current, 0);
  EXPECT_THROW(DeviceGuard(7), Error);
}

}  // namespace
}  // namespace loom::cuda
