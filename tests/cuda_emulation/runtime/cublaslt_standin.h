#pragma once
// What the tests may ask of the emulation's cuBLASLt stand-in (cublaslt_standin.cpp).

namespace loom::cuda_emulation {

// While one lives, the stand-in's heuristic offers no algorithm for a matmul with an epilogue
// (a bias, or column sums), as cuBLASLt's may for a shape or a type, so that the tests reach
// kernels/cuda/gemm.cpp's fallbacks. gemm.cpp keeps a plan per shape: only shapes first
// multiplied while it lives see it. At most one at a time; not thread-safe.
class EpiloguesRefused {
 public:
  EpiloguesRefused();
  ~EpiloguesRefused();
  EpiloguesRefused(const EpiloguesRefused&) = delete;
  EpiloguesRefused& operator=(const EpiloguesRefused&) = delete;
};

}  // namespace loom::cuda_emulation
