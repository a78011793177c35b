// The CUDA caching allocator's bookkeeping (Note [Caching allocator]), run against a fake
// driver so that it is tested on machines without a GPU: the fake hands out addresses that
// are never dereferenced, fails mallocs beyond a capacity, and completes events only when a
// test says so.

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/device.h"

namespace loom::cuda {
namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

cudaStream_t fake_stream(uintptr_t id) {
  return reinterpret_cast<cudaStream_t>(id);
}

const cudaStream_t kStreamA = fake_stream(0xA0);
const cudaStream_t kStreamB = fake_stream(0xB0);
const cudaStream_t kStreamC = fake_stream(0xC0);

// What the fake driver did, inspected by the tests. Owned by the fixture, which outlives
// the allocator.
struct FakeDevice {
  size_t capacity = SIZE_MAX;  // mallocs beyond this many live bytes fail
  size_t used = 0;
  uintptr_t next_address = uintptr_t{1} << 32;
  std::map<uintptr_t, size_t> segments;  // live mallocs: address -> size
  size_t failed_mallocs = 0;
  size_t event_queries = 0;
  cudaStream_t current = kStreamA;

  struct FakeEvent {
    cudaStream_t stream;
    bool done = false;
    bool destroyed = false;
  };
  std::vector<FakeEvent> events;  // handle = index + 1

  void complete_events_on(cudaStream_t stream) {
    for (FakeEvent& event : events) {
      if (event.stream == stream) event.done = true;
    }
  }
  size_t live_events() const {
    size_t live = 0;
    for (const FakeEvent& event : events)
      live += event.destroyed ? 0 : 1;
    return live;
  }
};

class FakeDriver final : public DeviceMemoryDriver {
 public:
  explicit FakeDriver(FakeDevice* device) : device_(device) {}

  void* malloc(size_t nbytes) override {
    if (nbytes > device_->capacity - device_->used) {
      ++device_->failed_mallocs;
      return nullptr;
    }
    uintptr_t address = device_->next_address;
    // Leave a gap so that separate segments are never adjacent.
    device_->next_address += (nbytes + 4 * MiB - 1) / (4 * MiB) * (4 * MiB) + 4 * MiB;
    device_->segments[address] = nbytes;
    device_->used += nbytes;
    return reinterpret_cast<void*>(address);
  }

  void free(void* ptr) override {
    auto it = device_->segments.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == device_->segments.end()) {
      ADD_FAILURE() << "free of " << ptr << ", which is not the start of a live segment";
      return;
    }
    device_->used -= it->second;
    device_->segments.erase(it);
  }

  EventHandle record_event(cudaStream_t stream) override {
    device_->events.push_back({stream});
    return reinterpret_cast<EventHandle>(device_->events.size());
  }

  bool event_done(EventHandle handle) override {
    ++device_->event_queries;
    return event(handle).done;
  }

  void destroy_event(EventHandle handle) override {
    EXPECT_FALSE(event(handle).destroyed) << "event destroyed twice";
    event(handle).destroyed = true;
  }

  cudaStream_t current_stream() override { return device_->current; }

 private:
  FakeDevice::FakeEvent& event(EventHandle handle) {
    return device_->events.at(reinterpret_cast<uintptr_t>(handle) - 1);
  }

  FakeDevice* device_;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : allocator_(std::make_unique<CachingAllocator>(0, std::make_unique<FakeDriver>(&fake_))) {}

  CachingAllocator& allocator() { return *allocator_; }
  CachingStats stats() const { return allocator_->caching_stats(); }
  void* alloc(size_t nbytes, cudaStream_t stream = kStreamA) {
    return allocator_->allocate_on(nbytes, stream);
  }
  void release(void* ptr, size_t nbytes) { allocator_->deallocate(ptr, nbytes); }

  static char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

