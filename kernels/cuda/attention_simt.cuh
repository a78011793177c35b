#pragma once
// v1 of the causal attention kernels: f32 tiles, CUDA-core FMAs (Note [Attention versions]
// in attention.cu). Private to attention.cu.

#include "kernels/cuda/attention_common.cuh"

namespace loom::kernels::cuda::attention_detail {

// ---- v1: SIMT ------------------------------------------------------------------------------

constexpr int kSimtTile = 32;      // query rows per block and keys per tile
constexpr int kSimtThreads = 128;  // 4 warps
constexpr int kSimtRows = 8;       // rows (queries or keys) per warp
constexpr int kTPitch = kSimtTile + 1;
constexpr int kSimtMaxBlocks = 3;  // registers: up to 168 per thread (255 for kD = 128 backward)

template <int kD>
constexpr size_t simt_forward_smem() {  // Q, K^T, V, P
  return sizeof(float) * (kSimtTile * kD * 2 + kD * kTPitch + kSimtTile * kSimtTile);
}
template <int kD>
constexpr size_t simt_dkdv_smem() {  // K, V; P, dS; Q^T, dO^T
  return sizeof(float) * (kSimtTile * kD * 2 + kSimtTile * kSimtTile * 2 + kD * kTPitch * 2);
}
template <int kD>
constexpr size_t simt_dq_smem() {  // Q, dO; dS; K^T, V^T
  return sizeof(float) * (kSimtTile * kD * 2 + kSimtTile * kSimtTile + kD * kTPitch * 2);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kSimtThreads, min_blocks(simt_forward_smem<kD>(), kSimtMaxBlocks))
    attention_forward_simt(ForwardArgs<T> a) {
  constexpr int kCols = kD / kWarpSize;
  extern __shared__ __align__(128) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // [32][kD]
  float* vs = qs + kSimtTile * kD;             // [32][kD]
  float* ps = vs + kSimtTile * kD;             // [32][32]
  float* kt = ps + kSimtTile * kSimtTile;      // [kD][33], K transposed

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, kvh = h / a.group;
  const int tile = gridDim.y - 1 - blockIdx.y;  // most key tiles first
  const int q0 = tile * kSimtTile, row0 = warp * kSimtRows;
  load_rows<kSimtTile, kD, kSimtThreads>(qs, kD, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);

  float m[kSimtRows], l[kSimtRows], o[kSimtRows][kCols];
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      o[r][c] = 0.0f;
  }

  for (int kb = 0; kb <= tile; ++kb) {
    const int k0 = kb * kSimtTile;
    __syncthreads();  // the previous tile's K and V are no longer read
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(kt, kTPitch, a.k.head(b, kvh), a.k.st, k0,
                                                      a.time, a.head_dim);
    load_rows<kSimtTile, kD, kSimtThreads>(vs, kD, a.v.head(b, kvh), a.v.st, k0, a.time,
                                           a.head_dim);
    __syncthreads();

    float s[kSimtRows] = {};
#pragma unroll 2
    for (int d = 0; d < kD; d += 4) {
      float kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        kv[i] = kt[(d + i) * kTPitch + lane];
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r)
        s[r] = dot4(load4(qs + (row0 + r) * kD + d), kv, s[r]);
    }

    // Online softmax. Every row sees a finite score in every visited tile (key k0 <= q0 <=
    // row, and k0 < T), so m_new is finite and no inf - inf appears.
    const int key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) {
      const int row = q0 + row0 + r;
      const float x = (key <= row && key < a.time) ? s[r] * a.scale_log2 : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));
      const float alpha = exp2f(m[r] - m_new);
      const float p = exp2f(x - m_new);
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        o[r][c] *= alpha;
      ps[(row0 + r) * kSimtTile + lane] = p;
    }
    __syncwarp();

    // O += P V: lane owns dims lane + 32c of the warp's rows.
