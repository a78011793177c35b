// The CUDA runtime on a real device: devices, streams, events, the caching allocator with the
// CUDA driver, pinned memory and copy_bytes in every direction. Every test skips without a
// device. Streams are held back deterministically with a host function that waits for the
// test (StreamGate), never with timing assumptions.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "tensor/allocator.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/copy.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/pinned.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

#define LOOM_REQUIRE_CUDA()                                                     \
  do {                                                                          \
    if (!::loom::cuda::is_available())                                          \
      GTEST_SKIP() << "no CUDA device: " << ::loom::cuda::unavailable_reason(); \
  } while (0)

// Blocks a stream until open() (or a 20 s safety timeout), so that "work still running on the
// stream" is a state the test controls. The gate must outlive the stream's progress past it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    LOOM_CUDA_CHECK(cudaLaunchHostFunc(stream, &StreamGate::wait, this));
  }
  void open() { open_.store(true); }

 private:
  static void wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gate->open_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> open_{false};
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 + seed + (i >> 12));
  return bytes;
}

TEST(CudaDevice, CountsAndChecksIndices) {
  LOOM_REQUIRE_CUDA();
  int count = device_count();
  EXPECT_GT(count, 0);
  EXPECT_TRUE(unavailable_reason().empty());
  check_device_index(0);
  EXPECT_THROW(check_device_index(-1), Error);
  try {
    check_device_index(count);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 0.." + std::to_string(count - 1)),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaDevice, GuardSetsAndRestoresTheCurrentDevice) {
  LOOM_REQUIRE_CUDA();
  int last = device_count() - 1;
  LOOM_CUDA_CHECK(cudaSetDevice(0));
  {
    DeviceGuard guard(last);
    int current = -1;
    LOOM_CUDA_CHECK(cudaGetDevice(&current));
    EXPECT_EQ(current, last);
  }
  int current = -1;
  LOOM_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
}

TEST(CudaStream, ComputeAndCommStreamsAreNonBlockingAndStable) {
  LOOM_REQUIRE_CUDA();
  cudaStream_t compute = compute_stream(0);
  cudaStream_t comm = comm_stream(0);
  EXPECT_NE(compute, nullptr);
  EXPECT_NE(comm, nullptr);
  EXPECT_NE(compute, comm);
  EXPECT_EQ(compute_stream(0), compute);
  EXPECT_EQ(comm_stream(0), comm);
  unsigned flags = 0;
  LOOM_CUDA_CHECK(cudaStreamGetFlags(compute, &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
  int device = -1;
  LOOM_CUDA_CHECK(cudaStreamGetDevice(comm, &device));
  EXPECT_EQ(device, 0);
  EXPECT_THROW(compute_stream(device_count()), Error);
}

TEST(CudaStream, ConcurrentFirstUseCreatesOneStream) {
  LOOM_REQUIRE_CUDA();
  int last = device_count() - 1;
  std::vector<cudaStream_t> seen(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = comm_stream(last); });
  }
  for (std::thread& thread : threads)
    thread.join();
  for (cudaStream_t stream : seen)
    EXPECT_EQ(stream, seen[0]);
}

TEST(CudaStream, GuardOverridesTheCurrentStreamOfItsThreadOnly) {
  LOOM_REQUIRE_CUDA();
  cudaStream_t compute = compute_stream(0);
  cudaStream_t comm = comm_stream(0);
  EXPECT_EQ(current_stream(0), compute);
  {
    StreamGuard outer(0, comm);
    EXPECT_EQ(current_stream(0), comm);
    cudaStream_t other_thread = nullptr;
    std::thread([&] { other_thread = current_stream(0); }).join();
    EXPECT_EQ(other_thread, compute);
    {
      StreamGuard inner(0, compute);
      EXPECT_EQ(current_stream(0), compute);
    }
    EXPECT_EQ(current_stream(0), comm);
  }
  EXPECT_EQ(current_stream(0), compute);
}

TEST(CudaEvent, RecordQuerySynchronizeAndWait) {
  LOOM_REQUIRE_CUDA();
  DeviceGuard device(0);
  cudaStream_t stream = compute_stream(0);
  Event never_recorded;
  EXPECT_TRUE(never_recorded.query());

  auto gate = std::make_unique<StreamGate>(stream);
  Event event;
  event.record(stream);
  EXPECT_FALSE(event.query());  // the stream is held at the gate
  // The comm stream waits on the device for the event, not the host.
  event.wait_on(comm_stream(0));
  Event after_wait;
  after_wait.record(comm_stream(0));
  EXPECT_FALSE(after_wait.query());
  gate->open();
  event.synchronize();
  EXPECT_TRUE(event.query());
  after_wait.synchronize();
  EXPECT_TRUE(after_wait.query());

  Event moved = std::move(event);
  EXPECT_TRUE(moved.query());
  EXPECT_EQ(event.get(), nullptr);
}

TEST(CudaEvent, ElapsedTimeNeedsTimingEvents) {
  LOOM_REQUIRE_CUDA();
  DeviceGuard device(0);
  cudaStream_t stream = compute_stream(0);
  Event start(true), end(true);
  start.record(stream);
  std::vector<uint8_t> host = pattern(1 << 20, 1);
  void* buffer = caching_allocator(0).allocate(host.size());
  copy_bytes(buffer, Device::cuda(0), host.data(), Device::cpu(), host.size(), stream);
  end.record(stream);
  end.synchronize();
  EXPECT_GE(start.elapsed_ms(end), 0.0f);
  Event plain;
  plain.record(stream);
  plain.synchronize();
  EXPECT_THROW(plain.elapsed_ms(end), Error);
  caching_allocator(0).deallocate(buffer, host.size());
}

TEST(CudaCachingAllocator, IsTheAllocatorOfCudaDevices) {
  LOOM_REQUIRE_CUDA();
  EXPECT_EQ(&allocator_for(Device::cuda(0)), &caching_allocator(0));
  EXPECT_THROW(caching_allocator(device_count()), Error);
}

TEST(CudaCachingAllocator, AllocatesUsableMemoryAndReusesIt) {
  LOOM_REQUIRE_CUDA();
  CachingAllocator& allocator = caching_allocator(0);
  CachingStats before = allocator.caching_stats();
  void* a = allocator.allocate(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
  LOOM_CUDA_CHECK(cudaMemsetAsync(a, 0x5A, 1000, current_stream(0)));
  std::vector<uint8_t> back(1000);
  copy_bytes(back.data(), Device::cpu(), a, Device::cuda(0), back.size(), current_stream(0));
  EXPECT_EQ(back, std::vector<uint8_t>(1000, 0x5A));
  allocator.deallocate(a, 1000);
  void* again = allocator.allocate(1000);
  EXPECT_EQ(again, a);
  CachingStats after = allocator.caching_stats();
  EXPECT_GE(after.cache_hits, before.cache_hits + 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes + 1024);
  allocator.deallocate(again, 1000);
  EXPECT_EQ(allocator.caching_stats().allocated_bytes, before.allocated_bytes);
}

TEST(CudaCachingAllocator, RecordStreamHoldsTheBlockUntilTheOtherStreamPasses) {
  LOOM_REQUIRE_CUDA();
  CachingAllocator& allocator = caching_allocator(0);
  DeviceGuard device(0);
  // a and x are neighbours in one small segment; x is cached before the comm stream is held,
  // so that no cudaMalloc runs while the stream waits.
  void* a = allocator.allocate(1 << 20);
  void* x = allocator.allocate(1 << 20);
  allocator.deallocate(x, 1 << 20);
  auto gate = std::make_unique<StreamGate>(comm_stream(0));
  record_stream(a, comm_stream(0));
  allocator.deallocate(a, 1 << 20);
  void* b = allocator.allocate(1 << 20);
  EXPECT_NE(b, a);  // the comm stream may still be using a
  gate->open();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(comm_stream(0)));
  // Now a is free again: allocating 1 MiB blocks hands it out before long.
  std::vector<void*> taken;
  bool found = false;
  for (int i = 0; i < 256 && !found; ++i) {
    taken.push_back(allocator.allocate(1 << 20));
    found = taken.back() == a;
  }
  EXPECT_TRUE(found);
  for (void* ptr : taken)
    allocator.deallocate(ptr, 1 << 20);
  allocator.deallocate(b, 1 << 20);
}

TEST(CudaCachingAllocator, EmptyCacheAndOutOfMemory) {
  LOOM_REQUIRE_CUDA();
  CachingAllocator& allocator = caching_allocator(0);
  void* big = allocator.allocate(64 << 20);
  allocator.deallocate(big, 64 << 20);
  size_t reserved = allocator.caching_stats().reserved_bytes;
  empty_cache();
  EXPECT_LE(allocator.caching_stats().reserved_bytes + (64 << 20), reserved);
  try {
    allocator.allocate(size_t{1} << 44);  // 16 TiB
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 out of memory"), std::string::npos) << e.what();
  }
  // The failure leaves the device usable.
  void* small = allocator.allocate(4096);
  EXPECT_NE(small, nullptr);
  allocator.deallocate(small, 4096);
}

TEST(CudaPinned, BuffersArePinnedAndReused) {
  LOOM_REQUIRE_CUDA();
  void* first = nullptr;
  {
    PinnedBuffer buffer(10000);
    EXPECT_EQ(buffer.bytes(), 10000u);
    first = buffer.get();
    cudaPointerAttributes attributes{};
    LOOM_CUDA_CHECK(cudaPointerGetAttributes(&attributes, first));
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  }
  PinnedStats before = pinned_stats();
  PinnedBuffer again(9000);  // same size class (16 KiB)
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pinned_stats().cache_hits, before.cache_hits + 1);
  EXPECT_EQ(PinnedBuffer(0).get(), nullptr);
}

