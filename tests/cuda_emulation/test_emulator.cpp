// The emulator itself: indices, barriers, shuffles, shared-memory poisoning, the schedules
// that expose a missing barrier, WMMA, mma.sync and ldmatrix in PTX's register layouts,
// cp.async's groups, and the errors for what CUDA leaves undefined.

#include <cuda_runtime.h>
#include <mma.h>

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "emulator.h"
#include "kernels/cuda/warp_mma.cuh"
#include "work_log.h"

namespace emu = loom::cuda_emulation;

namespace {

const emu::Schedule kSchedules[] = {
    {emu::Order::kForward, 0}, {emu::Order::kReverse, 0}, {emu::Order::kShuffled, 1},
    {emu::Order::kShuffled, 2}, {emu::Order::kWarpsReverse, 0}};

struct ScheduleGuard {
  ~ScheduleGuard() {
    emu::set_schedule({});
    emu::clear_device_error();
  }
};

void write_ids(int* out) {
  const int block = blockIdx.x + gridDim.x * blockIdx.y;
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = block * 1000 + thread;
}

TEST(Emulator, EveryThreadOfEveryBlockRunsWithItsIndices) {
  std::vector<int> out(6 * 16, -1);
  emu::launch(write_ids, dim3(3, 2), dim3(4, 2, 2))(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 6; ++b)
    for (int t = 0; t < 16; ++t) EXPECT_EQ(out[b * 16 + t], b * 1000 + t);
}

// Each thread reads its neighbour's value from shared memory: right with the barrier under
// every schedule, poisoned (NaN) without it under at least one.
template <bool kBarrier>
void rotate(float* out) {
  __shared__ float values[64];
  emu::shared_memory_in_use(values, sizeof(values));  // what the kernel rewrite adds
  const unsigned t = threadIdx.x;
  values[t] = static_cast<float>(t);
  if (kBarrier) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = values[(t + 1) % blockDim.x];
}

TEST(Emulator, ABarrierOrdersSharedMemoryUnderEverySchedule) {
  ScheduleGuard guard;
  for (const auto& schedule : kSchedules) {
    emu::set_schedule(schedule);
    std::vector<float> out(2 * 64);
    emu::launch(rotate<true>, 2, 64)(out.data());
    for (int i = 0; i < 128; ++i)
      ASSERT_EQ(out[i], static_cast<float>((i % 64 + 1) % 64)) << emu::describe(schedule);
  }
}

TEST(Emulator, AMissingBarrierReadsPoisonUnderSomeSchedule) {
  ScheduleGuard guard;
  for (const auto& schedule : kSchedules) {
    emu::set_schedule(schedule);
    std::vector<float> out(64);
    emu::launch(rotate<false>, 1, 64)(out.data());
    int poisoned = 0;
    for (float v : out) poisoned += std::isnan(v) ? 1 : 0;
    // Forward: every thread but the last reads its neighbour before it is written; reverse:
    // only the last.
    if (schedule.order == emu::Order::kForward) {
      EXPECT_EQ(poisoned, 63);
    } else if (schedule.order == emu::Order::kReverse) {
      EXPECT_EQ(poisoned, 1);
    } else if (schedule.order == emu::Order::kWarpsReverse) {
      EXPECT_EQ(poisoned, 63);  // warp 1 first (all 32 read ahead), then warp 0 (all but 31)
    } else {
      EXPECT_GT(poisoned, 0);
    }
  }
}

// The other warp's value after only a __syncwarp: a missing __syncthreads that lockstep
// schedules cannot show (every thread writes before any passes its __syncwarp), but running
// warp by warp does.
void other_warps_value(float* out) {
  __shared__ float values[64];
  emu::shared_memory_in_use(values, sizeof(values));
  const unsigned t = threadIdx.x;
  values[t] = static_cast<float>(t);
  __syncwarp();
  out[t] = values[(t + 32) % 64];
}

TEST(Emulator, AMissingBarrierAcrossWarpLevelOperationsShowsWarpByWarp) {
  ScheduleGuard guard;
  for (const auto& schedule : {emu::Schedule{emu::Order::kForward, 0},
                               emu::Schedule{emu::Order::kWarpsReverse, 0}}) {
    emu::set_schedule(schedule);
    std::vector<float> out(64);
    emu::launch(other_warps_value, 1, 64)(out.data());
    int poisoned = 0;
    for (float v : out) poisoned += std::isnan(v) ? 1 : 0;
    EXPECT_EQ(poisoned, schedule.order == emu::Order::kForward ? 0 : 32) << emu::describe(schedule);
  }
}

void warp_sums(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[threadIdx.x] = v;
}

TEST(Emulator, ShuffleXorGivesEveryLaneTheWarpSum) {
  ScheduleGuard guard;
  std::vector<float> in(64), out(64);
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i);
  for (const auto& schedule : kSchedules) {
    emu::set_schedule(schedule);
    emu::launch(warp_sums, 1, 64)(in.data(), out.data());
    for (int i = 0; i < 32; ++i) ASSERT_EQ(out[i], 496.0f);         // 0 + ... + 31
    for (int i = 32; i < 64; ++i) ASSERT_EQ(out[i], 1520.0f);       // 32 + ... + 63
  }
}

