// Fused causal attention kernels (FlashAttention-2 style); contracts in attention.h.
//
// Note [Attention versions]
// Both versions share one plan. Forward: a block owns a tile of query rows of one (b, h) and
// walks the key tiles left to right, keeping each row's running max m and denominator l
// (online softmax), rescaling its output accumulator by exp(m_old - m_new) when the max
// grows; key tiles wholly above the diagonal are never visited, so the block of query tile i
// visits i + 1 key tiles, and blocks start with the longest tiles. Scores live in base 2
// (scale * log2(e) folded in), so exp2f does the exponentials; logsumexp is stored in natural
// log. Backward is atomic-free: D_i = rowsum(dout * out) goes to the workspace, then one kernel
// owns a key tile and loops over the query tiles at or below the diagonal, accumulating dK and
// dV, and another owns a query tile and loops over key tiles, accumulating dQ; both recompute
//   P = exp(S * scale - lse),  dS = P * (dP - D_i),  dP = dO V^T,
// and dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO. Tiles are zero-padded past T and
// past head_dim, so padding adds nothing to dot products; padded rows are never stored.
//   v1: f32 tiles in shared memory, CUDA-core FMAs; 32 x 32 tiles, 4 warps of 8 rows. In S
//       a lane owns one key column; in the accumulators a lane owns head dims lane + 32c.
//       Tiles read across lanes are stored transposed with pitch 33 (conflict-free both ways).
//   v2: bf16 tiles, WMMA 16x16x16 MMAs with f32 accumulation; 64 x 64 tiles, 4 warps of 16
//       rows. A warp's scores go through its own f32 scratch (16 x 64) for the softmax, which
//       two lanes share per row; P (and dS) are rounded to bf16 for the next MMA. The forward
//       accumulator stays in registers in a layout we own (WMMA accumulator layouts are
//       opaque, so per-row rescaling cannot touch them): each P V tile goes through the
//       scratch and is added after the rescale. Backward accumulators need no rescaling and
//       stay in WMMA fragments.
// Both read rows in 16-byte chunks when head_dim fills the padded head dim and rows are
// aligned (GPT-2's fused projection), v2 with cp.async straight into shared memory; otherwise
// element by element. Rows and dims past the ends are zero-filled either way.

#include "kernels/cuda/attention.h"

#include <mma.h>

#include <atomic>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxHeadDim = 128;
constexpr int kMaxGridY = 65535;

// The version public launchers use for bf16 where the device runs it (f32 always uses v1);
// see attention.h. kSimt here is the fallback should v2 ever misbehave on a GPU.
constexpr AttentionVersion kDefaultBf16Version = AttentionVersion::kTensorCore;

// One operand of one layout: element (b, h, t, d) at ptr + b*sb + h*sh + t*st + d.
template <typename T>
struct Operand {
  T* ptr;
  int64_t sb, sh, st;
  __device__ T* head(int b, int h) const { return ptr + b * sb + h * sh; }
};

template <typename T>
struct ForwardArgs {
  Operand<const T> q, k, v;
  Operand<T> out;
  float* lse;  // [B*H*T]
  int heads, time, head_dim;
  float scale_log2;  // log2(e) / sqrt(head_dim): scores in base 2
};

template <typename T>
struct BackwardArgs {
  Operand<const T> dout, q, k, v;
  Operand<T> dq, dk, dv;
  const float* lse;    // [B*H*T], natural log
  const float* delta;  // [B*H*T], D_i = rowsum(dout * out)
  int heads, time, head_dim;
  float scale, scale_log2;
};

