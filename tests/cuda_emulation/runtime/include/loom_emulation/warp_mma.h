#pragma once
// PTX's warp-level tensor-core instructions for emulated kernels, with the registers of each
// lane laid out as the PTX ISA specifies them (kernels/cuda/warp_mma.cuh calls these where it
// is not compiled by nvcc). Unlike WMMA's opaque fragments, these layouts are part of the
// contract: a kernel indexes its accumulators by (row, column) and feeds them to the next
// product, so the emulation places every element where a GPU places it, and a kernel that
// gets a layout wrong gets wrong results here too.

#include <cstdint>

namespace loom::cuda_emulation {

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, d: D = A B + D for a 16x16 A,
// a 16x8 B and a 16x8 f32 D. With g = lane / 4 and t = lane % 4, a lane holds
//   a[i] = {A[r][c], A[r][c + 1]} (low half first), r = g + 8 (i % 2), c = 2t + 8 (i / 2);
//   b[i] = {B[k][g], B[k + 1][g]}, k = 2t + 8 i;
//   d[j] = D[g + 8 (j / 2)][2t + j % 2].
// Products are exact in f32 and summed in k order onto D, in f32 (a GPU's tensor cores may
// round differently: the tolerances of the tests that use it say so).
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j .. 8j + 7 give the row addresses
// (16-byte aligned, 8 16-bit elements each) of matrix j; lane l receives in r[j] elements
// (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j, or with `transposed` elements
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
void ldmatrix_x4(bool transposed, uint32_t (&r)[4], const void* row);

}  // namespace loom::cuda_emulation