#pragma unroll 2
    for (int j = 0; j < kSimtTile; j += 4) {
      float vv[kCols][4];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          vv[c][i] = vs[(j + i) * kD + lane + kWarpSize * c];
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        const float4 p4 = load4(ps + (row0 + r) * kSimtTile + j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          o[r][c] = dot4(p4, vv[c], o[r][c]);
      }
    }
  }

  T* out = a.out.head(b, h);
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    const int row = q0 + row0 + r;
    if (row >= a.time) break;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < a.head_dim) out[row * a.out.st + d] = from_float<T>(o[r][c] * inv);
    }
    if (lane == 0) a.lse[int64_t(blockIdx.x) * a.time + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// dK, dV for one key tile; warps own 8 keys, and a lane one query of the current query tile.
template <typename T, int kD>
__global__ void __launch_bounds__(kSimtThreads,
                                  min_blocks(simt_dkdv_smem<kD>(), kD > 64 ? 2 : kSimtMaxBlocks))
    attention_backward_dkdv_simt(BackwardArgs<T> a) {
  constexpr int kCols = kD / kWarpSize;
  extern __shared__ __align__(128) unsigned char smem[];
  float* ks = reinterpret_cast<float*>(smem);  // [32][kD]
  float* vs = ks + kSimtTile * kD;             // [32][kD]
  float* ps = vs + kSimtTile * kD;             // [32 keys][32 queries]
  float* dss = ps + kSimtTile * kSimtTile;     // [32 keys][32 queries]
  float* qt = dss + kSimtTile * kSimtTile;     // [kD][33], Q transposed
  float* gt = qt + kD * kTPitch;               // [kD][33], dO transposed

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int kv_heads = a.heads / a.group;
  const int b = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
  const int kb = blockIdx.y;  // key tile 0 sees the most query tiles: first
  const int k0 = kb * kSimtTile, key0 = warp * kSimtRows;
  load_rows<kSimtTile, kD, kSimtThreads>(ks, kD, a.k.head(b, kvh), a.k.st, k0, a.time, a.head_dim);
  load_rows<kSimtTile, kD, kSimtThreads>(vs, kD, a.v.head(b, kvh), a.v.st, k0, a.time, a.head_dim);

  float dk[kSimtRows][kCols] = {}, dv[kSimtRows][kCols] = {};
  // The query tiles at or below the diagonal of each query head of the group, head by head.
  const int query_tiles = static_cast<int>(gridDim.y) - kb;
  for (int step = 0; step < a.group * query_tiles; ++step) {
    const int h = kvh * a.group + step / query_tiles, qb = kb + step % query_tiles;
    const int bh = b * a.heads + h;
    const int q0 = qb * kSimtTile;
    __syncthreads();
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(qt, kTPitch, a.q.head(b, h), a.q.st, q0,
                                                      a.time, a.head_dim);
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(gt, kTPitch, a.dout.head(b, h), a.dout.st, q0,
                                                      a.time, a.head_dim);
    __syncthreads();

    const int row = q0 + lane;
    const bool row_ok = row < a.time;
    const float lse2 = row_ok ? a.lse[int64_t(bh) * a.time + row] * kLog2e : 0.0f;
    const float delta = row_ok ? a.delta[int64_t(bh) * a.time + row] : 0.0f;

    float s[kSimtRows] = {}, dp[kSimtRows] = {};
#pragma unroll 2
    for (int d = 0; d < kD; d += 4) {
      float qv[4], gv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qv[i] = qt[(d + i) * kTPitch + lane];
        gv[i] = gt[(d + i) * kTPitch + lane];
      }
#pragma unroll
      for (int j = 0; j < kSimtRows; ++j) {
        s[j] = dot4(load4(ks + (key0 + j) * kD + d), qv, s[j]);
        dp[j] = dot4(load4(vs + (key0 + j) * kD + d), gv, dp[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kSimtRows; ++j) {
      const int key = k0 + key0 + j;
      const float p = (row_ok && key <= row) ? exp2f(s[j] * a.scale_log2 - lse2) : 0.0f;
      ps[(key0 + j) * kSimtTile + lane] = p;
      dss[(key0 + j) * kSimtTile + lane] = p * (dp[j] - delta);
    }
    __syncwarp();

    // dV += P^T dO, dK += dS^T Q over the tile's queries; lane owns dims lane + 32c.
#pragma unroll 2
    for (int r = 0; r < kSimtTile; r += 4) {
      float qv[kCols][4], gv[kCols][4];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          qv[c][i] = qt[(lane + kWarpSize * c) * kTPitch + r + i];
          gv[c][i] = gt[(lane + kWarpSize * c) * kTPitch + r + i];
        }
#pragma unroll
      for (int j = 0; j < kSimtRows; ++j) {
        const float4 p4 = load4(ps + (key0 + j) * kSimtTile + r);
        const float4 ds4 = load4(dss + (key0 + j) * kSimtTile + r);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          dv[j][c] = dot4(p4, gv[c], dv[j][c]);
          dk[j][c] = dot4(ds4, qv[c], dk[j][c]);
        }
      }
    }
  }

  T* dk_out = a.dk.head(b, kvh);
  T* dv_out = a.dv.head(b, kvh);
#pragma unroll
  for (int j = 0; j < kSimtRows; ++j) {
    const int key = k0 + key0 + j;
    if (key >= a.time) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < a.head_dim) {
        dk_out[key * a.dk.st + d] = from_float<T>(dk[j][c] * a.scale);
        dv_out[key * a.dv.st + d] = from_float<T>(dv[j][c]);
      }
    }
  }
}