  FakeDevice fake_;
  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_F(CachingAllocatorTest, RoundsSizesUpTo512Bytes) {
  void* a = alloc(1);
  void* b = alloc(512);
  void* c = alloc(513);
  void* d = alloc(1000);
  // All four come from one 2 MiB small segment, packed at their rounded sizes.
  EXPECT_EQ(b, at(a, 512));
  EXPECT_EQ(c, at(a, 1024));
  EXPECT_EQ(d, at(a, 2048));
  CachingStats s = stats();
  EXPECT_EQ(s.allocated_bytes, 512u + 512 + 1024 + 1024);
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  EXPECT_EQ(s.device_mallocs, 1u);
  EXPECT_EQ(fake_.segments.size(), 1u);
  EXPECT_EQ(fake_.segments.begin()->second, 2 * MiB);
  // loom::MemoryStats counts the bytes that were asked for.
  EXPECT_EQ(allocator().stats().current_bytes, 1u + 512 + 513 + 1000);
  EXPECT_EQ(allocator().stats().allocations, 4u);
  release(a, 1);
  release(b, 512);
  release(c, 513);
  release(d, 1000);
  EXPECT_EQ(stats().allocated_bytes, 0u);
  EXPECT_EQ(allocator().stats().current_bytes, 0u);
}

TEST_F(CachingAllocatorTest, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  EXPECT_EQ(alloc(0), nullptr);
  EXPECT_EQ(allocator().allocate(0), nullptr);
  release(nullptr, 0);
  EXPECT_EQ(stats().device_mallocs, 0u);
  EXPECT_EQ(allocator().stats().allocations, 0u);
}

TEST_F(CachingAllocatorTest, SegmentSizesOfSmallAndLargePools) {
  void* small = alloc(1 * MiB);  // largest small request: a 2 MiB segment
  EXPECT_EQ(fake_.segments.at(reinterpret_cast<uintptr_t>(small)), 2 * MiB);
  // One byte more goes to the large pool, which never uses the small segment's free half.
  void* large = alloc(1 * MiB + 1);
  EXPECT_EQ(fake_.segments.at(reinterpret_cast<uintptr_t>(large)), 20 * MiB);
  // Requests under 10 MiB share 20 MiB segments.
  void* shared = alloc(9 * MiB);
  EXPECT_EQ(shared, at(large, 1 * MiB + 512));
  EXPECT_EQ(stats().device_mallocs, 2u);
  // From 10 MiB on, a request gets its own segment, rounded up to 2 MiB.
  void* ten = alloc(10 * MiB);
  EXPECT_EQ(fake_.segments.at(reinterpret_cast<uintptr_t>(ten)), 10 * MiB);
  void* eleven = alloc(11 * MiB + 1);
  EXPECT_EQ(fake_.segments.at(reinterpret_cast<uintptr_t>(eleven)), 12 * MiB);
  CachingStats s = stats();
  EXPECT_EQ(s.device_mallocs, 4u);
  EXPECT_EQ(s.reserved_bytes, (2 + 20 + 10 + 12) * MiB);
  // The 12 MiB segment is not split (the rest, 1 MiB - 512 B, is too small to keep), so the
  // whole segment counts as allocated.
  EXPECT_EQ(s.allocated_bytes, 1 * MiB + (1 * MiB + 512) + 9 * MiB + 10 * MiB + 12 * MiB);
  EXPECT_EQ(s.cache_hits, 1u);
}

TEST_F(CachingAllocatorTest, SmallPoolKeepsRemaindersOf512BytesAndMore) {
  void* a = alloc(1 * MiB);
  void* b = alloc(1 * MiB - 512);  // leaves exactly 512 B, which is kept
  void* c = alloc(512);
  EXPECT_EQ(b, at(a, 1 * MiB));
  EXPECT_EQ(c, at(a, 2 * MiB - 512));
  CachingStats s = stats();
  EXPECT_EQ(s.device_mallocs, 1u);
  EXPECT_EQ(s.cache_hits, 2u);
  EXPECT_EQ(s.allocated_bytes, 2 * MiB);
}

TEST_F(CachingAllocatorTest, LargePoolKeepsOnlyRemaindersAbove1MiB) {
  void* a = alloc(2 * MiB);
  void* b = alloc(17 * MiB - 512);  // leaves 1 MiB + 512 B: kept
  void* c = alloc(1 * MiB + 512);   // takes it exactly
  EXPECT_EQ(b, at(a, 2 * MiB));
  EXPECT_EQ(c, at(a, 19 * MiB - 512));
  EXPECT_EQ(stats().device_mallocs, 1u);
  EXPECT_EQ(stats().cache_hits, 2u);
  // 19 MiB in a 20 MiB segment leaves exactly 1 MiB: not kept, the block is 20 MiB.
  void* d = alloc(19 * MiB);
  EXPECT_EQ(stats().device_mallocs, 2u);
  EXPECT_EQ(stats().allocated_bytes, 40 * MiB);
  release(d, 19 * MiB);
  // The whole 20 MiB block is free again: a 20 MiB request is a hit on it.
  EXPECT_EQ(alloc(20 * MiB), d);
  EXPECT_EQ(stats().device_mallocs, 2u);
}

TEST_F(CachingAllocatorTest, FreedBlockIsReusedForTheSameSize) {
  void* a = alloc(4 * KiB);
  release(a, 4 * KiB);
  EXPECT_EQ(alloc(4 * KiB), a);
  CachingStats s = stats();
  EXPECT_EQ(s.device_mallocs, 1u);
  EXPECT_EQ(s.cache_hits, 1u);
}

TEST_F(CachingAllocatorTest, BestFitPicksTheSmallestBlockThatFits) {
  void* big = alloc(8 * KiB);
  void* fence1 = alloc(512);
  void* mid = alloc(4 * KiB);
  void* fence2 = alloc(512);
  ASSERT_EQ(mid, at(big, 8 * KiB + 512));
  release(big, 8 * KiB);
  release(mid, 4 * KiB);
  // Free now: 8 KiB at big, 4 KiB at mid, and the segment's tail (~2 MiB).
  EXPECT_EQ(alloc(3 * KiB), mid);  // 4 KiB block, split: 1 KiB stays free after it
  EXPECT_EQ(alloc(6 * KiB), big);  // the 1 KiB rest is too small, 8 KiB is next
  EXPECT_EQ(alloc(1 * KiB), at(mid, 3 * KiB));
  EXPECT_EQ(alloc(2 * KiB), at(big, 6 * KiB));
  EXPECT_EQ(stats().device_mallocs, 1u);
  EXPECT_EQ(stats().cache_hits, 7u);  // every allocation but the first
  (void)fence1;
  (void)fence2;
}

TEST_F(CachingAllocatorTest, FreeingMergesAdjacentFreeBlocks) {
  void* a = alloc(512 * KiB);
  void* b = alloc(512 * KiB);
  void* c = alloc(512 * KiB);
  ASSERT_EQ(b, at(a, 512 * KiB));
  ASSERT_EQ(c, at(a, 1 * MiB));
  release(b, 512 * KiB);
  release(a, 512 * KiB);
  // a and b merged into one 1 MiB block at a.
  EXPECT_EQ(alloc(1 * MiB), a);
  release(a, 1 * MiB);
  // Freeing c merges with both neighbours (the free 1 MiB before it, the free tail after it),
  // so the segment is one free block again and can be returned.
  release(c, 512 * KiB);
  allocator().empty_cache();
  CachingStats s = stats();
  EXPECT_EQ(s.device_frees, 1u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_TRUE(fake_.segments.empty());
}

// allocation_containing names the block handed out that an address falls in, by its start
// and the bytes asked for it (not the rounded size): from its first byte to its last asked,
// and no more once it is freed.
TEST_F(CachingAllocatorTest, AnAddressNamesTheAllocationItFallsIn) {
  void* a = alloc(1000);  // rounded to 1,024 bytes
  void* b = alloc(512 * KiB);
  ASSERT_EQ(b, at(a, 1024));
  for (size_t offset : {size_t{0}, size_t{1}, size_t{999}}) {
    const auto found = allocator().allocation_containing(at(a, offset));
    ASSERT_TRUE(found.has_value()) << offset;
    EXPECT_EQ(found->base, a);
    EXPECT_EQ(found->bytes, 1000u);
  }
  EXPECT_FALSE(allocator().allocation_containing(at(a, 1000)).has_value());  // the rounding
  const auto in_b = allocator().allocation_containing(at(b, 512 * KiB - 1));
  ASSERT_TRUE(in_b.has_value());
  EXPECT_EQ(in_b->base, b);
  EXPECT_EQ(in_b->bytes, 512 * KiB);
  EXPECT_FALSE(allocator().allocation_containing(at(b, 512 * KiB)).has_value());  // the free rest
  int on_the_host = 0;
  EXPECT_FALSE(allocator().allocation_containing(&on_the_host).has_value());
  release(a, 1000);
  EXPECT_FALSE(allocator().allocation_containing(a).has_value());
  EXPECT_TRUE(allocator().allocation_containing(b).has_value());
  release(b, 512 * KiB);
}

TEST_F(CachingAllocatorTest, BlocksAreReusedOnlyOnTheirStream) {
  void* a = alloc(4 * KiB, kStreamA);
  release(a, 4 * KiB);
  // Stream B may not receive memory that work on stream A may still be using: it gets a new
  // segment, not a's block nor the rest of a's segment.
  void* b = alloc(4 * KiB, kStreamB);
  EXPECT_NE(b, a);
  EXPECT_EQ(fake_.segments.count(reinterpret_cast<uintptr_t>(b)), 1u);
  EXPECT_EQ(stats().device_mallocs, 2u);
  release(b, 4 * KiB);
  EXPECT_EQ(alloc(4 * KiB, kStreamA), a);
  EXPECT_EQ(alloc(4 * KiB, kStreamB), b);
  EXPECT_EQ(stats().cache_hits, 2u);
}

TEST_F(CachingAllocatorTest, AllocateUsesTheDriversCurrentStream) {
  fake_.current = kStreamB;
  void* b = allocator().allocate(100);
  allocator().deallocate(b, 100);
  fake_.current = kStreamA;
  void* a = allocator().allocate(100);
  EXPECT_NE(a, b);
  EXPECT_EQ(stats().device_mallocs, 2u);
  // On stream B again: b's block comes back.
  EXPECT_EQ(alloc(100, kStreamB), b);
}

TEST_F(CachingAllocatorTest, RecordStreamDefersReuseUntilTheEventCompletes) {
  void* a = alloc(1 * MiB);
  allocator().record_stream(a, kStreamB);
  allocator().record_stream(a, kStreamA);  // its own stream: nothing to wait for
  release(a, 1 * MiB);
  ASSERT_EQ(fake_.events.size(), 1u);
  EXPECT_EQ(fake_.events[0].stream, kStreamB);
  EXPECT_EQ(stats().allocated_bytes, 0u);
  EXPECT_EQ(allocator().stats().current_bytes, 0u);

  // Stream B has not passed the event: a's block is not handed out, even on stream A.
  void* b = alloc(1 * MiB);
  EXPECT_EQ(b, at(a, 1 * MiB));  // the other half of the segment
  release(b, 1 * MiB);
  void* c = alloc(1 * MiB);
  EXPECT_EQ(c, b);
  EXPECT_EQ(fake_.live_events(), 1u);

  fake_.complete_events_on(kStreamB);
  void* d = alloc(1 * MiB);  // polls the event first
  EXPECT_EQ(d, a);
  EXPECT_EQ(fake_.live_events(), 0u);
  EXPECT_EQ(stats().device_mallocs, 1u);
}

TEST_F(CachingAllocatorTest, RecordStreamOnTwoStreamsWaitsForBoth) {
  void* a = alloc(1 * MiB);
  void* fence = alloc(1 * MiB);
  allocator().record_stream(a, kStreamB);
  allocator().record_stream(a, kStreamC);
  release(a, 1 * MiB);
  ASSERT_EQ(fake_.events.size(), 2u);
  fake_.complete_events_on(kStreamB);
  void* next = alloc(1 * MiB);
  EXPECT_NE(next, a);  // stream C still owes its event: a new segment
  EXPECT_EQ(stats().device_mallocs, 2u);
  fake_.complete_events_on(kStreamC);
  EXPECT_EQ(alloc(1 * MiB), a);
  (void)fence;
}

TEST_F(CachingAllocatorTest, BlockWaitingForEventsDoesNotMergeOrReturnToTheDriver) {
  void* a = alloc(1 * MiB);
  void* b = alloc(1 * MiB);
  allocator().record_stream(a, kStreamB);
  release(a, 1 * MiB);
  release(b, 1 * MiB);
  allocator().empty_cache();  // a still waits for stream B: the segment stays
  EXPECT_EQ(stats().device_frees, 0u);
  EXPECT_EQ(stats().reserved_bytes, 2 * MiB);
  fake_.complete_events_on(kStreamB);
  allocator().empty_cache();  // polls, merges a with b, returns the segment
  EXPECT_EQ(stats().device_frees, 1u);
  EXPECT_EQ(stats().reserved_bytes, 0u);
  EXPECT_TRUE(fake_.segments.empty());
}

TEST_F(CachingAllocatorTest, RecordStreamOfAnUnknownPointerThrows) {
  void* a = alloc(512);
  EXPECT_TRUE(allocator().owns(a));
  EXPECT_FALSE(allocator().owns(at(a, 512)));
  try {
    allocator().record_stream(at(a, 512), kStreamB);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a live allocation of the cuda:0 caching"),
              std::string::npos)
        << e.what();
  }
  release(a, 512);
  EXPECT_FALSE(allocator().owns(a));
  EXPECT_THROW(allocator().record_stream(a, kStreamB), Error);
}

TEST_F(CachingAllocatorTest, OutOfMemoryFreesTheCacheAndRetriesOnce) {
  fake_.capacity = 21 * MiB;
  void* small = alloc(1 * MiB);
  release(small, 1 * MiB);        // its 2 MiB segment stays cached
  void* large = alloc(20 * MiB);  // 2 + 20 > 21: fails, releases the cache, succeeds
  EXPECT_NE(large, nullptr);
  EXPECT_EQ(fake_.failed_mallocs, 1u);
  CachingStats s = stats();
  EXPECT_EQ(s.device_mallocs, 2u);
  EXPECT_EQ(s.device_frees, 1u);
  EXPECT_EQ(s.reserved_bytes, 20 * MiB);
  EXPECT_EQ(s.peak_reserved_bytes, 20 * MiB);
  EXPECT_EQ(s.allocated_bytes, 20 * MiB);
}

TEST_F(CachingAllocatorTest, OutOfMemoryErrorReportsTheRequestAndTheAllocatorState) {
  fake_.capacity = 21 * MiB;
  void* held = alloc(1 * MiB);  // its segment is in use, so nothing can be released
  try {
    alloc(20 * MiB);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    std::string text = e.what();
    EXPECT_EQ(text,
              "[cuda] cuda:0 out of memory: cannot allocate 20.00 MiB (20971520 bytes "
              "requested, needing a new 20.00 MiB segment). The caching allocator has 1.00 MiB "
              "(1048576 bytes) allocated and 2.00 MiB (2097152 bytes) reserved after returning "
              "its unused cached segments to the driver; the rest of the device is held by "
              "other processes or libraries. Use a smaller batch or micro-batch size (or "
              "activation checkpointing), or release tensors that are no longer needed.");
  }
  EXPECT_EQ(fake_.failed_mallocs, 2u);  // the first try and the retry
  // The failure left the allocator consistent: once `held` is freed, the retry succeeds.
  EXPECT_EQ(stats().allocated_bytes, 1 * MiB);
  EXPECT_EQ(allocator().stats().current_bytes, 1 * MiB);
  release(held, 1 * MiB);
  EXPECT_NE(alloc(20 * MiB), nullptr);
  EXPECT_EQ(stats().reserved_bytes, 20 * MiB);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsOnlyUnusedSegments) {
  void* small = alloc(1 * KiB);
  void* large = alloc(4 * MiB);
  void* own = alloc(24 * MiB);  // too big for the rest of large's segment: its own segment
  EXPECT_EQ(stats().reserved_bytes, (2 + 20 + 24) * MiB);
  release(large, 4 * MiB);
  release(own, 24 * MiB);
  allocator().empty_cache();
  CachingStats s = stats();
  EXPECT_EQ(s.device_frees, 2u);
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  ASSERT_EQ(fake_.segments.size(), 1u);
  EXPECT_EQ(fake_.segments.begin()->first, reinterpret_cast<uintptr_t>(small));
  release(small, 1 * KiB);
  allocator().empty_cache();
  EXPECT_EQ(stats().device_frees, 3u);
  EXPECT_EQ(stats().reserved_bytes, 0u);
  EXPECT_TRUE(fake_.segments.empty());
  // The next allocation goes to the driver again.
  alloc(1 * KiB);
  EXPECT_EQ(stats().device_mallocs, 4u);
}

TEST_F(CachingAllocatorTest, StatsTrackPeaksUntilReset) {
  void* a = alloc(1 * MiB);
  void* b = alloc(3 * MiB);
  CachingStats s = stats();
  EXPECT_EQ(s.allocated_bytes, 4 * MiB);
  EXPECT_EQ(s.reserved_bytes, 22 * MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 4 * MiB);
  EXPECT_EQ(s.peak_reserved_bytes, 22 * MiB);
  release(b, 3 * MiB);
  s = stats();
  EXPECT_EQ(s.allocated_bytes, 1 * MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 4 * MiB);
  EXPECT_EQ(allocator().stats().peak_bytes, 4 * MiB);

  allocator().reset_peak_stats();
  s = stats();
  EXPECT_EQ(s.peak_allocated_bytes, 1 * MiB);
  EXPECT_EQ(s.peak_reserved_bytes, 22 * MiB);
  EXPECT_EQ(allocator().stats().peak_bytes, 1 * MiB);

  allocator().empty_cache();
  s = stats();
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  EXPECT_EQ(s.peak_reserved_bytes, 22 * MiB);
  allocator().reset_peak_stats();
  EXPECT_EQ(stats().peak_reserved_bytes, 2 * MiB);

  s = stats();
  EXPECT_EQ(s.device_mallocs, 2u);
  EXPECT_EQ(s.device_frees, 1u);
  EXPECT_EQ(s.cache_hits, 0u);
  release(a, 1 * MiB);
}

TEST_F(CachingAllocatorTest, DestructionReturnsEverySegmentAndEvent) {
  void* a = alloc(1 * KiB);
  alloc(30 * MiB);  // never freed: the allocator's owner is gone
  allocator().record_stream(a, kStreamB);
  release(a, 1 * KiB);
  EXPECT_EQ(fake_.live_events(), 1u);
  allocator_.reset();
  EXPECT_TRUE(fake_.segments.empty());
  EXPECT_EQ(fake_.live_events(), 0u);
}

TEST_F(CachingAllocatorTest, ConcurrentAllocationsNeverOverlap) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<std::vector<std::pair<uintptr_t, size_t>>> seen(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::pair<void*, size_t>> live;
      cudaStream_t stream = t % 2 == 0 ? kStreamA : kStreamB;
      for (int round = 0; round < kRounds; ++round) {
        if (!live.empty() && random() % 2 == 0) {
          size_t index = random() % live.size();
          allocator().deallocate(live[index].first, live[index].second);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
        } else {
          size_t nbytes = 1 + random() % (3 * MiB);
          live.emplace_back(alloc(nbytes, stream), nbytes);
        }
      }
      for (auto& [ptr, nbytes] : live) {
        seen[static_cast<size_t>(t)].emplace_back(reinterpret_cast<uintptr_t>(ptr), nbytes);
      }
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  // The blocks still held by all threads are disjoint.
  std::map<uintptr_t, size_t> held;
  size_t requested = 0;
  for (auto& list : seen) {
    for (auto& [address, nbytes] : list) {
      held[address] = nbytes;
      requested += nbytes;
    }
  }
  uintptr_t end = 0;
  for (auto& [address, nbytes] : held) {
    EXPECT_GE(address, end);
    end = address + nbytes;
  }
  EXPECT_EQ(allocator().stats().current_bytes, requested);
  for (auto& [address, nbytes] : held) {
    allocator().deallocate(reinterpret_cast<void*>(address), nbytes);
  }
  EXPECT_EQ(stats().allocated_bytes, 0u);
  allocator().empty_cache();
  EXPECT_EQ(stats().reserved_bytes, 0u);
  EXPECT_TRUE(fake_.segments.empty());
}

// The per-device allocators need a device; without one they explain why.
// Note [Private pools for graph capture].
TEST_F(CachingAllocatorTest, CaptureAllocatesFromAPrivatePoolOnlyForItsStream) {
  void* cached = alloc(4 * KiB, kStreamB);
  release(cached, 4 * KiB);  // a free block of the shared cache, for stream B
  void* cached_a = alloc(4 * KiB);
  release(cached_a, 4 * KiB);  // and one for stream A
  const PoolId pool = allocator().begin_capture(kStreamA);
  EXPECT_NE(pool, 0u);
  void* first = alloc(4 * KiB);
  EXPECT_NE(first, cached_a) << "the capture takes nothing from the shared cache";
  EXPECT_EQ(stats().device_mallocs, 3u);
  EXPECT_EQ(alloc(4 * KiB, kStreamB), cached) << "other streams still use the shared cache";
  release(first, 4 * KiB);
  EXPECT_EQ(alloc(4 * KiB), first) << "what the capture freed, it reuses";
  allocator().end_capture();
  // The capture's memory stays private while its graph may replay, freed or not.
  void* after = alloc(4 * KiB);
  EXPECT_EQ(after, cached_a);
  EXPECT_NE(alloc(4 * KiB), first);
  release(first, 4 * KiB);
  EXPECT_NE(alloc(4 * KiB), first);
  // Released (the graph is gone), the pool's segment joins the shared cache: once stream A's
  // shared segment (2 MiB less three 4 KiB blocks) cannot hold 1 MiB, it serves the request.
  allocator().release_pool(pool);
  const size_t mallocs = stats().device_mallocs;
  EXPECT_NE(alloc(1 * MiB), first);
  EXPECT_EQ(alloc(1 * MiB), first);
  EXPECT_EQ(stats().device_mallocs, mallocs);
  EXPECT_THROW(allocator().release_pool(pool), Error);
}

TEST_F(CachingAllocatorTest, PoolBlocksHandedOutAtReleaseReturnToTheSharedCache) {
  const PoolId pool = allocator().begin_capture(kStreamA);
  void* kept = alloc(8 * MiB);  // a result of the capture, alive after it
  allocator().end_capture();
  allocator().release_pool(pool);
  release(kept, 8 * MiB);
  EXPECT_EQ(alloc(8 * MiB), kept);
  EXPECT_EQ(stats().device_mallocs, 1u);
}

TEST_F(CachingAllocatorTest, DuringACaptureNoEventIsQueriedAndNothingReturnsToTheDriver) {
  fake_.capacity = 21 * MiB;
  void* shared = alloc(4 * KiB, kStreamB);
  allocator().record_stream(shared, kStreamC);
  release(shared, 4 * KiB);  // waits for an event on stream C
  void* cached = alloc(1 * MiB);
  release(cached, 1 * MiB);  // a cached segment the out-of-memory path would return
  const size_t queries = fake_.event_queries;
  const PoolId pool = allocator().begin_capture(kStreamA);
  alloc(1 * KiB);
  EXPECT_EQ(fake_.event_queries, queries);
  EXPECT_THROW(alloc(20 * MiB), Error);
  EXPECT_EQ(stats().device_frees, 0u) << "out of memory, but the cache is kept";
  EXPECT_THROW(allocator().empty_cache(), Error);
  EXPECT_THROW(allocator().begin_capture(kStreamB), Error) << "captures do not overlap";
  EXPECT_THROW(allocator().release_pool(pool), Error) << "still capturing";
  allocator().end_capture();
  alloc(1 * KiB);
  EXPECT_GT(fake_.event_queries, queries);
  allocator().release_pool(pool);
}

TEST(CachingAllocatorWithoutDevice, GlobalAllocatorExplainsWhyThereIsNone) {
  if (is_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    caching_allocator(0);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device is available"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(allocator_for(Device::cuda(0)), Error);
  empty_cache();  // nothing created: nothing to do, no throw
  EXPECT_THROW(record_stream(reinterpret_cast<void*>(0x1000), kStreamA), Error);
}

}  // namespace
}  // namespace loom::cuda
