#pragma once
// v3 of the causal attention kernels: mma.sync m16n8k16 in PTX's register layouts, scores and
// probabilities kept in registers (Note [Attention versions] in attention.cu). Private to
// attention.cu.

#include "kernels/cuda/attention_common.cuh"

namespace loom::kernels::cuda::attention_detail {

// ---- v3: register-resident tiles (mma.sync) ------------------------------------------------

constexpr int kMmaTile = 64;      // rows a block owns, and rows of each tile it walks
constexpr int kMmaThreads = 128;  // 4 warps of 16 rows
constexpr int kMmaMaxBlocks = 3;  // up to 170 registers a thread: 4 blocks (128) spill

// bf16 tiles [64][kD + 8]: rows 16-byte aligned for ldmatrix and cp.async, and skewed by 16
// bytes, so the 8 row addresses of an ldmatrix matrix fall in 8 different bank groups.
template <int kD>
constexpr int mma_pitch() {
  return kD + 8;
}
template <int kD>
constexpr size_t mma_tile_bytes() {
  return sizeof(bf16) * kMmaTile * mma_pitch<kD>();
}
// A warp's 16-row tiles (queries for the forward and dQ, keys for dK/dV): two where the
// accumulators leave the registers for them, so that each operand of the other side feeds two
// MMAs, halving shared-memory reads per MMA (FlashAttention-2's 128-row blocks); one for head
// dim 128. A block owns mma_block_rows() rows.
template <int kD>
constexpr int mma_row_tiles() {
  return kD <= 64 ? 2 : 1;
}
template <int kD>
constexpr int mma_block_rows() {
  return kMmaTile * mma_row_tiles<kD>();
}
// The most blocks per SM the kernels are built for: 2 (up to 255 registers a thread) with two
// row tiles a warp, kMmaMaxBlocks with one.
template <int kD>
constexpr int mma_max_blocks() {
  return mma_row_tiles<kD>() == 2 ? 2 : kMmaMaxBlocks;
}
template <int kD>
constexpr size_t mma_forward_smem() {  // Q; K and V twice (double buffered)
  return (mma_row_tiles<kD>() + 4) * mma_tile_bytes<kD>();
}
template <int kD>
constexpr size_t mma_dkdv_smem() {  // K, V; Q and dO twice; lse and D twice
  return (2 * mma_row_tiles<kD>() + 4) * mma_tile_bytes<kD>() + 2 * 2 * kMmaTile * sizeof(float);
}
template <int kD>
constexpr size_t mma_dq_smem() {  // Q, dO; K and V twice
  return (2 * mma_row_tiles<kD>() + 4) * mma_tile_bytes<kD>();
}

// Issues the copies of rows [t0, t0 + 64) x dims [0, kD) of one head into a tile: cp.async
// in 16-byte pieces where chunked_rows allows (rows past `time` zero-filled by the copy);
// element by element otherwise (zero past `time` and `head_dim`; these land at once). The
// cp.async pieces join the calling thread's open group. In the 16-byte path a thread copies
// the same 8 dims of every kPass-th row, so its addresses need no division per piece, and a
// tile wholly before `time` (all but a sequence's last) needs no test per piece either.
template <int kD>
__device__ __forceinline__ void issue_tile(bf16* dst, const bf16* src, int64_t st, int t0, int time,
                                           int head_dim) {
  constexpr int kPitch = mma_pitch<kD>(), kPerRow = kD / 8;
  if (chunked_rows<kD>(src, st, head_dim)) {
    constexpr int kPass = kMmaThreads / kPerRow;  // rows a pass over the block's threads copies
    static_assert(kMmaThreads % kPerRow == 0 && kMmaTile % kPass == 0);
    const int r0 = threadIdx.x / kPerRow, d = threadIdx.x % kPerRow * 8;
    if (t0 + kMmaTile <= time) {
      const bf16* from = src + int64_t(t0 + r0) * st + d;
      const int64_t pass = kPass * st;
#pragma unroll
      for (int k = 0; k < kMmaTile / kPass; ++k)
        cp_async<16>(dst + (r0 + k * kPass) * kPitch + d, from + k * pass, 16);
      return;
    }
#pragma unroll
    for (int k = 0; k < kMmaTile / kPass; ++k) {
      const int r = r0 + k * kPass, t = t0 + r;
      const bool inside = t < time;  // row 0's address when unread: inside the head
      cp_async<16>(dst + r * kPitch + d, src + int64_t(inside ? t : 0) * st + d, inside ? 16 : 0);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kMmaTile * kD; i += kMmaThreads) {
    const int r = i / kD, d = i % kD, t = t0 + r;
    dst[r * kPitch + d] = (t < time && d < head_dim) ? src[t * st + d] : __float2bfloat16_rn(0.0f);
  }
}

// 2^x with results under 2^-126 flushed to zero: PTX's ex2.approx.ftz.f32, one MUFU.EX2 where
// exp2f adds a compare and two multiplies to produce subnormal results. The kernels raise 2 to
// a score less its row's running max or log-sum-exp (at most about 0), so a flushed weight is
// under 2^-126 of its row's largest (FlashAttention's fast-math build flushes them too).
// Elsewhere (the emulation, old architectures) exp2f with the same flush.
__device__ __forceinline__ float exp2_flushed(float x) {
#if LOOM_WARP_MMA_PTX
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return x < -126.0f ? 0.0f : exp2f(x);
#endif
}

// The bf16 halves of a pair packed by pack_bf16x2, as floats (exact).
__device__ __forceinline__ float low_bf16(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ __forceinline__ float high_bf16(uint32_t pair) {
  return __uint_as_float(pair & 0xffff0000u);
}

// Runs body(std::true_type) where `masked`, body(std::false_type) elsewhere: a body that
// tests its scores against the causal mask and the sequence's end under `if constexpr`
// is compiled twice, and the tiles wholly inside both (most of them) skip every per-score
// test; `masked` is the same for the whole block, so the branch does not diverge.
template <typename Body>
__device__ __forceinline__ void with_mask_if(bool masked, Body&& body) {
  if (masked) {
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
}

// The 64-key tiles a block of queries up to row `end` (exclusive) meets under the causal
// mask: those up to its last row, or to the last key.
__device__ __forceinline__ int key_tiles_through(int end, int time) {
  return ((end < time ? end : time) - 1) / kMmaTile + 1;
}

// Key/value tile kb of head (b, kvh) into buffer kb % 2 of `kv` (K, then V a tile after it).
template <int kD, typename Args>
__device__ __forceinline__ void issue_key_value_tile(bf16* kv, const Args& a, int b, int kvh,
                                                     int kb) {
  constexpr int kTile = kMmaTile * mma_pitch<kD>();
  bf16* buffer = kv + (kb % 2) * 2 * kTile;
  issue_tile<kD>(buffer, a.k.head(b, kvh), a.k.st, kb * kMmaTile, a.time, a.head_dim);
  issue_tile<kD>(buffer + kTile, a.v.head(b, kvh), a.v.st, kb * kMmaTile, a.time, a.head_dim);
}

// One step of a block's walk over double-buffered tiles: waits for step `step`'s copies (issued
// into buffer step % 2 by the previous step, or before the walk for step 0), synchronises the
// block, which also ends every warp's use of the other buffer, and then issues step + 1's
// copies into that one through issue(step + 1), if there is a step + 1. Returns step % 2,
// the buffer to compute on.
template <typename Issue>
__device__ __forceinline__ int walk_step(int step, int steps, Issue&& issue) {
  cp_async_wait<0>();
  __syncthreads();
  if (step + 1 < steps) issue(step + 1);
  cp_async_commit();  // an empty group after the last step
  return step % 2;
}

// Loads the A operand of rows [row0, row0 + 16) and dims [16 kk, 16 kk + 16) of a tile.
template <int kD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int kk) {
  const int lane = threadIdx.x % kWarpSize;
  ldmatrix_x4<false>(a, tile + (row0 + lane % 8 + (lane / 8 % 2) * 8) * mma_pitch<kD>() + kk * 16 +
                            (lane / 16) * 8);
}

// The B operands (k = dims [16 kk, 16 kk + 16)) of two 8-column n-tiles whose columns are tile
// rows [row0, row0 + 8) and [row0 + 8, row0 + 16): B = tile^T, as in Q K^T. b[0..1] for the
// first n-tile, b[2..3] for the second.
template <int kD>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const bf16* tile, int row0, int kk) {
  const int lane = threadIdx.x % kWarpSize;
  ldmatrix_x4<false>(b, tile + (row0 + lane % 8 + (lane / 16) * 8) * mma_pitch<kD>() + kk * 16 +
                            (lane / 8 % 2) * 8);
}

// The B operands (k = tile rows [row0, row0 + 16)) of the two 8-dim n-tiles at dims
// [16 dp, 16 dp + 16): B = tile, as in P V. b[0..1] for dims 16 dp.., b[2..3] for 16 dp + 8...
template <int kD>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], const bf16* tile, int row0, int dp) {
  const int lane = threadIdx.x % kWarpSize;
  ldmatrix_x4<true>(b, tile + (row0 + lane % 8 + (lane / 8 % 2) * 8) * mma_pitch<kD>() + dp * 16 +
                           (lane / 16) * 8);
}