// dQ for one query tile; warps own 8 queries, and a lane one key of the current key tile.
template <typename T, int kD>
__global__ void __launch_bounds__(kSimtThreads,
                                  min_blocks(simt_dq_smem<kD>(), kD > 64 ? 2 : kSimtMaxBlocks))
    attention_backward_dq_simt(BackwardArgs<T> a) {
  constexpr int kCols = kD / kWarpSize;
  extern __shared__ __align__(128) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // [32][kD]
  float* gs = qs + kSimtTile * kD;             // [32][kD], dO
  float* dss = gs + kSimtTile * kD;            // [32 queries][32 keys]
  float* kt = dss + kSimtTile * kSimtTile;     // [kD][33], K transposed
  float* vt = kt + kD * kTPitch;               // [kD][33], V transposed

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads, kvh = h / a.group;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int q0 = tile * kSimtTile, row0 = warp * kSimtRows;
  load_rows<kSimtTile, kD, kSimtThreads>(qs, kD, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);
  load_rows<kSimtTile, kD, kSimtThreads>(gs, kD, a.dout.head(b, h), a.dout.st, q0, a.time,
                                         a.head_dim);
  float lse2[kSimtRows], delta[kSimtRows];
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    const int row = q0 + row0 + r;
    lse2[r] = row < a.time ? a.lse[int64_t(bh) * a.time + row] * kLog2e : 0.0f;
    delta[r] = row < a.time ? a.delta[int64_t(bh) * a.time + row] : 0.0f;
  }

  float dq[kSimtRows][kCols] = {};
  for (int kb = 0; kb <= tile; ++kb) {
    const int k0 = kb * kSimtTile;
    __syncthreads();
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(kt, kTPitch, a.k.head(b, kvh), a.k.st, k0,
                                                      a.time, a.head_dim);
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(vt, kTPitch, a.v.head(b, kvh), a.v.st, k0,
                                                      a.time, a.head_dim);
    __syncthreads();

    float s[kSimtRows] = {}, dp[kSimtRows] = {};
#pragma unroll 2
    for (int d = 0; d < kD; d += 4) {
      float kv[4], vv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kv[i] = kt[(d + i) * kTPitch + lane];
        vv[i] = vt[(d + i) * kTPitch + lane];
      }
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        s[r] = dot4(load4(qs + (row0 + r) * kD + d), kv, s[r]);
        dp[r] = dot4(load4(gs + (row0 + r) * kD + d), vv, dp[r]);
      }
    }
    const int key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) {
      const int row = q0 + row0 + r;
      const float p = (row < a.time && key <= row) ? exp2f(s[r] * a.scale_log2 - lse2[r]) : 0.0f;
      dss[(row0 + r) * kSimtTile + lane] = p * (dp[r] - delta[r]);
    }
    __syncwarp();

    // dQ += dS K; lane owns dims lane + 32c.
#pragma unroll 2
    for (int j = 0; j < kSimtTile; j += 4) {
      float kv[kCols][4];
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          kv[c][i] = kt[(lane + kWarpSize * c) * kTPitch + j + i];
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r) {
        const float4 ds4 = load4(dss + (row0 + r) * kSimtTile + j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          dq[r][c] = dot4(ds4, kv[c], dq[r][c]);
      }
    }
  }

  T* dq_out = a.dq.head(b, h);
#pragma unroll
  for (int r = 0; r < kSimtRows; ++r) {
    const int row = q0 + row0 + r;
    if (row >= a.time) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < a.head_dim) dq_out[row * a.dq.st + d] = from_float<T>(dq[r][c] * a.scale);
    }
  }
}
}  // namespace loom::kernels::cuda::attention_detail
