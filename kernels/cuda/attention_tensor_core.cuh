#pragma once
// v2 of the causal attention kernels: bf16 tiles, WMMA tensor-core MMAs with f32
// accumulation (Note [Attention versions] in attention.cu). Private to attention.cu.

#include <mma.h>

#include "kernels/cuda/attention_common.cuh"

namespace loom::kernels::cuda::attention_detail {

// ---- v2: tensor cores (bf16 WMMA) ----------------------------------------------------------

namespace wmma = nvcuda::wmma;

constexpr int kTcTile = 64;        // query rows per block and keys per tile
constexpr int kTcThreads = 128;    // 4 warps
constexpr int kTcRows = 16;        // rows per warp: one WMMA tile high
constexpr int kScratchPitch = 72;  // f32 per-warp scratch [16][72]: the float4 reads of a
                                   // quarter warp (rows r..r+3, both halves) hit distinct banks
constexpr int kProbPitch = 72;     // bf16 per-warp [16][72] (P, dS): multiple of 8, as WMMA needs
constexpr size_t kScratchBytes = sizeof(float) * kTcRows * kScratchPitch;
constexpr size_t kProbBytes = sizeof(bf16) * kTcRows * kProbPitch;
constexpr int kTcWarps = kTcThreads / kWarpSize;
constexpr int kTcMaxBlocks = 4;  // registers: at least 128 per thread

using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using RowAFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using RowBFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using ColBFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;

// bf16 tiles [64][kD + 8]: every 16-row block and 16-column block starts 32-byte aligned, as
// WMMA loads require, and rows are skewed by 16 bytes against bank conflicts.
template <int kD>
constexpr size_t tc_tile_bytes() {
  return sizeof(bf16) * kTcTile * (kD + 8);
}
template <int kD>
constexpr size_t tc_forward_smem() {  // Q, K, V; S/O scratch and P per warp
  return 3 * tc_tile_bytes<kD>() + kTcWarps * (kScratchBytes + kProbBytes);
}
template <int kD>
constexpr size_t tc_dkdv_smem() {  // K, V, Q, dO; S and dP scratch, P and dS per warp; lse, D
  return 4 * tc_tile_bytes<kD>() + kTcWarps * 2 * (kScratchBytes + kProbBytes) +
         2 * kTcTile * sizeof(float);
}
template <int kD>
constexpr size_t tc_dq_smem() {  // Q, dO, K, V; S and dP scratch and dS per warp
  return 4 * tc_tile_bytes<kD>() + kTcWarps * (2 * kScratchBytes + kProbBytes);
}

// In the softmax steps two lanes share a row of 64 scores: lane owns row lane / 2 and, for
// g < 8, the columns g*8 + (lane % 2)*4 + [0, 4) (a float4 each).
__device__ __forceinline__ int tc_col(int g, int half) {
  return g * 8 + half * 4;
}

__device__ __forceinline__ void store_bf16x4(bf16* dst, float a, float b, float c, float d) {
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dst);
  p[0] = __floats2bfloat162_rn(a, b);
  p[1] = __floats2bfloat162_rn(c, d);
}

// Stores columns [0, width) of the warp's 16-row scratch to rows t0.. and dims d0.. of dst,
// skipping rows past `time` and dims past `head_dim`; coalesced along the dims.
__device__ __forceinline__ void store_scratch(const float* scratch, int width, bf16* dst,
                                              int64_t st, int t0, int d0, int time, int head_dim,
                                              float scale) {
  const int lane = threadIdx.x % kWarpSize;
  for (int i = lane; i < kTcRows * width; i += kWarpSize) {
    const int r = i / width, c = i % width, t = t0 + r, d = d0 + c;
    if (t < time && d < head_dim)
      dst[t * st + d] = __float2bfloat16_rn(scratch[r * kScratchPitch + c] * scale);
  }
}