TEST(CudaPinned, ReleasedBufferWaitsForItsStream) {
  LOOM_REQUIRE_CUDA();
  DeviceGuard device(0);
  cudaStream_t stream = comm_stream(0);
  auto gate = std::make_unique<StreamGate>(stream);
  void* held = nullptr;
  {
    PinnedBuffer buffer(1 << 16);
    held = buffer.get();
    buffer.record_stream(stream);
  }
  PinnedBuffer other(1 << 16);
  EXPECT_NE(other.get(), held);  // the stream may still use `held`
  gate->open();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  PinnedBuffer reused(1 << 16);
  EXPECT_EQ(reused.get(), held);
}

// Sizes: below one staging chunk, and several chunks with an odd tail.
class CudaCopy : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaCopy, RoundTripsThroughEveryDirection) {
  LOOM_REQUIRE_CUDA();
  size_t n = GetParam();
  cudaStream_t stream = compute_stream(0);
  Allocator& device_memory = caching_allocator(0);
  std::vector<uint8_t> source = pattern(n, 7);
  std::vector<uint8_t> expected = source;

  // pageable -> device; the source may be reused as soon as the call returns.
  void* d1 = device_memory.allocate(n);
  copy_bytes(d1, Device::cuda(0), source.data(), Device::cpu(), n, stream);
  std::fill(source.begin(), source.end(), uint8_t{0});

