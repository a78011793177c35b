#pragma once
// Seeded random initialisation. The stream is defined by Loom (mt19937_64 and Box-Muller),
// not by the C++ library's distributions, so the same seed gives the same weights on every
// platform and compiler.

#include <cstdint>
#include <random>

#include "tensor/tensor.h"

namespace loom {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  double uniform();  // [0, 1) with 53 random bits
  double normal();   // standard normal

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Fills a contiguous floating tensor in place (no autograd).
void normal_(Tensor& t, double mean, double stddev, Generator& gen);
void uniform_(Tensor& t, double low, double high, Generator& gen);

}  // namespace loom
