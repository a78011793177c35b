// cuBLASLt is loaded on first use (Note [cuBLASLt is loaded on first use],
// kernels/cuda/cublaslt_library.h): a program of Loom's CUDA build does not map the library
// until the first CUDA GEMM asks for it, and then has every function Loom calls, from the
// library of the toolkit it was built with. No GPU is needed: loading the library and asking
// its version touch no device. Each test runs in a process of its own (gtest_discover_tests).

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/cublaslt_library.h"
#include "tensor/ops.h"

namespace loom::kernels::cuda {
namespace {

// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLtLibrary, IsNotLoadedByAProgramThatDoesNoCudaGemm) {
  EXPECT_FALSE(mapped("libcublasLt.so"));
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), std::vector<float>({4, 5, 10, 11}));
  EXPECT_FALSE(mapped("libcublasLt.so"));
}

TEST(CublasLtLibrary, FirstUseLoadsTheBuildsVersionWithEveryFunction) {
  EXPECT_EQ(std::string(cublaslt_soname()), "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  const CublasLt& lt = cublaslt();
  EXPECT_TRUE(mapped(cublaslt_soname()));
  for (const void* function : {
           reinterpret_cast<const void*>(lt.get_version),
           reinterpret_cast<const void*>(lt.create),
           reinterpret_cast<const void*>(lt.destroy),
           reinterpret_cast<const void*>(lt.matmul),
           reinterpret_cast<const void*>(lt.matmul_algo_get_heuristic),
           reinterpret_cast<const void*>(lt.matmul_desc_create),
           reinterpret_cast<const void*>(lt.matmul_desc_destroy),
           reinterpret_cast<const void*>(lt.matmul_desc_set_attribute),
           reinterpret_cast<const void*>(lt.matmul_preference_create),
           reinterpret_cast<const void*>(lt.matmul_preference_destroy),
           reinterpret_cast<const void*>(lt.matmul_preference_set_attribute),
           reinterpret_cast<const void*>(lt.matrix_layout_create),
           reinterpret_cast<const void*>(lt.matrix_layout_destroy),
           reinterpret_cast<const void*>(lt.matrix_layout_set_attribute),
       }) {
    EXPECT_NE(function, nullptr);
  }
  // CUBLAS_VERSION's encoding: major * 10000 + minor * 100 + patch.
  EXPECT_EQ(lt.get_version() / 10000, size_t{CUBLAS_VER_MAJOR});
  EXPECT_EQ(&cublaslt(), &lt);  // loaded once
}

}  // namespace
}  // namespace loom::kernels::cuda