// Stores a warp's 16 x kD accumulator (times `scale`) through its scratch, 64 columns at a time.
template <int kD>
__device__ __forceinline__ void store_accumulators(AccFrag (&acc)[kD / 16], float* scratch,
                                                   bf16* dst, int64_t st, int t0, int time,
                                                   int head_dim, float scale) {
  constexpr int kChunk = kD < 64 ? kD : 64;
#pragma unroll
  for (int ch = 0; ch < kD / kChunk; ++ch) {
#pragma unroll
    for (int n = 0; n < kChunk / 16; ++n)
      wmma::store_matrix_sync(scratch + n * 16, acc[ch * (kChunk / 16) + n], kScratchPitch,
                              wmma::mem_row_major);
    __syncwarp();
    store_scratch(scratch, kChunk, dst, st, t0, ch * kChunk, time, head_dim, scale);
    __syncwarp();
  }
}

// The WMMA bf16 kernels need sm_80; on older targets their bodies are left out (they trap).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define LOOM_ATTENTION_TC 1
#else
#define LOOM_ATTENTION_TC 0
#endif

template <int kD>
__global__ void __launch_bounds__(kTcThreads, min_blocks(tc_forward_smem<kD>(), kTcMaxBlocks))
    attention_forward_tc(ForwardArgs<bf16> a) {
#if LOOM_ATTENTION_TC
  constexpr int kPitch = kD + 8, kSteps = kD / 16;
  constexpr int kChunk = kD < 64 ? kD : 64;  // O columns per pass through the scratch
  constexpr int kChunks = kD / kChunk, kGroups = kChunk / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTcTile * kPitch;
  bf16* vs = ks + kTcTile * kPitch;
  unsigned char* per_warp = smem + 3 * tc_tile_bytes<kD>();
  float* sw = reinterpret_cast<float*>(per_warp + warp * kScratchBytes);
  bf16* pw = reinterpret_cast<bf16*>(per_warp + kTcWarps * kScratchBytes + warp * kProbBytes);

  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, kvh = h / a.group;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int q0 = tile * kTcTile, row0 = warp * kTcRows;
  load_rows<kTcTile, kD, kTcThreads>(qs, kPitch, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);

  const int r = lane / 2, half = lane % 2, row = q0 + row0 + r;
  float m = -INFINITY, l = 0.0f;
  float o[kChunks][kGroups][4] = {};  // row r, dims ch*kChunk + tc_col(g, half) + i

  for (int kb = 0; kb <= tile; ++kb) {
    const int k0 = kb * kTcTile;
    __syncthreads();
    load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, kvh), a.k.st, k0, a.time,
                                       a.head_dim);
    load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, kvh), a.v.st, k0, a.time,
                                       a.head_dim);
    __syncthreads();

    // S = Q K^T for the warp's 16 rows (K row-major is K^T column-major).
#pragma unroll
    for (int n = 0; n < kTcTile / 16; ++n) {
      AccFrag acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        RowAFrag qf;
        ColBFrag kf;
        wmma::load_matrix_sync(qf, qs + row0 * kPitch + kk * 16, kPitch);
        wmma::load_matrix_sync(kf, ks + n * 16 * kPitch + kk * 16, kPitch);
        wmma::mma_sync(acc, qf, kf, acc);
      }
      wmma::store_matrix_sync(sw + n * 16, acc, kScratchPitch, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over the row, shared by lanes 2r and 2r + 1 (finite max: see v1).
    float x[8][4];
    float tile_max = -INFINITY;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int c = tc_col(g, half);
      const float4 s4 = load4(sw + r * kScratchPitch + c);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + c + i;
        x[g][i] = (key <= row && key < a.time) ? sv[i] * a.scale_log2 : -INFINITY;
        tile_max = fmaxf(tile_max, x[g][i]);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = exp2f(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // The denominator sums the bf16-rounded weights that the P V product uses.
        p[i] = __bfloat162float(__float2bfloat16_rn(exp2f(x[g][i] - m_new)));
        sum += p[i];
      }
      store_bf16x4(pw + r * kProbPitch + tc_col(g, half), p[0], p[1], p[2], p[3]);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o[ch][g][i] *= alpha;
    __syncwarp();

    // O += P V, kChunk dims at a time through the scratch (S is no longer needed).
    RowAFrag pf[kTcTile / 16];
#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk)
      wmma::load_matrix_sync(pf[kk], pw + kk * 16, kProbPitch);
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
#pragma unroll
      for (int n = 0; n < kChunk / 16; ++n) {
        AccFrag acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < kTcTile / 16; ++kk) {
          RowBFrag vf;
          wmma::load_matrix_sync(vf, vs + kk * 16 * kPitch + ch * kChunk + n * 16, kPitch);
          wmma::mma_sync(acc, pf[kk], vf, acc);
        }
        wmma::store_matrix_sync(sw + n * 16, acc, kScratchPitch, wmma::mem_row_major);
      }
      __syncwarp();
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const float4 t4 = load4(sw + r * kScratchPitch + tc_col(g, half));
        o[ch][g][0] += t4.x;
        o[ch][g][1] += t4.y;
        o[ch][g][2] += t4.z;
        o[ch][g][3] += t4.w;
      }
      __syncwarp();
    }
  }

  // Normalise and store through the scratch, so that global writes are coalesced.
  const float inv = 1.0f / l;
  bf16* out = a.out.head(b, h);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sw[r * kScratchPitch + tc_col(g, half) + i] = o[ch][g][i] * inv;
    __syncwarp();
    store_scratch(sw, kChunk, out, a.out.st, q0 + row0, ch * kChunk, a.time, a.head_dim, 1.0f);
    __syncwarp();
  }
  if (half == 0 && row < a.time) a.lse[int64_t(blockIdx.x) * a.time + row] = (m + log2f(l)) * kLn2;