// The A operand of k-step j (columns [16 j, 16 j + 16)) from accumulators c of 8-column
// n-tiles, rounded to bf16: a product's result feeds the next product from registers.
template <int kTiles>
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&c)[kTiles][4],
                                                  int j) {
  a[0] = pack_bf16x2(c[2 * j][0], c[2 * j][1]);
  a[1] = pack_bf16x2(c[2 * j][2], c[2 * j][3]);
  a[2] = pack_bf16x2(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = pack_bf16x2(c[2 * j + 1][2], c[2 * j + 1][3]);
}

// acc += A B over all kD dims for a warp's kM row tiles: A_i from `a_tile` rows
// [row0 + 16 i, row0 + 16 i + 16), B = b_tile^T over its rows [col0, col0 + 8 kTiles)
// (S = Q K^T, dP = dO V^T). Each B operand is loaded once for the kM products: more rows per
// warp, less shared-memory traffic per MMA.
template <int kD, int kM, int kTiles>
__device__ __forceinline__ void product_with_rows(float (&acc)[kM][kTiles][4], const bf16* a_tile,
                                                  int row0, const bf16* b_tile, int col0) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int i = 0; i < kM; ++i)
      load_a<kD>(a[i], a_tile, row0 + 16 * i, kk);
#pragma unroll
    for (int np = 0; np < kTiles / 2; ++np) {
      uint32_t b[4];
      load_b_rows<kD>(b, b_tile, col0 + 16 * np, kk);
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        mma_bf16_16816(acc[i][2 * np], a[i], {b[0], b[1]});
        mma_bf16_16816(acc[i][2 * np + 1], a[i], {b[2], b[3]});
      }
    }
  }
}