// 16 bytes of storage elements, for vector loads.
template <typename T>
struct alignas(16) Chunk {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// Whether rows of one head can be read in 16-byte chunks: the head dim fills the padded one,
// and every row starts 16-byte aligned. (GPT-2's fused projection qualifies.)
template <int kD, typename T>
__device__ __forceinline__ bool chunked_rows(const T* src, int64_t st, int head_dim) {
  return head_dim == kD && st % Chunk<T>::kSize == 0 &&
         reinterpret_cast<uintptr_t>(src) % sizeof(Chunk<T>) == 0;
}

// Copies 16 bytes from global to shared memory without a trip through registers (cp.async on
// sm_80+). The copies of a thread land once it calls copy_wait_all(); other threads see them
// after a barrier that follows.
__device__ __forceinline__ void copy16(void* smem_dst, const void* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *static_cast<uint4*>(smem_dst) = *static_cast<const uint4*>(gmem_src);
#endif
}
__device__ __forceinline__ void copy_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Copies rows [t0, t0 + kRows) x dims [0, kD) of one head into shared memory, row r at
// dst + r * pitch, zero past `time` rows and `head_dim` dims. Reads are coalesced along d, in
// 16-byte chunks where chunked_rows allows (dst rows must then start 16-byte aligned), and
// asynchronously (copy16) when no conversion is needed. Callers synchronise the block before
// reading dst, as always.
template <int kRows, int kD, int kThreads, typename S, typename T>
__device__ __forceinline__ void load_rows(S* dst, int pitch, const T* src, int64_t st, int t0,
                                          int time, int head_dim) {
  constexpr int kVec = Chunk<T>::kSize, kPerRow = kD / kVec;
  if constexpr (std::is_same_v<S, T>) {
    if (chunked_rows<kD>(src, st, head_dim)) {
      // Asynchronous copies need no unrolling to overlap: all are issued before the wait.
#pragma unroll 1
      for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
        const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
        if (t < time) {
          copy16(dst + r * pitch + d, src + t * st + d);
        } else {
          *reinterpret_cast<uint4*>(dst + r * pitch + d) = make_uint4(0, 0, 0, 0);
        }
      }
      copy_wait_all();
      return;
    }
  } else {
    if (chunked_rows<kD>(src, st, head_dim)) {
#pragma unroll 2
      for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
        const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
        Chunk<T> c;
        if (t < time) {
          c = *reinterpret_cast<const Chunk<T>*>(src + t * st + d);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            c.v[j] = from_float<T>(0.0f);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[r * pitch + d + j] = from_float<S>(to_float(c.v[j]));
      }
      return;
    }
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
    const int r = i / kD, d = i % kD, t = t0 + r;
    const float x = (t < time && d < head_dim) ? to_float(src[t * st + d]) : 0.0f;
    dst[r * pitch + d] = from_float<S>(x);
  }
}

// As load_rows, transposed: row r, dim d at dst[d * pitch + r].
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_rows_transposed(float* dst, int pitch, const T* src,
                                                     int64_t st, int t0, int time, int head_dim) {
  if (chunked_rows<kD>(src, st, head_dim)) {
    constexpr int kVec = Chunk<T>::kSize, kPerRow = kD / kVec;
#pragma unroll 2
    for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
      const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
      if (t < time) {
        const Chunk<T> c = *reinterpret_cast<const Chunk<T>*>(src + t * st + d);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[(d + j) * pitch + r] = to_float(c.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[(d + j) * pitch + r] = 0.0f;
      }
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
    const int r = i / kD, d = i % kD, t = t0 + r;
    dst[d * pitch + r] = (t < time && d < head_dim) ? to_float(src[t * st + d]) : 0.0f;
  }
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float dot4(float4 a, const float (&b)[4], float acc) {
  acc = fmaf(a.x, b[0], acc);
  acc = fmaf(a.y, b[1], acc);
  acc = fmaf(a.z, b[2], acc);
  return fmaf(a.w, b[3], acc);
}

// D_i = sum_d dout[i, d] * out[i, d], one warp per row.
template <typename T>
__global__ void attention_delta(Operand<const T> dout, Operand<const T> out, float* delta,
                                int heads, int time, int head_dim, int64_t rows) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
       row < rows; row += warps) {  // uniform per warp
    const int t = static_cast<int>(row % time);
    const int bh = static_cast<int>(row / time);
    const T* g = dout.head(bh / heads, bh % heads) + t * dout.st;
    const T* o = out.head(bh / heads, bh % heads) + t * out.st;
    float acc = 0.0f;
    for (int d = lane; d < head_dim; d += kWarpSize)
      acc = fmaf(to_float(g[d]), to_float(o[d]), acc);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// Blocks per SM that `smem` bytes of shared memory leave room for on sm_90 (228 KiB per SM,
// 1 KiB reserved per block), capped at `most`: the minimum passed to __launch_bounds__, which
// bounds registers per thread at 64K / (threads * blocks). Left to itself, ptxas may aim at an
// occupancy that shared memory rules out anyway, and spill to reach it.
constexpr int min_blocks(size_t smem, int most) {
  const size_t fit = (228 * 1024) / (smem + 1024);
  return fit < 1 ? 1 : (fit > size_t(most) ? most : static_cast<int>(fit));
}

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
  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
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
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(kt, kTPitch, a.k.head(b, h), a.k.st, k0,
                                                      a.time, a.head_dim);
    load_rows<kSimtTile, kD, kSimtThreads>(vs, kD, a.v.head(b, h), a.v.st, k0, a.time, a.head_dim);
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
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int kb = blockIdx.y;  // key tile 0 sees the most query tiles: first
  const int k0 = kb * kSimtTile, key0 = warp * kSimtRows;
  load_rows<kSimtTile, kD, kSimtThreads>(ks, kD, a.k.head(b, h), a.k.st, k0, a.time, a.head_dim);
  load_rows<kSimtTile, kD, kSimtThreads>(vs, kD, a.v.head(b, h), a.v.st, k0, a.time, a.head_dim);

  float dk[kSimtRows][kCols] = {}, dv[kSimtRows][kCols] = {};
  for (int qb = kb; qb < static_cast<int>(gridDim.y); ++qb) {
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

  T* dk_out = a.dk.head(b, h);
  T* dv_out = a.dv.head(b, h);
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
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
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
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(kt, kTPitch, a.k.head(b, h), a.k.st, k0,
                                                      a.time, a.head_dim);
    load_rows_transposed<kSimtTile, kD, kSimtThreads>(vt, kTPitch, a.v.head(b, h), a.v.st, k0,
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

  const int b = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int q0 = tile * kTcTile, row0 = warp * kTcRows;
  load_rows<kTcTile, kD, kTcThreads>(qs, kPitch, a.q.head(b, h), a.q.st, q0, a.time, a.head_dim);

  const int r = lane / 2, half = lane % 2, row = q0 + row0 + r;
  float m = -INFINITY, l = 0.0f;
  float o[kChunks][kGroups][4] = {};  // row r, dims ch*kChunk + tc_col(g, half) + i

  for (int kb = 0; kb <= tile; ++kb) {
    const int k0 = kb * kTcTile;
    __syncthreads();
    load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, h), a.k.st, k0, a.time, a.head_dim);
    load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, h), a.v.st, k0, a.time, a.head_dim);
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

  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int kb = blockIdx.y;
  const int k0 = kb * kTcTile, key0 = warp * kTcRows;
  load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, h), a.k.st, k0, a.time, a.head_dim);
  load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, h), a.v.st, k0, a.time, a.head_dim);

  const int r = lane / 2, half = lane % 2, key = k0 + key0 + r;
  AccFrag dk[kSteps], dv[kSteps];