#else
  __trap();
#endif
}

// dK, dV for one 64-key tile; warps own 16 keys. Scores are computed transposed (keys x
// queries): S^T = K Q^T, dP^T = V dO^T, so the products dV = P^T dO and dK = dS^T Q take the
// per-warp tiles as row-major A operands.
template <int kD>
__global__ void __launch_bounds__(kTcThreads, min_blocks(tc_dkdv_smem<kD>(), kTcMaxBlocks))
    attention_backward_dkdv_tc(BackwardArgs<bf16> a) {
#if LOOM_ATTENTION_TC
  constexpr int kPitch = kD + 8, kSteps = kD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kTcTile * kPitch;
  bf16* qs = vs + kTcTile * kPitch;
  bf16* gs = qs + kTcTile * kPitch;
  unsigned char* per_warp = smem + 4 * tc_tile_bytes<kD>();
  float* sw = reinterpret_cast<float*>(per_warp + warp * kScratchBytes);
  float* dpw = reinterpret_cast<float*>(per_warp + (kTcWarps + warp) * kScratchBytes);
  unsigned char* probs = per_warp + 2 * kTcWarps * kScratchBytes;
  bf16* pw = reinterpret_cast<bf16*>(probs + warp * kProbBytes);
  bf16* dsw = reinterpret_cast<bf16*>(probs + (kTcWarps + warp) * kProbBytes);
  float* lse_s = reinterpret_cast<float*>(probs + 2 * kTcWarps * kProbBytes);  // [64], base 2
  float* delta_s = lse_s + kTcTile;                                            // [64]

  const int kv_heads = a.heads / a.group;
  const int b = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
  const int kb = blockIdx.y;
  const int k0 = kb * kTcTile, key0 = warp * kTcRows;
  load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, kvh), a.k.st, k0, a.time, a.head_dim);
  load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, kvh), a.v.st, k0, a.time, a.head_dim);

  const int r = lane / 2, half = lane % 2, key = k0 + key0 + r;
  AccFrag dk[kSteps], dv[kSteps];
