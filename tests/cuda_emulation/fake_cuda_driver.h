#pragma once
// A fake CUDA runtime for the device runtime's own logic (tensor/cuda/device.cpp and
// stream.cpp), linked in place of libcudart: two devices whose streams run nothing until a
// test says their work finished, so that the ordering rules (events, waits, per-device
// streams, guards) can be checked where there is no GPU. Only the calls that code makes
// exist; a new call is a link error.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace loom::fake_cuda {

constexpr int kDevices = 2;

// Work queued on `stream` that has not finished yet (what a kernel launch would add).
void enqueue(cudaStream_t stream);
// Everything queued on `stream` so far finishes.
void finish(cudaStream_t stream);

struct Counts {
  int streams_created = 0;
  int events_created = 0;
  int events_destroyed = 0;
  int stream_waits = 0;
};
const Counts& counts();
unsigned stream_flags(cudaStream_t stream);

}  // namespace loom::fake_cuda