// acc[i] [16 x kD] += A_i B for a warp's kM row tiles, over kSteps k-steps of 16: a_step(a, i,
// j) gives A_i's k-step j (columns [16 j, 16 j + 16)), B is the tile's rows [row0, row0 + 16
// kSteps) over all kD dims (O += P V, dV += P^T dO, dQ += dS K, ...), each B operand loaded
// once for the kM products.
template <int kD, int kM, int kSteps, typename AStep>
__device__ __forceinline__ void product_with_cols_of(float (&acc)[kM][kD / 8][4], AStep&& a_step,
                                                     const bf16* b_tile, int row0) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j) {
    uint32_t a[kM][4];
#pragma unroll
    for (int i = 0; i < kM; ++i)
      a_step(a[i], i, j);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      load_b_cols<kD>(b, b_tile, row0 + 16 * j, dp);
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        mma_bf16_16816(acc[i][2 * dp], a[i], {b[0], b[1]});
        mma_bf16_16816(acc[i][2 * dp + 1], a[i], {b[2], b[3]});
      }
    }
  }
}

// product_with_cols_of with A_i the bf16 of accumulators p[i] (16 x 8 kTiles).
template <int kD, int kM, int kTiles>
__device__ __forceinline__ void product_with_cols(float (&acc)[kM][kD / 8][4],
                                                  const float (&p)[kM][kTiles][4],
                                                  const bf16* b_tile, int row0) {
  product_with_cols_of<kD, kM, kTiles / 2>(
      acc, [&](uint32_t(&a)[4], int i, int j) { accumulators_as_a(a, p[i], j); }, b_tile, row0);
}

