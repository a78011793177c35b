#pragma once
// The one checker for CUDA runtime calls and the one for cuBLAS(Lt) calls. A failed call
// throws loom::Error naming the call, where it was made, and the library's own message:
//   LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   LOOM_CUDA_CHECK(cudaGetLastError());  // after every kernel launch
// Destructors of RAII handles use LOOM_CUDA_WARN instead, which reports to stderr and never
// throws. Header-only, so that kernels and runtime share it without a link dependency.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdio>

#include "core/error.h"
#include "core/tags.h"

namespace loom::cuda_detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  fail("CUDA call ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (",
       cudaGetErrorString(status), ")");
}

inline const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  fail("cuBLAS call ", call, " failed at ", file, ":", line, ": ", cublas_status_name(status),
       " (", static_cast<int>(status), ")");
}

inline void warn_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  std::fprintf(stderr, "%swarning: CUDA call %s failed at %s:%d during cleanup: %s\n",
               tag::kLoom.prefix().c_str(), call, file, line, cudaGetErrorString(status));
}

}  // namespace loom::cuda_detail

#define LOOM_CUDA_CHECK(call)                                                       \
  do {                                                                              \
    cudaError_t loom_status_ = (call);                                              \
    if (loom_status_ != cudaSuccess)                                                \
      ::loom::cuda_detail::throw_cuda_error(loom_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define LOOM_CUBLAS_CHECK(call)                                                       \
  do {                                                                                \
    cublasStatus_t loom_status_ = (call);                                             \
    if (loom_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::loom::cuda_detail::throw_cublas_error(loom_status_, #call, __FILE__, __LINE__); \
  } while (0)

// For destructors and other noexcept cleanup paths: reports, never throws.
#define LOOM_CUDA_WARN(call)                                                       \
  do {                                                                             \
    cudaError_t loom_status_ = (call);                                             \
    if (loom_status_ != cudaSuccess)                                               \
      ::loom::cuda_detail::warn_cuda_error(loom_status_, #call, __FILE__, __LINE__); \
  } while (0)