// Each lane of the mask writes whether every lane of the mask in its warp had a nonzero in[].
void votes(const int* in, unsigned mask, int* out) {
  if ((mask >> (threadIdx.x % 32) & 1u) == 0) return;
  const int all = __all_sync(mask, in[threadIdx.x]);
  out[threadIdx.x] = all;
}

TEST(Emulator, AllSyncIsOneOnlyWhenEveryLaneOfTheMaskVotesYes) {
  ScheduleGuard guard;
  std::vector<int> in(64, 1), out(64, -1);
  in[40] = 0;  // the second warp: one lane says no
  for (const auto& schedule : kSchedules) {
    emu::set_schedule(schedule);
    emu::launch(votes, 1, 64)(in.data(), 0xffffffffu, out.data());
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(out[i], 1) << emu::describe(schedule);
    for (int i = 32; i < 64; ++i)
      ASSERT_EQ(out[i], 0) << emu::describe(schedule);
    // Lane 8 of each warp (40 in the second) is outside the mask: only its lanes count.
    emu::launch(votes, 1, 64)(in.data(), 0xfffffeffu, out.data());
    for (int i = 32; i < 64; ++i) {
      if (i == 40) continue;
      ASSERT_EQ(out[i], 1) << emu::describe(schedule);
    }
  }
}

TEST(Emulator, AShuffleNamingLanesPastTheBlockIsAnError) {
  std::vector<float> in(48), out(48);
  try {
    emu::launch(warp_sums, 1, 48)(in.data(), out.data());
    FAIL() << "expected an EmulationError";
  } catch (const emu::EmulationError& e) {
    EXPECT_NE(std::string(e.what()).find("do not exist"), std::string::npos) << e.what();
  }
}