  // device -> device, same device.
  void* d2 = device_memory.allocate(n);
  copy_bytes(d2, Device::cuda(0), d1, Device::cuda(0), n, stream);

  // device -> pageable: complete on return.
  std::vector<uint8_t> pageable(n);
  copy_bytes(pageable.data(), Device::cpu(), d2, Device::cuda(0), n, stream);
  EXPECT_EQ(pageable, expected);

  // device -> pinned: asynchronous, complete after synchronising the stream.
  PinnedBuffer pinned(n);
  copy_bytes(pinned.get(), Device::cpu(), d2, Device::cuda(0), n, stream);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(std::vector<uint8_t>(static_cast<uint8_t*>(pinned.get()),
                                 static_cast<uint8_t*>(pinned.get()) + n),
            expected);

  // pinned -> device.
  void* d3 = device_memory.allocate(n);
  copy_bytes(d3, Device::cuda(0), pinned.get(), Device::cpu(), n, stream);
  std::vector<uint8_t> back(n);
  copy_bytes(back.data(), Device::cpu(), d3, Device::cuda(0), n, stream);
  EXPECT_EQ(back, expected);

  // host -> host.
  std::vector<uint8_t> host_copy(n);
  copy_bytes(host_copy.data(), Device::cpu(), expected.data(), Device::cpu(), n, stream);
  EXPECT_EQ(host_copy, expected);

  synchronize(0);
  device_memory.deallocate(d1, n);
  device_memory.deallocate(d2, n);
  device_memory.deallocate(d3, n);
}

TEST_P(CudaCopy, BetweenTwoDevices) {
  LOOM_REQUIRE_CUDA();
  if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  size_t n = GetParam();
  std::vector<uint8_t> source = pattern(n, 3);
  void* on0 = caching_allocator(0).allocate(n);
  void* on1 = caching_allocator(1).allocate(n);
  copy_bytes(on0, Device::cuda(0), source.data(), Device::cpu(), n, compute_stream(0));
  synchronize(0);  // the copy below runs on device 1's stream
  copy_bytes(on1, Device::cuda(1), on0, Device::cuda(0), n, compute_stream(1));
  std::vector<uint8_t> back(n);
  copy_bytes(back.data(), Device::cpu(), on1, Device::cuda(1), n, compute_stream(1));
  EXPECT_EQ(back, source);
  caching_allocator(0).deallocate(on0, n);
  caching_allocator(1).deallocate(on1, n);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaCopy,
                         ::testing::Values(size_t{1}, size_t{1000}, size_t{(9 << 20) + 7}));

TEST(CudaCopyArguments, ZeroBytesIsANoOpAndNullIsAnError) {
  LOOM_REQUIRE_CUDA();
  copy_bytes(nullptr, Device::cuda(0), nullptr, Device::cpu(), 0, compute_stream(0));
  uint8_t byte = 0;
  EXPECT_THROW(copy_bytes(nullptr, Device::cuda(0), &byte, Device::cpu(), 1, compute_stream(0)),
               Error);
}

}  // namespace
}  // namespace loom::cuda
