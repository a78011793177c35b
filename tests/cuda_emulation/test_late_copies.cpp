// Copies between device memory and page-locked host memory on a stream land when something
// orders them after (Note [Copies to and from pinned memory land late] in
// runtime/late_copies.h): a host that reads the destination before waiting sees the old bytes.

#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emulator.h"
#include "work_log.h"

namespace emu = loom::cuda_emulation;

namespace {

void set_value(float* data, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = value;
}

constexpr int kCount = 16;
constexpr size_t kBytes = kCount * sizeof(float);

// A device buffer of kCount floats set to `value`, a page-locked host one of zeros, a stream.
struct Buffers {
  float* device = nullptr;
  float* pinned = nullptr;
  cudaStream_t stream = nullptr;
  explicit Buffers(float value) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), kBytes), cudaSuccess);
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, cudaHostAllocDefault),
              cudaSuccess);
    for (int i = 0; i < kCount; ++i)
      pinned[i] = 0.0f;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    emu::launch("set_value", set_value, 1, kCount, 0, stream)(device, value, kCount);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  ~Buffers() {
    cudaStreamDestroy(stream);
    cudaFreeHost(pinned);
    cudaFree(device);
  }
  void download() {
    ASSERT_EQ(cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  }
};

TEST(LateCopies, ADownloadIntoPinnedMemoryLandsWhenTheHostWaitsForItsStream) {
  Buffers s(3.0f);
  s.download();
  EXPECT_EQ(s.pinned[0], 0.0f);  // a host read before the wait: the old bytes
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(s.pinned[0], 3.0f);
  EXPECT_EQ(s.pinned[kCount - 1], 3.0f);
}

TEST(LateCopies, ADownloadLandsWhenTheHostWaitsForAnEventAfterIt) {
  Buffers s(5.0f);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  s.download();
  ASSERT_EQ(cudaEventRecord(done, s.stream), cudaSuccess);
  EXPECT_EQ(s.pinned[0], 0.0f);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_EQ(s.pinned[0], 5.0f);
  cudaEventDestroy(done);
}

TEST(LateCopies, LaterWorkOnTheSameStreamComesAfterTheCopy) {
  Buffers s(7.0f);
  s.download();
  float* other = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&other), kBytes), cudaSuccess);
  // Back up from the same page-locked buffer, on the same stream: the download came first.
  ASSERT_EQ(cudaMemcpyAsync(other, s.pinned, kBytes, cudaMemcpyHostToDevice, s.stream),
            cudaSuccess);
  emu::launch("set_value", set_value, 1, kCount, 0, s.stream)(s.device, 0.0f, kCount);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  std::vector<float> back(kCount, 0.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), other, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 7.0f);
  cudaFree(other);
}

TEST(LateCopies, AnUploadReadsItsSourceWhenItLandsNotWhenIssued) {
  Buffers s(1.0f);
  for (int i = 0; i < kCount; ++i)
    s.pinned[i] = 2.0f;
  ASSERT_EQ(cudaMemcpyAsync(s.device, s.pinned, kBytes, cudaMemcpyHostToDevice, s.stream),
            cudaSuccess);
  s.pinned[0] = 9.0f;  // written before the upload was waited for: a race on a GPU
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  std::vector<float> back(kCount, 0.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), s.device, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 9.0f);
  EXPECT_EQ(back[1], 2.0f);
}

// cudaMemcpy2DAsync lands as cudaMemcpyAsync does, and is named by direction the same way.
TEST(LateCopies, A2DDownloadLandsLateAndIsNamedByItsDirection) {
  Buffers s(6.0f);
  emu::WorkLog log;
  // kCount / 4 rows: the first 2 floats of every 4 on the device, packed into pinned memory.
  ASSERT_EQ(cudaMemcpy2DAsync(s.pinned, 2 * sizeof(float), s.device, 4 * sizeof(float),
                              2 * sizeof(float), kCount / 4, cudaMemcpyDeviceToHost, s.stream),
            cudaSuccess);
  EXPECT_EQ(s.pinned[0], 0.0f);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(s.pinned[0], 6.0f);
  EXPECT_EQ(s.pinned[kCount / 2 - 1], 6.0f);
  EXPECT_EQ(s.pinned[kCount / 2], 0.0f);  // beyond the rows copied
  std::vector<std::string> copies;
  for (const emu::Work& w : log.entries())
    if (w.kind == emu::WorkKind::kCopy) copies.push_back(w.name);
  EXPECT_EQ(copies, std::vector<std::string>{"cudaMemcpy2DAsync device to host"});
}

TEST(LateCopies, PageableMemoryAndTheLegacyStreamLandAtOnce) {
  Buffers s(4.0f);
  std::vector<float> pageable(kCount, 0.0f);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), s.device, kBytes, cudaMemcpyDeviceToHost, s.stream),
            cudaSuccess);
  EXPECT_EQ(pageable[0], 4.0f);
  ASSERT_EQ(cudaMemcpyAsync(s.pinned, s.device, kBytes, cudaMemcpyDeviceToHost, nullptr),
            cudaSuccess);
  EXPECT_EQ(s.pinned[0], 4.0f);
}

}  // namespace
