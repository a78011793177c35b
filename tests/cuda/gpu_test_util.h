#pragma once
// What the tests of tests/cuda/ that need a GPU share: the skip where there is none, the
// device, and seeded inputs. They also run on the emulated device (tests/cuda_emulation).

#include <gtest/gtest.h>

#include <cstdint>

#include "tensor/cuda/device.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

#define SKIP_WITHOUT_GPU()                                                           \
  if (!::loom::cuda::is_available())                                                 \
  GTEST_SKIP() << "no CUDA device: " << ::loom::cuda::unavailable_reason()

namespace loom::gpu_test {

inline const Device kGpu = Device::cuda(0);

// An f32 CPU tensor of N(0, 1) values from `seed`.
inline Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape);
  normal_(t, 0.0, 1.0, gen);
  return t;
}

}  // namespace loom::gpu_test