#pragma unroll
  for (int n = 0; n < kSteps; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  for (int qb = kb; qb < static_cast<int>(gridDim.y); ++qb) {
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

  store_accumulators<kD>(dk, sw, a.dk.head(b, h), a.dk.st, k0 + key0, a.time, a.head_dim, a.scale);
  store_accumulators<kD>(dv, sw, a.dv.head(b, h), a.dv.st, k0 + key0, a.time, a.head_dim, 1.0f);
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

  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
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
    load_rows<kTcTile, kD, kTcThreads>(ks, kPitch, a.k.head(b, h), a.k.st, k0, a.time, a.head_dim);
    load_rows<kTcTile, kD, kTcThreads>(vs, kPitch, a.v.head(b, h), a.v.st, k0, a.time, a.head_dim);
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

// ---- Launchers -----------------------------------------------------------------------------

template <typename T>
Operand<T> operand(T* ptr, const int64_t* strides) {
  return {ptr, strides[0], strides[1], strides[2]};
}

// Launches `kernel` with `smem` bytes of dynamic shared memory, opting in past the 48 KiB
// default (the attribute is per function and device, so it is set on every launch).
template <typename Args>
void launch(void (*kernel)(Args), dim3 grid, int threads, size_t smem, cudaStream_t stream,
            const Args& args) {
  if (smem > 48 * 1024) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  kernel<<<grid, threads, smem, stream>>>(args);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Calls f.template operator()<T>() with the storage type (f32 or bf16).
template <typename F>
void dispatch_storage(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::BF16: f.template operator()<bf16>(); return;
    default:
      fail("[kernels/cuda] ", op, ": the CUDA attention kernels take f32 or bf16, got dtype #",
           static_cast<int>(dtype));
  }
}

// Calls f.template operator()<kD>() with the padded head dim (32, 64 or 128).
template <typename F>
void dispatch_head_dim(int64_t head_dim, F&& f) {
  if (head_dim <= 32) {
    f.template operator()<32>();
  } else if (head_dim <= 64) {
    f.template operator()<64>();
  } else {
    f.template operator()<128>();
  }
}

// Checks what the kernels assume; returns false when there is nothing to compute.
bool check_call(const char* op, AttentionVersion version, DType dtype, const AttentionShape& s,
                std::initializer_list<const void*> pointers) {
  if (!attention_version_supports(version, dtype)) {
    fail("[kernels/cuda] ", op, ": version v", static_cast<int>(version), " does not take dtype #",
         static_cast<int>(dtype), " (v1: f32, bf16; v2: bf16)");
  }
  if (s.batch < 0 || s.heads < 0 || s.time < 0 || s.head_dim < 0) {
    fail("[kernels/cuda] ", op, ": negative size in shape [B=", s.batch, ", H=", s.heads,
         ", T=", s.time, ", D=", s.head_dim, "]");
  }
  if (s.batch == 0 || s.heads == 0 || s.time == 0) return false;
  if (s.head_dim < 1 || s.head_dim > kMaxHeadDim) {
    fail("[kernels/cuda] ", op, ": head_dim must be in [1, ", kMaxHeadDim, "], got ", s.head_dim);
  }
  if (s.batch * s.heads > INT32_MAX || s.time > int64_t(kMaxGridY) * kSimtTile) {
    fail("[kernels/cuda] ", op,
         ": expected batch * heads <= 2^31 - 1 and time <= ", int64_t(kMaxGridY) * kSimtTile,
         ", got batch * heads = ", s.batch * s.heads, ", time = ", s.time);
  }
  for (const void* p : pointers)
    if (p == nullptr) fail("[kernels/cuda] ", op, ": null operand pointer or strides");
  return true;
}

// Whether the current device runs real v2 kernels: they are compiled as traps for virtual
// architectures below sm_80 (LOOM_ATTENTION_TC), e.g. in a build for sm_75 that a newer GPU
// JIT-compiles. Asked once per device.
bool tensor_core_kernels_run_here() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};  // 0 unknown, 1 yes, 2 no
  if (device < kCachedDevices) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known != 0) return known == 1;
  }
  cudaFuncAttributes attributes{};
  LOOM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_forward_tc<64>));
  const bool yes = attributes.ptxVersion >= 80;
  if (device < kCachedDevices) cache[device].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

