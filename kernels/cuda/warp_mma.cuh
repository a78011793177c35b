#pragma once
// Warp-level tensor-core building blocks in PTX's own register layouts: mma.sync m16n8k16
// (bf16 inputs, f32 accumulators), ldmatrix (plain and transposed) and cp.async with commit
// groups. Unlike WMMA, whose fragments are opaque, these layouts are documented (the PTX ISA,
// "Matrix fragments for mma.m16n8k16"; tests/cuda_emulation/runtime/include/loom_emulation/
// warp_mma.h restates them), so a kernel can keep scores in registers, apply the softmax to
// them where they are, and hand a product's accumulators to the next product as its A
// operand without a trip through shared memory, as FlashAttention-2 does.
//
// On sm_80 and newer these are inline PTX; for older virtual architectures mma.sync and
// ldmatrix trap and cp.async copies synchronously. Compiled
// as host C++ for the kernel emulation (no __CUDACC__), they call the emulator's versions,
// which place every element where a GPU does and defer cp.async's copies until the wait that
// makes them visible.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"

#if !defined(__CUDACC__)
#include "emulator.h"
#include "loom_emulation/warp_mma.h"
#endif

namespace loom::kernels::cuda {

#if !defined(__CUDACC__)
#define LOOM_WARP_MMA_EMULATED 1
#define LOOM_WARP_MMA_PTX 0
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LOOM_WARP_MMA_EMULATED 0
#define LOOM_WARP_MMA_PTX 1
#else
#define LOOM_WARP_MMA_EMULATED 0
#define LOOM_WARP_MMA_PTX 0
#endif

// Two floats as a bf16 pair in one register, `lo` in the low half (the first element of a
// fragment's pair), each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// d += a b: a 16x16 bf16 A (row major), a 16x8 bf16 B (column major), a 16x8 f32 D.
// With g = lane / 4 and t = lane % 4: a[i] holds A[g + 8 (i % 2)][2t + 8 (i / 2) + {0, 1}],
// b[i] holds B[2t + 8 i + {0, 1}][g], d[j] is D[g + 8 (j / 2)][2t + j % 2].
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
#if LOOM_WARP_MMA_EMULATED
  ::loom::cuda_emulation::mma_m16n8k16_bf16(d, a, b);
#elif LOOM_WARP_MMA_PTX
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8j .. 8j + 7 give the row
// addresses of matrix j (16-byte aligned); lane l gets row l / 4, columns 2 (l % 4) + {0, 1}
// of matrix j in r[j], or with kTransposed column l / 4, rows 2 (l % 4) + {0, 1}. The
// "memory" clobber keeps the compiler from moving plain shared-memory stores (a kernel
// reusing a tile it has read, as the attention kernels' output staging does) above the read.
template <bool kTransposed>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if LOOM_WARP_MMA_EMULATED
  ::loom::cuda_emulation::ldmatrix_x4(kTransposed, r, row);
#elif LOOM_WARP_MMA_PTX
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTransposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
  }
#else
  __trap();
#endif
}

// Starts copying kBytes (16, or 4: one float) from global to shared memory, of which the first
// `src_bytes` (0 or kBytes) are read and the rest zero-filled, into the thread's open group;
// the bytes land at the cp_async_wait that completes the group (and other threads see them
// after a barrier that follows it). Both addresses kBytes-aligned. Below sm_80 (no cp.async)
// the copy is made at once, and commit and wait do nothing, which keeps the same contract.
// 16 bytes bypass L1 (.cg); PTX allows .cg for 16 bytes only, so 4 bytes are cached in L1 (.ca).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem_dst, const void* gmem_src, int src_bytes) {
  static_assert(kBytes == 16 || kBytes == 4,
                "cp.async copies 4, 8 or 16 bytes; Loom uses 4 and 16");
#if LOOM_WARP_MMA_EMULATED
  ::loom::cuda_emulation::async_copy(smem_dst, gmem_src, kBytes, static_cast<size_t>(src_bytes));
#elif LOOM_WARP_MMA_PTX
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
  }
#else
  using Word = std::conditional_t<kBytes == 16, uint4, uint32_t>;
  *static_cast<Word*>(smem_dst) = src_bytes > 0 ? *static_cast<const Word*>(gmem_src) : Word{};
#endif
}

// Closes the thread's open group of copies (an empty group is allowed).
__device__ __forceinline__ void cp_async_commit() {
#if LOOM_WARP_MMA_EMULATED
  ::loom::cuda_emulation::async_commit();
#elif LOOM_WARP_MMA_PTX
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most the newest kPending committed groups of the thread are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if LOOM_WARP_MMA_EMULATED
  ::loom::cuda_emulation::async_wait(kPending);
#elif LOOM_WARP_MMA_PTX
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace loom::kernels::cuda
