// The stream-order check (Note [The stream-order check] in runtime/stream_order.h): work on two
// streams that touches one allocation, one of them writing, is reported unless an event, a
// stream's order or a host wait puts one after the other; two reads are never reported.

#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "emulator.h"
#include "stream_order.h"

namespace emu = loom::cuda_emulation;

namespace {

void add_value(float* data, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += value;
}

void sum_into(const float* from, float* into, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) into[i] += from[i];
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { EXPECT_EQ(cudaEventCreate(&e), cudaSuccess); }
  ~Event() { cudaEventDestroy(e); }
};

// Two "device" buffers the check's lookup knows, and a host one it does not.
struct Buffers {
  std::vector<float> a = std::vector<float>(32, 1.0f), b = std::vector<float>(32, 2.0f),
                     host = std::vector<float>(32, 0.0f);
  std::optional<emu::Allocation> operator()(const void* address) const {
    for (const std::vector<float>* buffer : {&a, &b}) {
      const auto* start = reinterpret_cast<const char*>(buffer->data());
      const auto* p = static_cast<const char*>(address);
      if (p >= start && p < start + buffer->size() * sizeof(float))
        return emu::Allocation{buffer->data(), buffer->size() * sizeof(float)};
    }
    return std::nullopt;
  }
};

constexpr size_t kBytes = 32 * sizeof(float);

// Adds 1 to a buffer's 32 floats on `stream`: a kernel that writes it.
void add_one(std::vector<float>& buffer, cudaStream_t stream) {
  emu::launch("add_value", add_value, 1, 32, 0, stream)(buffer.data(), 1.0f, 32);
}

// Copies buffer `a` to the host buffer on `stream`: a copy that reads it.
void download_a(Buffers& buffers, cudaStream_t stream) {
  ASSERT_EQ(cudaMemcpyAsync(buffers.host.data(), buffers.a.data(), kBytes, cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
}

// Two streams named as Loom's, two buffers, an event, and a check over them.
class StreamOrder : public ::testing::Test {
 protected:
  StreamOrder() {
    check.name(compute.s, "the compute stream");
    check.name(copies.s, "the copy stream");
  }
  Buffers buffers;
  Stream compute, copies;
  Event written;
  emu::StreamOrderCheck check{std::cref(buffers)};
};

TEST_F(StreamOrder, AWriteOnOneStreamAndAReadOnAnotherRaceWithoutAnEvent) {
  add_one(buffers.a, compute.s);
  download_a(buffers, copies.s);
  const std::vector<std::string> races = check.races();
  ASSERT_EQ(races.size(), 1u);
  EXPECT_NE(races[0].find("cudaMemcpyAsync host to host on the copy stream read 128 bytes"),
            std::string::npos)
      << races[0];
  EXPECT_NE(races[0].find("that add_value on the compute stream wrote before"), std::string::npos)
      << races[0];
  // The same pair again is not reported twice.
  download_a(buffers, copies.s);
  EXPECT_EQ(check.races().size(), 1u);
}

TEST_F(StreamOrder, AReadThenAWriteOnAnotherStreamRaceToo) {
  emu::launch("sum_into", sum_into, 1, 32, 0, compute.s)(buffers.a.data(), buffers.b.data(), 32);
  add_one(buffers.a, copies.s);
  const std::vector<std::string> races = check.races();
  ASSERT_EQ(races.size(), 1u);
  EXPECT_NE(races[0].find("add_value on the copy stream wrote 128 bytes"), std::string::npos)
      << races[0];
  EXPECT_NE(races[0].find("that sum_into on the compute stream read before"), std::string::npos)
      << races[0];
}

TEST_F(StreamOrder, TwoReadsOnTwoStreamsDoNotRace) {
  emu::launch("sum_into", sum_into, 1, 32, 0, compute.s)(buffers.a.data(), buffers.b.data(), 32);
  download_a(buffers, copies.s);
  EXPECT_TRUE(check.races().empty());
}

TEST_F(StreamOrder, AnEventWaitedForByTheSecondStreamOrdersThem) {
  add_one(buffers.a, compute.s);
  ASSERT_EQ(cudaEventRecord(written.e, compute.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(copies.s, written.e, 0), cudaSuccess);
  download_a(buffers, copies.s);
  // The event captured only what came before it: a later write on compute races the copy.
  EXPECT_TRUE(check.races().empty());
  add_one(buffers.a, compute.s);
  EXPECT_EQ(check.races().size(), 1u);
}

TEST_F(StreamOrder, TheHostsWaitsOrderWhatIsIssuedAfterThem) {
  add_one(buffers.a, compute.s);
  ASSERT_EQ(cudaEventRecord(written.e, compute.s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(written.e), cudaSuccess);
  add_one(buffers.a, copies.s);
  add_one(buffers.b, compute.s);
  ASSERT_EQ(cudaStreamSynchronize(compute.s), cudaSuccess);
  add_one(buffers.b, copies.s);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  add_one(buffers.b, compute.s);
  EXPECT_TRUE(check.races().empty()) << check.races()[0];
  // Memory the lookup does not know (host memory) is not followed.
  add_one(buffers.host, compute.s);
  add_one(buffers.host, copies.s);
  EXPECT_TRUE(check.races().empty());
}

}  // namespace