#pragma unroll
  for (int n = 0; n < kSteps; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  // The query tiles at or below the diagonal of each query head of the group, head by head.
  const int query_tiles = static_cast<int>(gridDim.y) - kb;
  for (int step = 0; step < a.group * query_tiles; ++step) {
    const int h = kvh * a.group + step / query_tiles, qb = kb + step % query_tiles;
    const int bh = b * a.heads + h;
    const int q0 = qb * kTcTile;
    __syncthreads();
    load_rows<kTcTile, kD, kTcThreads>(qs, kPitch, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);
    load_rows<kTcTile, kD, kTcThreads>(gs, kPitch, a.dout.head(b, h), a.dout.st, q0, a.time,
                                       a.head_dim);
    for (int i = threadIdx.x; i < kTcTile; i += kTcThreads) {
      const bool ok = q0 + i < a.time;
      const int64_t at = int64_t(bh) * a.time + q0 + i;
      lse_s[i] = ok ? a.lse[at] * kLog2e : 0.0f;
      delta_s[i] = ok ? a.delta[at] : 0.0f;
    }
    __syncthreads();

#pragma unroll 1
    for (int n = 0; n < kTcTile / 16; ++n) {
      AccFrag s_acc, dp_acc;
      wmma::fill_fragment(s_acc, 0.0f);
      wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        RowAFrag af;
        ColBFrag bf;
        wmma::load_matrix_sync(af, ks + key0 * kPitch + kk * 16, kPitch);
        wmma::load_matrix_sync(bf, qs + n * 16 * kPitch + kk * 16, kPitch);
        wmma::mma_sync(s_acc, af, bf, s_acc);
        wmma::load_matrix_sync(af, vs + key0 * kPitch + kk * 16, kPitch);
        wmma::load_matrix_sync(bf, gs + n * 16 * kPitch + kk * 16, kPitch);
        wmma::mma_sync(dp_acc, af, bf, dp_acc);
      }
      wmma::store_matrix_sync(sw + n * 16, s_acc, kScratchPitch, wmma::mem_row_major);
      wmma::store_matrix_sync(dpw + n * 16, dp_acc, kScratchPitch, wmma::mem_row_major);
    }
    __syncwarp();

#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int c = tc_col(g, half);
      const float4 s4 = load4(sw + r * kScratchPitch + c);
      const float4 dp4 = load4(dpw + r * kScratchPitch + c);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w}, dpv[4] = {dp4.x, dp4.y, dp4.z, dp4.w};
      float p[4], ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int query = q0 + c + i;
        p[i] = (query < a.time && key <= query) ? exp2f(sv[i] * a.scale_log2 - lse_s[c + i]) : 0.0f;
        ds[i] = p[i] * (dpv[i] - delta_s[c + i]);
      }
      store_bf16x4(pw + r * kProbPitch + c, p[0], p[1], p[2], p[3]);
      store_bf16x4(dsw + r * kProbPitch + c, ds[0], ds[1], ds[2], ds[3]);
    }
    __syncwarp();

#pragma unroll 1
    for (int kk = 0; kk < kTcTile / 16; ++kk) {
      RowAFrag pf, dsf;
      wmma::load_matrix_sync(pf, pw + kk * 16, kProbPitch);
      wmma::load_matrix_sync(dsf, dsw + kk * 16, kProbPitch);
#pragma unroll
      for (int n = 0; n < kSteps; ++n) {
        RowBFrag bf;
        wmma::load_matrix_sync(bf, gs + kk * 16 * kPitch + n * 16, kPitch);
        wmma::mma_sync(dv[n], pf, bf, dv[n]);
        wmma::load_matrix_sync(bf, qs + kk * 16 * kPitch + n * 16, kPitch);
        wmma::mma_sync(dk[n], dsf, bf, dk[n]);
      }
    }
  }

  store_accumulators<kD>(dk, sw, a.dk.head(b, kvh), a.dk.st, k0 + key0, a.time, a.head_dim,
                         a.scale);
  store_accumulators<kD>(dv, sw, a.dv.head(b, kvh), a.dv.st, k0 + key0, a.time, a.head_dim, 1.0f);
#else
  __trap();
#endif
}

