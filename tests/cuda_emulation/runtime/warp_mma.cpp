#include "loom_emulation/warp_mma.h"

#include <bit>
#include <cstring>
#include <string>

#include "emulator.h"

namespace loom::cuda_emulation {
namespace {

constexpr int kLanes = 32;

float bf16_bits_to_float(uint32_t bits) {
  return std::bit_cast<float>(bits << 16);
}

struct MmaIn {
  uint32_t a[4], b[2];
  float c[4];
};

// All 32 lanes' operands to their results (the layouts in warp_mma.h).
void compute_mma(const unsigned char* in, unsigned char* out) {
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < kLanes; ++lane) {
    MmaIn v;
    std::memcpy(&v, in + lane * sizeof(MmaIn), sizeof(MmaIn));
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i)
      for (int half = 0; half < 2; ++half)
        A[g + 8 * (i % 2)][2 * t + 8 * (i / 2) + half] =
            bf16_bits_to_float(v.a[i] >> (16 * half) & 0xFFFFu);
    for (int i = 0; i < 2; ++i)
      for (int half = 0; half < 2; ++half)
        B[2 * t + 8 * i + half][g] = bf16_bits_to_float(v.b[i] >> (16 * half) & 0xFFFFu);
    for (int j = 0; j < 4; ++j)
      C[g + 8 * (j / 2)][2 * t + j % 2] = v.c[j];
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    float d[4];
    for (int j = 0; j < 4; ++j) {
      const int row = g + 8 * (j / 2), col = 2 * t + j % 2;
      float sum = C[row][col];
      for (int k = 0; k < 16; ++k)
        sum += A[row][k] * B[k][col];
      d[j] = sum;
    }
    std::memcpy(out + lane * sizeof(d), d, sizeof(d));
  }
}

constexpr int kMatrices = 4;  // ldmatrix .x4, the only form Loom's kernels use

template <bool kTransposed>
void compute_ldmatrix(const unsigned char* in, unsigned char* out) {
  for (int m = 0; m < kMatrices; ++m) {
    for (int row = 0; row < 8; ++row) {
      uintptr_t address;
      std::memcpy(&address, in + (8 * m + row) * sizeof(address), sizeof(address));
      if (address % 16 != 0) {
        throw EmulationError("[cuda emulation] ldmatrix: lane " + std::to_string(8 * m + row) +
                             " gave a row address that is not 16-byte aligned (offset " +
                             std::to_string(address % 16) + ")");
      }
    }
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    uint32_t r[kMatrices];
    for (int m = 0; m < kMatrices; ++m) {
      uint16_t e[2];
      for (int i = 0; i < 2; ++i) {
        const int row = kTransposed ? 2 * (lane % 4) + i : lane / 4;
        const int col = kTransposed ? lane / 4 : 2 * (lane % 4) + i;
        uintptr_t address;
        std::memcpy(&address, in + (8 * m + row) * sizeof(address), sizeof(address));
        std::memcpy(&e[i], reinterpret_cast<const unsigned char*>(address) + 2 * col, 2);
      }
      r[m] = uint32_t{e[0]} | uint32_t{e[1]} << 16;
    }
    std::memcpy(out + lane * sizeof(r), r, sizeof(r));
  }
}

}  // namespace

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaIn in;
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, d, sizeof(in.c));
  warp_register_operation("mma.sync.m16n8k16.bf16", &in, sizeof(in), d, sizeof(d), compute_mma);
}

void ldmatrix_x4(bool transposed, uint32_t (&r)[4], const void* row) {
  const auto address = reinterpret_cast<uintptr_t>(row);
  warp_register_operation(transposed ? "ldmatrix.trans" : "ldmatrix", &address, sizeof(address), r,
                          sizeof(r), transposed ? compute_ldmatrix<true> : compute_ldmatrix<false>);
}

}  // namespace loom::cuda_emulation