AttentionVersion public_version(DType dtype) {
  if (dtype == DType::BF16 && kDefaultBf16Version == AttentionVersion::kTensorCore &&
      tensor_core_kernels_run_here()) {
    return AttentionVersion::kTensorCore;
  }
  return AttentionVersion::kSimt;
}

dim3 grid_for_tiles(const AttentionShape& s, int tile) {
  return dim3(static_cast<unsigned>(s.batch * s.heads),
              static_cast<unsigned>(ceil_div(s.time, tile)));
}

}  // namespace

bool attention_version_supports(AttentionVersion version, DType dtype) {
  switch (version) {
    case AttentionVersion::kSimt: return dtype == DType::F32 || dtype == DType::BF16;
    case AttentionVersion::kTensorCore: return dtype == DType::BF16;
  }
  return false;
}

void flash_attention_forward_version(AttentionVersion version, DType dtype, const AttentionShape& s,
                                     const void* q, const int64_t* q_strides, const void* k,
                                     const int64_t* k_strides, const void* v,
                                     const int64_t* v_strides, void* out,
                                     const int64_t* out_strides, float* logsumexp,
                                     cudaStream_t stream) {
  constexpr const char* kOp = "flash_attention_forward";
  if (!check_call(kOp, version, dtype, s,
                  {q, q_strides, k, k_strides, v, v_strides, out, out_strides, logsumexp})) {
    return;
  }
  const float scale_log2 = static_cast<float>(kLog2e / std::sqrt(double(s.head_dim)));
  dispatch_storage(dtype, kOp, [&]<typename T>() {
    const ForwardArgs<T> args{operand(static_cast<const T*>(q), q_strides),
                              operand(static_cast<const T*>(k), k_strides),
                              operand(static_cast<const T*>(v), v_strides),
                              operand(static_cast<T*>(out), out_strides),
                              logsumexp,
                              static_cast<int>(s.heads),
                              static_cast<int>(s.time),
                              static_cast<int>(s.head_dim),
                              scale_log2};
    dispatch_head_dim(s.head_dim, [&]<int kD>() {
      if constexpr (std::is_same_v<T, bf16>) {
        if (version == AttentionVersion::kTensorCore) {
          launch(attention_forward_tc<kD>, grid_for_tiles(s, kTcTile), kTcThreads,
                 tc_forward_smem<kD>(), stream, args);
          return;
        }
      }
      launch(attention_forward_simt<T, kD>, grid_for_tiles(s, kSimtTile), kSimtThreads,
             simt_forward_smem<kD>(), stream, args);
    });
  });
}