// product_with_cols_of with A_i already bf16: p[i][n][r] holds row g + 8 r, columns 2t and
// 2t + 1 of n-tile n (an accumulator's pair, packed by pack_bf16x2).
template <int kD, int kM, int kTiles>
__device__ __forceinline__ void product_with_packed_cols(float (&acc)[kM][kD / 8][4],
                                                         const uint32_t (&p)[kM][kTiles][2],
                                                         const bf16* b_tile, int row0) {
  product_with_cols_of<kD, kM, kTiles / 2>(
      acc,
      [&](uint32_t(&a)[4], int i, int j) {
        a[0] = p[i][2 * j][0];
        a[1] = p[i][2 * j][1];
        a[2] = p[i][2 * j + 1][0];
        a[3] = p[i][2 * j + 1][1];
      },
      b_tile, row0);
}

// Writes a warp's 16 x kD accumulator times `scale` to rows t0.. of dst (bf16), through the
// warp's own rows [row0, row0 + 16) of `staging` (a tile no other warp reads any more), so
// that the global stores are coalesced; rows past `time` and dims past `head_dim` are skipped.
template <int kD>
__device__ __forceinline__ void store_rows(const float (&acc)[kD / 8][4], bf16* staging, int row0,
                                           bf16* dst, int64_t st, int t0, int time, int head_dim,
                                           float scale0, float scale1) {
  constexpr int kPitch = mma_pitch<kD>();
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    uint32_t* top = reinterpret_cast<uint32_t*>(staging + (row0 + g) * kPitch + 8 * n + 2 * t);
    uint32_t* bottom =
        reinterpret_cast<uint32_t*>(staging + (row0 + g + 8) * kPitch + 8 * n + 2 * t);
    *top = pack_bf16x2(acc[n][0] * scale0, acc[n][1] * scale0);
    *bottom = pack_bf16x2(acc[n][2] * scale1, acc[n][3] * scale1);
  }
  __syncwarp();
  if (chunked_rows<kD>(dst, st, head_dim)) {
    constexpr int kPerRow = kD / 8;
    for (int i = lane; i < 16 * kPerRow; i += kWarpSize) {
      const int r = i / kPerRow, d = (i % kPerRow) * 8;
      if (t0 + r < time) {
        *reinterpret_cast<uint4*>(dst + (t0 + r) * st + d) =
            *reinterpret_cast<const uint4*>(staging + (row0 + r) * kPitch + d);
      }
    }
  } else {
    for (int i = lane; i < 16 * kD; i += kWarpSize) {
      const int r = i / kD, d = i % kD;
      if (t0 + r < time && d < head_dim) dst[(t0 + r) * st + d] = staging[(row0 + r) * kPitch + d];
    }
  }
  __syncwarp();
}