void early_exit_then_shuffle(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(Emulator, AShuffleWaitingForAnExitedLaneIsAnError) {
  std::vector<float> out(32);
  EXPECT_THROW(emu::launch(early_exit_then_shuffle, 1, 32)(out.data()), emu::EmulationError);
}

void divergent_barrier(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncwarp();
    __syncthreads();
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST(Emulator, ABarrierThatCanNeverCompleteIsNamedNotHung) {
  std::vector<int> out(64);
  try {
    emu::launch(divergent_barrier, 1, 64)(out.data());
    FAIL() << "expected an EmulationError";
  } catch (const emu::EmulationError& e) {
    EXPECT_NE(std::string(e.what()).find("can never finish"), std::string::npos) << e.what();
  }
}

void exits_then_barrier(int* out) {
  if (threadIdx.x >= 40) return;  // exited threads do not hold __syncthreads (sm_70+)
  __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(Emulator, ExitedThreadsDoNotHoldTheBlockBarrier) {
  std::vector<int> out(64, 0);
  emu::launch(exits_then_barrier, 1, 64)(out.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], i < 40 ? 1 : 0);
}

void traps_in_block_one(int* out) {
  if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

TEST(Emulator, ATrapFailsTheLaunchAndStaysUntilCleared) {
  ScheduleGuard guard;
  std::vector<int> out(4 * 32, 0);
  emu::launch(traps_in_block_one, 4, 32)(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(out[3 * 32], 0) << "blocks after the trap must not run";
  emu::clear_device_error();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

struct Operands {  // as a multi-tensor launch's table holds them
  const float* x;
  int n;
  float* y;
};

void scaled_sum(const float* a, const float* a_view, const Operands operands, float factor) {
  const int i = threadIdx.x;
  if (i < operands.n) operands.y[i] = factor * (a[i] + a_view[0] + operands.x[i]);
}

// Note [The bytes a launch's arguments name]: each allocation that a pointer argument or a
// word of a class argument points into counts once, at its size, whatever part the launch
// reads; words that point into none (a host buffer, the ints) name nothing. Without a lookup,
// nothing is counted.
TEST(Emulator, ALaunchsArgumentBytesAreTheAllocationsItsArgumentsName) {
  std::vector<float> a(64, 1.0f), x(32, 2.0f), y(32, 0.0f), host(8, 0.0f);
  const std::vector<const std::vector<float>*> device = {&a, &x, &y};
  auto lookup = [&](const void* address) -> std::optional<emu::Allocation> {
    for (const std::vector<float>* buffer : device) {
      const auto* start = reinterpret_cast<const char*>(buffer->data());
      const auto* p = static_cast<const char*>(address);
      if (p >= start && p < start + buffer->size() * sizeof(float))
        return emu::Allocation{buffer->data(), buffer->size() * sizeof(float)};
    }
    return std::nullopt;
  };
  {
    emu::WorkLog log(lookup);
    emu::launch("scaled_sum", scaled_sum, 1, 32)(a.data(), a.data() + 40,
                                                 Operands{x.data(), 32, y.data()}, 0.5f);
    emu::launch("scaled_sum", scaled_sum, 1, 32)(host.data(), host.data(),
                                                 Operands{x.data(), 8, y.data()}, 0.5f);
    const std::vector<emu::Work> work = log.entries();
    ASSERT_EQ(work.size(), 2u);
    EXPECT_EQ(work[0].argument_bytes, (64 + 32 + 32) * sizeof(float));
    EXPECT_EQ(work[1].argument_bytes, (32 + 32) * sizeof(float));
    EXPECT_EQ(log.argument_bytes(), (64 + 32 + 32 + 32 + 32) * sizeof(float));
  }
  EXPECT_EQ(y[31], 2.0f);  // the first launch ran (the second wrote y[0..7])
  emu::WorkLog without_a_lookup;
  emu::launch("scaled_sum", scaled_sum, 1, 32)(a.data(), a.data(),
                                               Operands{x.data(), 32, y.data()}, 0.5f);
  EXPECT_EQ(without_a_lookup.argument_bytes(), 0u);
}

TEST(Emulator, ALaunchCudaRefusesSetsTheLastErrorAndRunsNothing) {
  std::vector<int> out(2048, 0);
  emu::launch(write_ids, 1, 1025)(out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

void dynamic_first_byte(unsigned char* out) {
  auto* smem = static_cast<unsigned char*>(emu::dynamic_shared_memory());
  if (threadIdx.x == 0) *out = smem[0];
}

TEST(Emulator, DynamicSharedMemoryIsPoisonedAndLimitedLikeADevice) {
  unsigned char first = 0;
  emu::launch(dynamic_first_byte, 1, 32, 1024)(&first);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(first, 0xFF);
  emu::launch(dynamic_first_byte, 1, 32, 64 * 1024)(&first);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "past 48 KiB needs the attribute";
  ASSERT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(dynamic_first_byte),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  emu::launch(dynamic_first_byte, 1, 32, 64 * 1024)(&first);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

namespace wmma = nvcuda::wmma;

void wmma_product(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

TEST(Emulator, WmmaMultipliesWithTheFragmentsLayouts) {
  alignas(32) __nv_bfloat16 a[256], b[256];
  alignas(32) float c[256];
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16_rn(static_cast<float>(i % 7) - 3.0f);
    b[i] = __float2bfloat16_rn(static_cast<float>(i % 5) - 2.0f);
  }
  emu::launch(wmma_product, 1, 32)(a, b, c);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float expected = 0;
      for (int k = 0; k < 16; ++k)  // b is column-major: element (k, j) at j * 16 + k
        expected += __bfloat162float(a[i * 16 + k]) * __bfloat162float(b[j * 16 + k]);
      ASSERT_EQ(c[i * 16 + j], expected) << i << "," << j;
    }
}

TEST(Emulator, WmmaInAWarpWithMissingLanesIsAnError) {
  alignas(32) __nv_bfloat16 a[256] = {}, b[256] = {};
  alignas(32) float c[256];
  EXPECT_THROW(emu::launch(wmma_product, 1, 16)(a, b, c), emu::EmulationError);
}

void wmma_divergent_pointers(const __nv_bfloat16* a) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, a + (threadIdx.x % 2) * 256, 16);  // lanes disagree: undefined
}

TEST(Emulator, WmmaWithDifferentPointersPerLaneIsAnError) {
  alignas(32) __nv_bfloat16 a[512] = {};
  try {
    emu::launch(wmma_divergent_pointers, 1, 32)(a);
    FAIL() << "expected an EmulationError";
  } catch (const emu::EmulationError& e) {
    EXPECT_NE(std::string(e.what()).find("same pointer and stride"), std::string::npos) << e.what();
  }
}

namespace kc = loom::kernels::cuda;

// Each lane builds its fragments of A (16x16, row major), B (16x8, B[k][n] at k * 8 + n) and
// C (16x8) by the PTX ISA's formulas (restated in warp_mma.cuh), and writes D back by them.
void mma_by_the_isa(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto bits = [](__nv_bfloat16 v) { return static_cast<uint32_t>(__bfloat16_as_ushort(v)); };
  uint32_t fa[4], fb[2];
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
    fa[i] = bits(a[r * 16 + col]) | bits(a[r * 16 + col + 1]) << 16;
  }
  for (int i = 0; i < 2; ++i) {
    const int k = 2 * t + 8 * i;
    fb[i] = bits(b[k * 8 + g]) | bits(b[(k + 1) * 8 + g]) << 16;
  }
  float acc[4];
  for (int j = 0; j < 4; ++j)
    acc[j] = c[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2];
  kc::mma_bf16_16816(acc, fa, fb);
  for (int j = 0; j < 4; ++j)
    d[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2] = acc[j];
}

TEST(Emulator, MmaSyncPlacesEveryElementWhereThePtxIsaSays) {
  __nv_bfloat16 a[256], b[128];
  float c[128], d[128];
  for (int i = 0; i < 256; ++i)
    a[i] = __float2bfloat16_rn(static_cast<float>(i % 13) - 6.0f);
  for (int i = 0; i < 128; ++i) {
    b[i] = __float2bfloat16_rn(static_cast<float>(i % 11) - 5.0f);
    c[i] = static_cast<float>(i) * 0.5f;
  }
  emu::launch(mma_by_the_isa, 1, 32)(a, b, c, d);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float expected = c[i * 8 + j];
      for (int k = 0; k < 16; ++k)
        expected += __bfloat162float(a[i * 16 + k]) * __bfloat162float(b[k * 8 + j]);
      ASSERT_EQ(d[i * 8 + j], expected) << i << "," << j;
    }
}

// Four 8x8 matrices of a [32][8] array (matrix j: rows 8j .. 8j + 7), each lane's four
// registers written to out[lane][j], plain and transposed.
template <bool kTransposed>
void ldmatrix_lanes(const uint16_t* m, uint32_t* out) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  kc::ldmatrix_x4<kTransposed>(r, m + lane * 8);
  for (int j = 0; j < 4; ++j)
    out[lane * 4 + j] = r[j];
}

TEST(Emulator, LdmatrixGivesEachLaneItsPairOfEachMatrix) {
  alignas(16) uint16_t m[256];
  for (int i = 0; i < 256; ++i)
    m[i] = static_cast<uint16_t>(i);
  uint32_t plain[128], transposed[128];
  emu::launch(ldmatrix_lanes<false>, 1, 32)(m, plain);
  emu::launch(ldmatrix_lanes<true>, 1, 32)(m, transposed);
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      const int row = lane / 4, col = 2 * (lane % 4);
      auto at = [&](int r, int c) { return uint32_t{m[(8 * j + r) * 8 + c]}; };
      EXPECT_EQ(plain[lane * 4 + j], at(row, col) | at(row, col + 1) << 16) << lane << "," << j;
      EXPECT_EQ(transposed[lane * 4 + j], at(col, row) | at(col + 1, row) << 16)
          << lane << "," << j;
    }
}

TEST(Emulator, LdmatrixOfAMisalignedRowIsAnError) {
  alignas(16) uint16_t m[264] = {};
  uint32_t out[128];
  EXPECT_THROW(emu::launch(ldmatrix_lanes<false>, 1, 32)(m + 1, out), emu::EmulationError);
}

// One thread: two groups of one copy each (the second zero-filled: 0 of 16 source bytes);
// what the destination holds after each step goes to out[step].
void async_copies(const uint4* src, uint4* dst, uint4* out) {
  kc::cp_async<16>(dst, src, 16);
  kc::cp_async_commit();
  kc::cp_async<16>(dst + 1, src + 1, 0);
  kc::cp_async_commit();
  out[0] = dst[0];
  kc::cp_async_wait<1>();
  out[1] = dst[0];
  out[2] = dst[1];
  kc::cp_async_wait<0>();
  out[3] = dst[1];
}

TEST(Emulator, CpAsyncLandsAtTheWaitThatCompletesItsGroup) {
  const uint4 src[2] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  const uint4 poison{~0u, ~0u, ~0u, ~0u};
  uint4 dst[2] = {poison, poison}, out[4];
  emu::launch(async_copies, 1, 1)(src, dst, out);
  auto same = [](uint4 x, uint4 y) { return x.x == y.x && x.y == y.y && x.z == y.z && x.w == y.w; };
  EXPECT_TRUE(same(out[0], poison)) << "a copy landed before any wait";
  EXPECT_TRUE(same(out[1], src[0])) << "wait_group 1 must complete the older group";
  EXPECT_TRUE(same(out[2], poison)) << "wait_group 1 must leave the newest group in flight";
  EXPECT_TRUE(same(out[3], (uint4{0, 0, 0, 0}))) << "a copy of 0 source bytes zero-fills";
}

}  // namespace
