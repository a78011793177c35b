#pragma once
// CUDA's device built-ins for kernels compiled as host C++ against the emulator: the thread
// and block indices, barriers, warp shuffles and votes, traps and the intrinsics Loom's
// kernels use (Note [Kernel emulation] in emulator.cpp).

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

// NVIDIA's headers first, whichever file is included first: they must never be parsed
// after the macros below.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "emulator.h"

#define threadIdx (::loom::cuda_emulation::this_thread().thread_idx)
#define blockIdx (::loom::cuda_emulation::this_thread().block_idx)
#define blockDim (::loom::cuda_emulation::this_thread().block_dim)
#define gridDim (::loom::cuda_emulation::this_thread().grid_dim)

inline constexpr int warpSize = 32;

inline void __syncthreads() { ::loom::cuda_emulation::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::loom::cuda_emulation::sync_warp(mask); }
inline unsigned __activemask() { return ::loom::cuda_emulation::active_mask(); }
[[noreturn]] inline void __trap() { ::loom::cuda_emulation::trap(); }

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16);
  ::loom::cuda_emulation::shuffle_xor(mask, &value, sizeof(T), lane_mask, width);
  return value;
}

inline int __all_sync(unsigned mask, int predicate) {
  return ::loom::cuda_emulation::vote_all(mask, predicate);
}

// Round-to-nearest arithmetic that the device never fuses into an FMA; the emulated sources
// are compiled with -ffp-contract=off, so the host does not fuse them either.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }

inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline double __longlong_as_double(long long v) { return std::bit_cast<double>(v); }
inline long long __double_as_longlong(double v) { return std::bit_cast<long long>(v); }

// The typed overloads nvcc's cuda_runtime.h gives kernels (it omits them for host compilers).
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attribute, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}
template <typename T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, T* kernel) {
  return ::cudaFuncGetAttributes(attributes, reinterpret_cast<const void*>(kernel));
}