// Forward: a block owns mma_block_rows<kD>() query rows, a warp kM 16-row tiles of them,
// and walks the 64-key tiles up to its last row. Q's operands are reloaded from shared memory
// at each tile: kept in registers they pushed the two-tile kernel past 255 registers (ptxas
// spilled), and with two row tiles each K operand already feeds two MMAs.
template <int kD>
__global__ void __launch_bounds__(kMmaThreads,
                                  min_blocks(mma_forward_smem<kD>(), mma_max_blocks<kD>()))
    attention_forward_mma(ForwardArgs<bf16> a) {
#if LOOM_WARP_MMA_EMULATED || LOOM_WARP_MMA_PTX
  constexpr int kM = mma_row_tiles<kD>(), kRows = mma_block_rows<kD>();
  constexpr int kTile = kMmaTile * mma_pitch<kD>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // kM tiles of Q rows
  bf16* kv = qs + kM * kTile;                // buffer i: K at kv + 2 i kTile, V after it
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, kvh = h / a.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows, row0 = warp * 16 * kM;
  const int key_tiles = key_tiles_through(q0 + kRows, a.time);
  int rows[kM][2];  // this lane's rows, g and g + 8 of each of its warp's row tiles
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    rows[i][0] = q0 + row0 + 16 * i + g;
    rows[i][1] = rows[i][0] + 8;
  }

  auto issue_keys = [&](int kb) { issue_key_value_tile<kD>(kv, a, b, kvh, kb); };
#pragma unroll
  for (int i = 0; i < kM; ++i)
    issue_tile<kD>(qs + i * kTile, a.q.head(b, h), a.q.st, q0 + i * kMmaTile, a.time, a.head_dim);
  issue_keys(0);
  cp_async_commit();

  float m[kM][2], l[kM][2];  // l: this lane's columns only
#pragma unroll
  for (int i = 0; i < kM; ++i)
    m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  float o[kM][kD / 8][4] = {};

  for (int kb = 0; kb < key_tiles; ++kb) {
    const int k0 = kb * kMmaTile;
    const bf16* ks = kv + walk_step(kb, key_tiles, issue_keys) * 2 * kTile;
    const bf16* vs = ks + kTile;

    float s[kM][kMmaTile / 8][4] = {};
    product_with_rows<kD>(s, qs, row0, ks, 0);

    // Online softmax (finite max: every row meets key 0 in its first tile, see v1). Lanes
    // 4g .. 4g + 3 share rows g and g + 8 of each row tile. Only tiles reaching the block's
    // diagonal or the last key need the mask. The weights are rounded to bf16 in pairs, as
    // P V's A operands, and the denominator sums the rounded weights that P V uses.
    uint32_t p[kM][kMmaTile / 8][2];
    const bool edge = k0 + kMmaTile > q0 || k0 + kMmaTile > a.time;
    with_mask_if(edge, [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kMmaTile / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[i][j][e] * a.scale_log2;
            if constexpr (kMasked) {
              const int key = k0 + 8 * j + 2 * t + e % 2;
              if (!(key <= rows[i][e / 2] && key < a.time)) x = -INFINITY;
            }
            s[i][j][e] = x;
            tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
          }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
          const float m_new = fmaxf(m[i][r], tile_max[r]);
          alpha[r] = exp2_flushed(m[i][r] - m_new);
          m[i][r] = m_new;
          l[i][r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < kMmaTile / 8; ++j)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            p[i][j][r] = pack_bf16x2(exp2_flushed(s[i][j][2 * r] - m[i][r]),
                                     exp2_flushed(s[i][j][2 * r + 1] - m[i][r]));
            l[i][r] += low_bf16(p[i][j][r]);
            l[i][r] += high_bf16(p[i][j][r]);
          }
        // A row whose max stood has alpha 1. Once rows have met their largest scores most
        // tiles leave all 16 of a row tile's maxima standing, and the warp skips multiplying
        // its output by 1 (the same bits; one vote where there were 32 multiplies).
        if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
          for (int n = 0; n < kD / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              o[i][n][e] *= alpha[e / 2];
        }
      }
    });
    product_with_packed_cols<kD>(o, p, vs, 0);
  }