// dQ for one 64-query tile; warps own 16 queries.
template <int kD>
__global__ void __launch_bounds__(kTcThreads, min_blocks(tc_dq_smem<kD>(), kTcMaxBlocks))
    attention_backward_dq_tc(BackwardArgs<bf16> a) {
#if LOOM_ATTENTION_TC
  constexpr int kPitch = kD + 8, kSteps = kD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* gs = qs + kTcTile * kPitch;
  bf16* ks = gs + kTcTile * kPitch;
  bf16* vs = ks + kTcTile * kPitch;
  unsigned char* per_warp = smem + 4 * tc_tile_bytes<kD>();
  float* sw = reinterpret_cast<float*>(per_warp + warp * kScratchBytes);
  float* dpw = reinterpret_cast<float*>(per_warp + (kTcWarps + warp) * kScratchBytes);
  bf16* dsw = reinterpret_cast<bf16*>(per_warp + 2 * kTcWarps * kScratchBytes + warp * kProbBytes);

  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int q0 = tile * kTcTile, row0 = warp * kTcRows;
  load_rows<kTcTile, kD, kTcThreads>(qs, kPitch, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);
  load_rows<kTcTile, kD, kTcThreads>(gs, kPitch, a.dout.head(b, h), a.dout.st, q0, a.time,
                                     a.head_dim);
  const int r = lane / 2, half = lane % 2, row = q0 + row0 + r;
  const bool row_ok = row < a.time;
  const float lse2 = row_ok ? a.lse[int64_t(bh) * a.time + row] * kLog2e : 0.0f;
  const float delta = row_ok ? a.delta[int64_t(bh) * a.time + row] : 0.0f;

  AccFrag dq[kSteps];
#pragma unroll
  for (int n = 0; n < kSteps; ++n)
    wmma::fill_fragment(dq[n], 0.0f);

  for (int kb = 0; kb <= tile; ++kb) {
    const int k0 = kb * kTcTile;
    __syncthreads();
    load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, kvh), a.k.st, k0, a.time,
                                       a.head_dim);
    load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, kvh), a.v.st, k0, a.time,
                                       a.head_dim);
    __syncthreads();

#pragma unroll
    for (int n = 0; n < kTcTile / 16; ++n) {
      AccFrag s_acc, dp_acc;
      wmma::fill_fragment(s_acc, 0.0f);
      wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        RowAFrag af;
        ColBFrag bf;
        wmma::load_matrix_sync(af, qs + row0 * kPitch + kk * 16, kPitch);
        wmma::load_matrix_sync(bf, ks + n * 16 * kPitch + kk * 16, kPitch);
        wmma::mma_sync(s_acc, af, bf, s_acc);
        wmma::load_matrix_sync(af, gs + row0 * kPitch + kk * 16, kPitch);
        wmma::load_matrix_sync(bf, vs + n * 16 * kPitch + kk * 16, kPitch);
        wmma::mma_sync(dp_acc, af, bf, dp_acc);
      }
      wmma::store_matrix_sync(sw + n * 16, s_acc, kScratchPitch, wmma::mem_row_major);
      wmma::store_matrix_sync(dpw + n * 16, dp_acc, kScratchPitch, wmma::mem_row_major);
    }
    __syncwarp();

#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int c = tc_col(g, half);
      const float4 s4 = load4(sw + r * kScratchPitch + c);
      const float4 dp4 = load4(dpw + r * kScratchPitch + c);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w}, dpv[4] = {dp4.x, dp4.y, dp4.z, dp4.w};
      float ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = (row_ok && k0 + c + i <= row) ? exp2f(sv[i] * a.scale_log2 - lse2) : 0.0f;
        ds[i] = p * (dpv[i] - delta);
      }
      store_bf16x4(dsw + r * kProbPitch + c, ds[0], ds[1], ds[2], ds[3]);
    }
    __syncwarp();

#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk) {
      RowAFrag dsf;
      wmma::load_matrix_sync(dsf, dsw + kk * 16, kProbPitch);
#pragma unroll
      for (int n = 0; n < kSteps; ++n) {
        RowBFrag kf;
        wmma::load_matrix_sync(kf, ks + kk * 16 * kPitch + n * 16, kPitch);
        wmma::mma_sync(dq[n], dsf, kf, dq[n]);
      }
    }
  }

  store_accumulators<kD>(dq, sw, a.dq.head(b, h), a.dq.st, q0 + row0, a.time, a.head_dim, a.scale);
#else
  __trap();
#endif
}

#undef LOOM_ATTENTION_TC
}  // namespace loom::kernels::cuda::attention_detail