void flash_attention_backward_version(
    AttentionVersion version, DType dtype, const AttentionShape& s, const void* dout,
    const int64_t* dout_strides, const void* q, const int64_t* q_strides, const void* k,
    const int64_t* k_strides, const void* v, const int64_t* v_strides, const void* out,
    const int64_t* out_strides, const float* logsumexp, void* dq, const int64_t* dq_strides,
    void* dk, const int64_t* dk_strides, void* dv, const int64_t* dv_strides, void* workspace,
    cudaStream_t stream) {
  constexpr const char* kOp = "flash_attention_backward";
  if (!check_call(kOp, version, dtype, s,
                  {dout, dout_strides, q, q_strides, k, k_strides, v, v_strides, out, out_strides,
                   logsumexp, dq, dq_strides, dk, dk_strides, dv, dv_strides, workspace})) {
    return;
  }
  const double scale = 1.0 / std::sqrt(double(s.head_dim));
  float* delta = static_cast<float*>(workspace);
  dispatch_storage(dtype, kOp, [&]<typename T>() {
    const BackwardArgs<T> args{operand(static_cast<const T*>(dout), dout_strides),
                               operand(static_cast<const T*>(q), q_strides),
                               operand(static_cast<const T*>(k), k_strides),
                               operand(static_cast<const T*>(v), v_strides),
                               operand(static_cast<T*>(dq), dq_strides),
                               operand(static_cast<T*>(dk), dk_strides),
                               operand(static_cast<T*>(dv), dv_strides),
                               logsumexp,
                               delta,
                               static_cast<int>(s.heads),
                               static_cast<int>(s.time),
                               static_cast<int>(s.head_dim),
                               static_cast<float>(scale),
                               static_cast<float>(scale * kLog2e)};
    const int64_t rows = s.batch * s.heads * s.time;
    constexpr int kDeltaThreads = 256;
    attention_delta<T><<<grid_for(rows, kDeltaThreads / kWarpSize), kDeltaThreads, 0, stream>>>(
        args.dout, operand(static_cast<const T*>(out), out_strides), delta, args.heads, args.time,
        args.head_dim, rows);
    LOOM_CUDA_CHECK_LAUNCH();
    dispatch_head_dim(s.head_dim, [&]<int kD>() {
      if constexpr (std::is_same_v<T, bf16>) {
        if (version == AttentionVersion::kTensorCore) {
          launch(attention_backward_dkdv_tc<kD>, grid_for_tiles(s, kTcTile), kTcThreads,
                 tc_dkdv_smem<kD>(), stream, args);
          launch(attention_backward_dq_tc<kD>, grid_for_tiles(s, kTcTile), kTcThreads,
                 tc_dq_smem<kD>(), stream, args);
          return;
        }
      }
      launch(attention_backward_dkdv_simt<T, kD>, grid_for_tiles(s, kSimtTile), kSimtThreads,
             simt_dkdv_smem<kD>(), stream, args);
      launch(attention_backward_dq_simt<T, kD>, grid_for_tiles(s, kSimtTile), kSimtThreads,
             simt_dq_smem<kD>(), stream, args);
    });
  });
}

size_t flash_attention_backward_workspace(const AttentionShape& s) {
  const int64_t rows = s.batch * s.heads * s.time;
  return rows > 0 ? static_cast<size_t>(rows) * sizeof(float) : 0;
}

void flash_attention_forward(DType dtype, const AttentionShape& s, const void* q,
                             const int64_t* q_strides, const void* k, const int64_t* k_strides,
                             const void* v, const int64_t* v_strides, void* out,
                             const int64_t* out_strides, float* logsumexp, cudaStream_t stream) {
  flash_attention_forward_version(public_version(dtype), dtype, s, q, q_strides, k, k_strides, v,
                                  v_strides, out, out_strides, logsumexp, stream);
}

void flash_attention_backward(DType dtype, const AttentionShape& s, const void* dout,
                              const int64_t* dout_strides, const void* q, const int64_t* q_strides,
                              const void* k, const int64_t* k_strides, const void* v,
                              const int64_t* v_strides, const void* out, const int64_t* out_strides,
                              const float* logsumexp, void* dq, const int64_t* dq_strides, void* dk,
                              const int64_t* dk_strides, void* dv, const int64_t* dv_strides,
                              void* workspace, cudaStream_t stream) {
  flash_attention_backward_version(public_version(dtype), dtype, s, dout, dout_strides, q,
                                   q_strides, k, k_strides, v, v_strides, out, out_strides,
                                   logsumexp, dq, dq_strides, dk, dk_strides, dv, dv_strides,
                                   workspace, stream);
}

}  // namespace loom::kernels::cuda