#pragma unroll
  for (int i = 0; i < kM; ++i) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 1);
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 2);
      inv[r] = 1.0f / l[i][r];
      if (t == 0 && rows[i][r] < a.time)
        a.lse[int64_t(blockIdx.x) * a.time + rows[i][r]] = (m[i][r] + log2f(l[i][r])) * kLn2;
    }
    // The warp's own Q rows are free: only it read them, as its A operands.
    store_rows<kD>(o[i], qs, row0 + 16 * i, a.out.head(b, h), a.out.st, q0 + row0 + 16 * i, a.time,
                   a.head_dim, inv[0], inv[1]);
  }
#else
  __trap();
#endif
}

// dK, dV for mma_block_rows<kD>() keys of a key/value head; a warp owns kM 16-key tiles of
// them (two up to head dim 64, sharing every Q and dO operand). Scores are computed
// transposed (keys x queries): S^T = K Q^T, dP^T = V dO^T, so that P^T and dS^T are the A
// operands of dV += P^T dO and dK += dS^T Q straight from the accumulators. Query tiles are
// walked kChunk queries at a time: 32 above head dim 32, where 64 would leave the scores,
// their gradients and both accumulators more registers than a thread has (ptxas spilled).
template <int kD>
__global__ void __launch_bounds__(kMmaThreads,
                                  min_blocks(mma_dkdv_smem<kD>(), mma_max_blocks<kD>()))
    attention_backward_dkdv_mma(BackwardArgs<bf16> a) {
#if LOOM_WARP_MMA_EMULATED || LOOM_WARP_MMA_PTX
  constexpr int kM = mma_row_tiles<kD>(), kRows = kMmaTile * kM;
  constexpr int kTile = kMmaTile * mma_pitch<kD>();
  constexpr int kChunk = kD <= 32 ? 64 : 32;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);  // kM tiles of K rows, then kM of V rows
  bf16* vs = ks + kM * kTile;
  bf16* qg = vs + kM * kTile;  // buffer i: Q at qg + 2 i kTile, dO after it
  float* stats = reinterpret_cast<float*>(qg + 4 * kTile);  // buffer i: lse, then D
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int kv_heads = a.heads / a.group;
  const int b = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
  const int k0 = blockIdx.y * kRows, key0 = warp * 16 * kM;
  int keys[kM][2];  // this lane's keys, g and g + 8 of each of its warp's key tiles
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    keys[i][0] = k0 + key0 + 16 * i + g;
    keys[i][1] = keys[i][0] + 8;
  }
  // The 64-row query tiles at or below the diagonal of each query head of the group, head by
  // head: from the one holding query k0 to the last.
  const int first_query_tile = k0 / kMmaTile;
  const int query_tiles = (a.time + kMmaTile - 1) / kMmaTile - first_query_tile;
  const int steps = a.group * query_tiles;

  // Step `step`'s Q and dO tiles, and its lse (natural log, as stored) and D rows, zero past
  // the last query, into buffer step % 2, all by cp.async, so no thread waits on the loads.
  // Called for steps 0, 1, 2, ... in turn, so the head and tile advance without a division.
  // The walk's query tile after `tile`: the next one, or the first again at the next head.
  auto following = [&](int tile) {
    return tile + 1 == first_query_tile + query_tiles ? first_query_tile : tile + 1;
  };
  int next_head = kvh * a.group, next_tile = first_query_tile;
  auto issue_queries = [&](int step) {
    const int h = next_head, q0 = next_tile * kMmaTile;
    next_tile = following(next_tile);
    if (next_tile == first_query_tile) ++next_head;
    bf16* q_tile = qg + (step % 2) * 2 * kTile;
    issue_tile<kD>(q_tile, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);
    issue_tile<kD>(q_tile + kTile, a.dout.head(b, h), a.dout.st, q0, a.time, a.head_dim);
    float* lse = stats + (step % 2) * 2 * kMmaTile;
    for (int i = threadIdx.x; i < kMmaTile; i += kMmaThreads) {
      const bool ok = q0 + i < a.time;
      const int64_t at = int64_t(b * a.heads + h) * a.time + (ok ? q0 + i : 0);
      cp_async<4>(lse + i, a.lse + at, ok ? 4 : 0);
      cp_async<4>(lse + kMmaTile + i, a.delta + at, ok ? 4 : 0);
    }
  };
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    issue_tile<kD>(ks + i * kTile, a.k.head(b, kvh), a.k.st, k0 + i * kMmaTile, a.time, a.head_dim);
    issue_tile<kD>(vs + i * kTile, a.v.head(b, kvh), a.v.st, k0 + i * kMmaTile, a.time, a.head_dim);
  }
  issue_queries(0);
  cp_async_commit();

  float dk[kM][kD / 8][4] = {}, dv[kM][kD / 8][4] = {};
  for (int step = 0, tile = first_query_tile; step < steps; ++step) {
    const int q0 = tile * kMmaTile;
    tile = following(tile);
    const int buffer = walk_step(step, steps, issue_queries);
    const bf16* qs = qg + buffer * 2 * kTile;
    const bf16* gs = qs + kTile;
    const float* lse = stats + buffer * 2 * kMmaTile;
    const float* delta = lse + kMmaTile;
    // Query tiles from the block's last key on, up to the last query, need no mask.
    const bool masked = q0 < k0 + kRows || q0 + kMmaTile > a.time;

#pragma unroll 1
    for (int c0 = 0; c0 < kMmaTile; c0 += kChunk) {
      float p[kM][kChunk / 8][4] = {}, ds[kM][kChunk / 8][4] = {};
      product_with_rows<kD>(p, ks, key0, qs, c0);   // S^T
      product_with_rows<kD>(ds, vs, key0, gs, c0);  // dP^T
      with_mask_if(masked, [&](auto mask) {
#pragma unroll
        for (int i = 0; i < kM; ++i)
#pragma unroll
          for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = c0 + 8 * j + 2 * t + e % 2, query = q0 + c;
              // lse in base 2, rounded apart (__fmul_rn is never fused) as when it was stored so.
              const float lse2 = __fmul_rn(lse[c], kLog2e);
              float pv = exp2_flushed(p[i][j][e] * a.scale_log2 - lse2);
              if constexpr (decltype(mask)::value) {
                if (!(query < a.time && keys[i][e / 2] <= query)) pv = 0.0f;
              }
              p[i][j][e] = pv;
              ds[i][j][e] = pv * (ds[i][j][e] - delta[c]);
            }
      });
      product_with_cols<kD>(dv, p, gs, c0);   // dV += P^T dO
      product_with_cols<kD>(dk, ds, qs, c0);  // dK += dS^T Q
    }
  }

  // The warp's own K and V rows are free: only it read them, as its A operands.
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    const int row = key0 + 16 * i;
    store_rows<kD>(dk[i], ks, row, a.dk.head(b, kvh), a.dk.st, k0 + row, a.time, a.head_dim,
                   a.scale, a.scale);
    store_rows<kD>(dv[i], vs, row, a.dv.head(b, kvh), a.dv.st, k0 + row, a.time, a.head_dim, 1.0f,
                   1.0f);
  }
#else
  __trap();
#endif
}

// dQ for mma_block_rows<kD>() queries of a query head; a warp owns kM 16-query tiles of them (two
// up to head dim 64, sharing every K and V operand), and walks the key tiles up to the block's
// last row, kChunk keys at a time (32 with two tiles, to keep the scores, their gradients and
// the accumulators in registers).
template <int kD>
__global__ void __launch_bounds__(kMmaThreads, min_blocks(mma_dq_smem<kD>(), mma_max_blocks<kD>()))
    attention_backward_dq_mma(BackwardArgs<bf16> a) {
#if LOOM_WARP_MMA_EMULATED || LOOM_WARP_MMA_PTX
  constexpr int kM = mma_row_tiles<kD>(), kRows = kMmaTile * kM;
  constexpr int kChunk = kM == 2 ? 32 : 64;
  constexpr int kTile = kMmaTile * mma_pitch<kD>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // kM tiles of Q rows, then kM of dO rows
  bf16* gs = qs + kM * kTile;
  bf16* kv = gs + kM * kTile;  // buffer i: K at kv + 2 i kTile, V after it
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows, row0 = warp * 16 * kM;
  const int key_tiles = key_tiles_through(q0 + kRows, a.time);
  int rows[kM][2];  // this lane's rows, g and g + 8 of each of its warp's row tiles
  float lse2[kM][2], delta[kM][2];
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rows[i][r] = q0 + row0 + 16 * i + 8 * r + g;
      const bool ok = rows[i][r] < a.time;
      lse2[i][r] = ok ? a.lse[int64_t(bh) * a.time + rows[i][r]] * kLog2e : 0.0f;
      delta[i][r] = ok ? a.delta[int64_t(bh) * a.time + rows[i][r]] : 0.0f;
    }

  auto issue_keys = [&](int kb) { issue_key_value_tile<kD>(kv, a, b, kvh, kb); };
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    const int t0 = q0 + i * kMmaTile;
    issue_tile<kD>(qs + i * kTile, a.q.head(b, h), a.q.st, t0, a.time, a.head_dim);
    issue_tile<kD>(gs + i * kTile, a.dout.head(b, h), a.dout.st, t0, a.time, a.head_dim);
  }
  issue_keys(0);
  cp_async_commit();

  float dq[kM][kD / 8][4] = {};
  for (int kb = 0; kb < key_tiles; ++kb) {
    const int k0 = kb * kMmaTile;
    const bf16* ks = kv + walk_step(kb, key_tiles, issue_keys) * 2 * kTile;
    const bf16* vs = ks + kTile;
    // Key tiles wholly left of the block's first row need no mask, unless the block holds
    // rows past the last.
    const bool masked = k0 + kMmaTile > q0 || q0 + kRows > a.time;
#pragma unroll 1
    for (int c0 = 0; c0 < kMmaTile; c0 += kChunk) {
      float p[kM][kChunk / 8][4] = {}, ds[kM][kChunk / 8][4] = {};
      product_with_rows<kD>(p, qs, row0, ks, c0);   // S
      product_with_rows<kD>(ds, gs, row0, vs, c0);  // dP
      with_mask_if(masked, [&](auto mask) {
#pragma unroll
        for (int i = 0; i < kM; ++i)
#pragma unroll
          for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = e / 2;
              float pv = exp2_flushed(p[i][j][e] * a.scale_log2 - lse2[i][r]);
              if constexpr (decltype(mask)::value) {
                const int key = k0 + c0 + 8 * j + 2 * t + e % 2;
                if (!(rows[i][r] < a.time && key <= rows[i][r])) pv = 0.0f;
              }
              ds[i][j][e] = pv * (ds[i][j][e] - delta[i][r]);
            }
      });
      product_with_cols<kD>(dq, ds, ks, c0);  // dQ += dS K
    }
  }

  // The warp's own Q rows are free: only it read them, as its A operands.
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    const int row = row0 + 16 * i;
    store_rows<kD>(dq[i], qs, row, a.dq.head(b, h), a.dq.st, q0 + row, a.time, a.head_dim, a.scale,
                   a.scale);
  }
#else
  __trap();
#endif
}

}  // namespace loom::kernels::cuda::attention_detail
