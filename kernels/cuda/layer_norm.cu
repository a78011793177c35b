// Layer normalisation kernels (see layer_norm.h for the contracts).
//
// Forward: one warp per row (8 rows per 256-thread block) while a row is at most
// kWarpRowMaxPacks 16-byte packs, one block per row beyond. The row is read three times
// (mean, variance, output), as the CPU kernel does; the second and third reads of a row hit
// L1/L2, so DRAM sees one read of x and one write of y.
//
// Backward: one block per chunk of kChunkRows rows. Phase 1: a warp per row computes the two
// row sums of the dx formula. Phase 2: each thread owns columns and walks the chunk's rows,
// writing dx and summing dweight/dbias for its columns in row order; the chunk's sums go to
// the workspace. A second kernel adds the chunks' partial sums in chunk order. No atomics, so
// every run gives the same bits; the chunking depends only on the sizes, not on the device.

#include "kernels/cuda/layer_norm.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {


constexpr int kRowThreads = 256;       // threads per block in the warp-per-row kernels
constexpr int kWarpRowMaxPacks = 512;  // wider rows get a whole block each
constexpr int kChunkRows = 16;         // rows per block in backward (and per partial sum)
constexpr int kBackwardThreads = 256;
constexpr int kLoadBatch = 8;  // rows whose loads phase 2 issues together
constexpr int kSumCols = 32;   // columns per block when adding partial sums
constexpr int kSumLanes = 16;  // threads per column when adding partial sums
constexpr int kSumThreads = kSumCols * kSumLanes;


// Threads for a block-per-row launch: about eight packs per thread, 128 to 1024 threads.
int block_row_threads(int64_t packs) {
  int64_t threads = ceil_div(ceil_div(packs, 8), kWarpSize) * kWarpSize;
  return static_cast<int>(threads < 128 ? 128 : (threads > 1024 ? 1024 : threads));
}

// kCentered: layer norm; otherwise RMS norm (the mean taken as 0, no bias: bias may be null).
// y is stored as Y: T, or a 16-bit float for an f32 T (rounded once from the f32 value).
// With a residual (of R, Y or T, widened on load), each row first becomes x + residual,
// written to `sum` and normalised from there: every later pass of a thread reads back the
// packs it wrote itself, so no barrier is needed.
template <typename T, typename Y, typename R, int V, bool kBlockPerRow, bool kCentered>
__global__ void __launch_bounds__(1024)
    layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                              const T* __restrict__ bias, Y* __restrict__ y,
                              float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                              int width, double eps, const R* __restrict__ residual, T* sum) {
  __shared__ float scratch[kWarpSize];
  const RowGroup<kBlockPerRow> g;
  if (g.row >= rows) return;  // a whole warp (warp mode only; block mode has grid == rows)
  const int packs = width / V;
  const T* xr = x + g.row * width;
  if (residual != nullptr) {
    const R* rr = residual + g.row * width;
    T* sr = sum + g.row * width;
    for (int p = g.lane; p < packs; p += g.lanes) {
      const Pack<T, V> xv = load_pack<V>(xr + p * V);
      const Pack<R, V> rv = load_pack<V>(rr + p * V);
      Pack<T, V> sv;
#pragma unroll
      for (int k = 0; k < V; ++k)
        sv.v[k] = from_float<T>(to_float(xv.v[k]) + to_float(rv.v[k]));
      store_pack<V>(sr + p * V, sv);
    }
    xr = sr;
  }

  float m = 0.0f;
  if constexpr (kCentered) {
    float sum = 0.0f;
    for (int p = g.lane; p < packs; p += g.lanes) {
      const Pack<T, V> xv = load_pack<V>(xr + p * V);
#pragma unroll
      for (int k = 0; k < V; ++k)
        sum += to_float(xv.v[k]);
    }
    m = g.sum(sum, scratch) / static_cast<float>(width);
  }

  float sq = 0.0f;
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> xv = load_pack<V>(xr + p * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = to_float(xv.v[k]) - m;
      sq += d * d;
    }
  }
  const float var = g.sum(sq, scratch) / static_cast<float>(width);
  // As the CPU kernel: the square root in double, then rounded to f32.
  const float s = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));

  Y* yr = y + g.row * width;
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> xv = load_pack<V>(xr + p * V);
    const Pack<T, V> wv = load_pack<V>(weight + p * V);
    Pack<Y, V> out;
    if constexpr (kCentered) {
      const Pack<T, V> bv = load_pack<V>(bias + p * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out.v[k] =
            from_float<Y>((to_float(xv.v[k]) - m) * s * to_float(wv.v[k]) + to_float(bv.v[k]));
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        out.v[k] = from_float<Y>(to_float(xv.v[k]) * s * to_float(wv.v[k]));
    }
    store_pack<V>(yr + p * V, out);
  }
  if (g.lane == 0) {
    if constexpr (kCentered) mean[g.row] = m;
    rstd[g.row] = s;
  }
}

// dx for a chunk of rows, and the chunk's f32 sums of dweight (partials[2 * chunk]) and dbias
// (partials[2 * chunk + 1]), each [width]. dy is read as D: T, or a 16-bit float for an f32 T.
// dx may alias dy (when D is T): phase 2 reads each element before the same thread overwrites
// it, and phase 1 of this block (the only other reader of these rows) has finished by then.
// A `dsum` (the gradient that reached x along a residual stream) is added to dx, and a
// `dx_low` gets dx rounded to D as well (a 16-bit residual's gradient); either may be null.
template <typename T, typename D, int V, bool kCentered>
__global__ void __launch_bounds__(kBackwardThreads)
    layer_norm_backward_kernel(const D* dy, const T* __restrict__ x, const T* __restrict__ weight,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               T* dx, float* __restrict__ partials, int64_t rows, int width,
                               const T* __restrict__ dsum, D* __restrict__ dx_low) {
  __shared__ float s_mean[kChunkRows], s_rstd[kChunkRows];
  __shared__ float s_mean_dxhat[kChunkRows], s_mean_dxhat_xhat[kChunkRows];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kChunkRows;
  const int chunk_rows = static_cast<int>(rows - first < kChunkRows ? rows - first : kChunkRows);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int packs = width / V;
  const float inv_width = 1.0f / static_cast<float>(width);

  // Phase 1: dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight.
  for (int r = warp; r < chunk_rows; r += warps) {
    const int64_t row = first + r;
    const T* xr = x + row * width;
    const D* dyr = dy + row * width;
    const float m = kCentered ? mean[row] : 0.0f, s = rstd[row];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int p = lane; p < packs; p += kWarpSize) {
      const Pack<T, V> xv = load_pack<V>(xr + p * V);
      const Pack<D, V> dyv = load_pack<V>(dyr + p * V);
      const Pack<T, V> wv = load_pack<V>(weight + p * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (to_float(xv.v[k]) - m) * s;
        const float dxhat = to_float(dyv.v[k]) * to_float(wv.v[k]);
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
      }
    }
    sum_dxhat = warp_sum(sum_dxhat);
    sum_dxhat_xhat = warp_sum(sum_dxhat_xhat);
    if (lane == 0) {
      s_mean[r] = m;
      s_rstd[r] = s;
      s_mean_dxhat[r] = kCentered ? sum_dxhat * inv_width : 0.0f;
      s_mean_dxhat_xhat[r] = sum_dxhat_xhat * inv_width;
    }
  }
  __syncthreads();

  // Phase 2: column-owned. A warp touches 32 consecutive columns of one row at a time, so the
  // accesses coalesce; the rows were just read in phase 1 and mostly come from L2.
  float* dweight_part = partials + static_cast<int64_t>(blockIdx.x) * 2 * width;
  float* dbias_part = dweight_part + width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const float w = to_float(weight[c]);
    float dw = 0.0f, db = 0.0f;
    // Loads of a batch of rows first, then the stores: dx may alias dy, so the compiler could
    // not move a load of row r + 1 above the store to row r, and the loads would run one after
    // another.
#pragma unroll 1
    for (int r0 = 0; r0 < kChunkRows; r0 += kLoadBatch) {
      float xs[kLoadBatch], dys[kLoadBatch], dss[kLoadBatch];
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int64_t i = (first + r0 + k) * width + c;
        xs[k] = r0 + k < chunk_rows ? to_float(x[i]) : 0.0f;
        dys[k] = r0 + k < chunk_rows ? to_float(dy[i]) : 0.0f;
        dss[k] = r0 + k < chunk_rows && dsum != nullptr ? to_float(dsum[i]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        const int r = r0 + k;
        if (r < chunk_rows) {
          const float xhat = (xs[k] - s_mean[r]) * s_rstd[r];
          const float dxhat = dys[k] * w;
          const int64_t i = (first + r) * width + c;
          float v = s_rstd[r] * (dxhat - s_mean_dxhat[r] - xhat * s_mean_dxhat_xhat[r]);
          if (dsum != nullptr) v += dss[k];
          dx[i] = from_float<T>(v);
          if (dx_low != nullptr) dx_low[i] = from_float<D>(v);
          dw += dys[k] * xhat;
          db += dys[k];
        }
      }
    }
    dweight_part[c] = dw;
    dbias_part[c] = db;
  }
}

// dweight[c] / dbias[c] = sum over chunks of the partials, in a fixed order: thread (y, x)
// adds chunks y, y + kSumLanes, ... of column x; then thread y == 0 adds the kSumLanes sums in
// order of y. Either output may be null.
template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    layer_norm_param_grad_kernel(const float* __restrict__ partials, T* __restrict__ dweight,
                                 T* __restrict__ dbias, int64_t chunks, int width) {
  __shared__ float s_dw[kSumLanes][kSumCols + 1], s_db[kSumLanes][kSumCols + 1];
  const int c = blockIdx.x * kSumCols + threadIdx.x;
  float dw = 0.0f, db = 0.0f;
  if (c < width) {
    for (int64_t k = threadIdx.y; k < chunks; k += kSumLanes) {
      dw += partials[2 * k * width + c];
      db += partials[(2 * k + 1) * width + c];
    }
  }
  s_dw[threadIdx.y][threadIdx.x] = dw;
  s_db[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    dw = 0.0f;
    db = 0.0f;
#pragma unroll
    for (int j = 0; j < kSumLanes; ++j) {
      dw += s_dw[j][threadIdx.x];
      db += s_db[j][threadIdx.x];
    }
    if (dweight) dweight[c] = from_float<T>(dw);
    if (dbias) dbias[c] = from_float<T>(db);
  }
}

void check_sizes(const char* op, int64_t rows, int64_t width) {
  if (rows < 0 || width < 0 || width > INT32_MAX || rows > INT32_MAX) {
    fail(op, ": expected 0 <= rows <= 2^31 - 1 and 0 <= width <= 2^31 - 1, got rows ", rows,
         " and width ", width);
  }
}

int64_t backward_chunks(int64_t rows) {
  return ceil_div(rows, kChunkRows);
}

template <typename T, typename Y, typename R, int V, bool kCentered>
void launch_forward(const void* x, const void* weight, const void* bias, void* y, float* mean,
                    float* rstd, int64_t rows, int width, double eps, const void* residual,
                    void* sum, cudaStream_t stream) {
  const auto* xp = static_cast<const T*>(x);
  const auto* wp = static_cast<const T*>(weight);
  const auto* bp = static_cast<const T*>(bias);
  auto* yp = static_cast<Y*>(y);
  const auto* rp = static_cast<const R*>(residual);
  auto* sp = static_cast<T*>(sum);
  const int64_t packs = width / V;
  if (packs <= kWarpRowMaxPacks) {
    const auto grid = static_cast<unsigned>(ceil_div(rows, kRowThreads / kWarpSize));
    layer_norm_forward_kernel<T, Y, R, V, false, kCentered>
        <<<grid, kRowThreads, 0, stream>>>(xp, wp, bp, yp, mean, rstd, rows, width, eps, rp, sp);
  } else {
    layer_norm_forward_kernel<T, Y, R, V, true, kCentered>
        <<<static_cast<unsigned>(rows), block_row_threads(packs), 0, stream>>>(
            xp, wp, bp, yp, mean, rstd, rows, width, eps, rp, sp);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T, typename D, int V, bool kCentered>
void launch_backward(const void* dy, const void* x, const void* weight, const float* mean,
                     const float* rstd, void* dx, float* partials, int64_t rows, int width,
                     const void* dsum, void* dx_low, cudaStream_t stream) {
  layer_norm_backward_kernel<T, D, V, kCentered>
      <<<static_cast<unsigned>(backward_chunks(rows)), kBackwardThreads, 0, stream>>>(
          static_cast<const D*>(dy), static_cast<const T*>(x), static_cast<const T*>(weight), mean,
          rstd, static_cast<T*>(dx), partials, rows, width, static_cast<const T*>(dsum),
          static_cast<D*>(dx_low));
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {

// Calls f.template operator()<T, L>() for the storage types of dtype (T) and of low_dtype (L),
// the dtype of y in forward and of dy in backward: dtype itself, or bf16/f16 for an f32 dtype.
template <typename F>
void dispatch_norm_storage(DType dtype, DType low_dtype, const char* op, F&& f) {
  dispatch_float_storage(dtype, op, [&]<typename T>() {
    if (low_dtype == dtype) return f.template operator()<T, T>();
    if (dtype != DType::F32 || (low_dtype != DType::BF16 && low_dtype != DType::F16)) {
      fail(op, ": the output and its gradient are of the input's dtype or, for an f32 input, ",
           "bf16 or f16; got ", dtype_name(low_dtype), " for ", dtype_name(dtype));
    }
    dispatch_float_storage(low_dtype, op, [&]<typename L>() { f.template operator()<T, L>(); });
  });
}

// residual and sum (of dtype): both null, or a residual (of residual_dtype: dtype or y_dtype)
// added first.
template <bool kCentered>
void normalize_forward(const char* op, DType dtype, DType y_dtype, const void* x,
                       const void* weight, const void* bias, void* y, float* mean, float* rstd,
                       int64_t rows, int64_t width, double eps, cudaStream_t stream,
                       const void* residual = nullptr, DType residual_dtype = DType::F32,
                       void* sum = nullptr) {
  check_sizes(op, rows, width);
  if (residual != nullptr && residual_dtype != dtype && residual_dtype != y_dtype) {
    fail(op, ": a residual of ", dtype_name(residual_dtype), "; expected ", dtype_name(dtype),
         " or ", dtype_name(y_dtype));
  }
  dispatch_norm_storage(dtype, y_dtype, op, [&]<typename T, typename Y>() {
    if (rows == 0 || width == 0) return;
    const int w = static_cast<int>(width);
    constexpr int V = kPackElems<T>;
    const bool packed = width % V == 0 && aligned16(x) && aligned16(weight) &&
                        (!kCentered || aligned16(bias)) && aligned16(y) && aligned16(residual) &&
                        aligned16(sum);
    const auto launch = [&]<typename R>() {
      if (packed) {
        launch_forward<T, Y, R, V, kCentered>(x, weight, bias, y, mean, rstd, rows, w, eps,
                                              residual, sum, stream);
      } else {
        launch_forward<T, Y, R, 1, kCentered>(x, weight, bias, y, mean, rstd, rows, w, eps,
                                              residual, sum, stream);
      }
    };
    if (residual != nullptr && residual_dtype == dtype) launch.template operator()<T>();
    else launch.template operator()<Y>();
  });
}

// dsum (of dtype, added to dx) and dx_low (dx in dy_dtype) may be null.
template <bool kCentered>
void normalize_backward(const char* op, DType dtype, DType dy_dtype, const void* dy, const void* x,
                        const void* weight, const float* mean, const float* rstd, void* dx,
                        void* dweight, void* dbias, int64_t rows, int64_t width, void* workspace,
                        cudaStream_t stream, const void* dsum = nullptr, void* dx_low = nullptr) {
  check_sizes(op, rows, width);
  if (rows > 0 && width > 0 && workspace == nullptr) {
    fail(op, ": workspace is null; expected layer_norm_backward_workspace(", rows, ", ", width,
         ") = ", layer_norm_backward_workspace(rows, width), " bytes of device memory");
  }
  dispatch_norm_storage(dtype, dy_dtype, op, [&]<typename T, typename D>() {
    if (width == 0) return;
    const int w = static_cast<int>(width);
    auto* partials = static_cast<float*>(workspace);
    if (rows > 0) {
      constexpr int V = kPackElems<T>;
      if (width % V == 0 && aligned16(dy) && aligned16(x) && aligned16(weight)) {
        launch_backward<T, D, V, kCentered>(dy, x, weight, mean, rstd, dx, partials, rows, w,
                                            dsum, dx_low, stream);
      } else {
        launch_backward<T, D, 1, kCentered>(dy, x, weight, mean, rstd, dx, partials, rows, w,
                                            dsum, dx_low, stream);
      }
    }
    if (dweight == nullptr && dbias == nullptr) return;
    const dim3 block(kSumCols, kSumLanes);
    layer_norm_param_grad_kernel<T>
        <<<static_cast<unsigned>(ceil_div(width, kSumCols)), block, 0, stream>>>(
            partials, static_cast<T*>(dweight), static_cast<T*>(dbias), backward_chunks(rows), w);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void layer_norm_forward(DType dtype, DType y_dtype, const void* x, const void* weight,
                        const void* bias, void* y, float* mean, float* rstd, int64_t rows,
                        int64_t width, double eps, cudaStream_t stream) {
  normalize_forward<true>("layer_norm_forward", dtype, y_dtype, x, weight, bias, y, mean, rstd,
                          rows, width, eps, stream);
}

size_t layer_norm_backward_workspace(int64_t rows, int64_t width) {
  check_sizes("layer_norm_backward_workspace", rows, width);
  return static_cast<size_t>(backward_chunks(rows)) * 2 * static_cast<size_t>(width) *
         sizeof(float);
}

void layer_norm_backward(DType dtype, DType dy_dtype, const void* dy, const void* x,
                         const void* weight, const float* mean, const float* rstd, void* dx,
                         void* dweight, void* dbias, int64_t rows, int64_t width, void* workspace,
                         cudaStream_t stream) {
  normalize_backward<true>("layer_norm_backward", dtype, dy_dtype, dy, x, weight, mean, rstd, dx,
                           dweight, dbias, rows, width, workspace, stream);
}

void add_layer_norm_forward(DType dtype, DType low_dtype, DType residual_dtype, const void* x,
                            const void* residual, const void* weight, const void* bias, void* sum,
                            void* y, float* mean, float* rstd, int64_t rows, int64_t width,
                            double eps, cudaStream_t stream) {
  if (residual == nullptr || sum == nullptr) {
    fail("add_layer_norm_forward: residual or sum is null");
  }
  normalize_forward<true>("add_layer_norm_forward", dtype, low_dtype, x, weight, bias, y, mean,
                          rstd, rows, width, eps, stream, residual, residual_dtype, sum);
}

void add_layer_norm_backward(DType dtype, DType low_dtype, const void* dy, const void* dsum,
                             const void* sum, const void* weight, const float* mean,
                             const float* rstd, void* dx, void* dresidual, void* dweight,
                             void* dbias, int64_t rows, int64_t width, void* workspace,
                             cudaStream_t stream) {
  normalize_backward<true>("add_layer_norm_backward", dtype, low_dtype, dy, sum, weight, mean,
                           rstd, dx, dweight, dbias, rows, width, workspace, stream, dsum,
                           dresidual);
}

void add_rms_norm_forward(DType dtype, DType low_dtype, DType residual_dtype, const void* x,
                          const void* residual, const void* weight, void* sum, void* y,
                          float* rstd, int64_t rows, int64_t width, double eps,
                          cudaStream_t stream) {
  if (residual == nullptr || sum == nullptr) {
    fail("add_rms_norm_forward: residual or sum is null");
  }
  normalize_forward<false>("add_rms_norm_forward", dtype, low_dtype, x, weight, nullptr, y,
                           nullptr, rstd, rows, width, eps, stream, residual, residual_dtype,
                           sum);
}

void add_rms_norm_backward(DType dtype, DType low_dtype, const void* dy, const void* dsum,
                           const void* sum, const void* weight, const float* rstd, void* dx,
                           void* dresidual, void* dweight, int64_t rows, int64_t width,
                           void* workspace, cudaStream_t stream) {
  normalize_backward<false>("add_rms_norm_backward", dtype, low_dtype, dy, sum, weight, nullptr,
                            rstd, dx, dweight, nullptr, rows, width, workspace, stream, dsum,
                            dresidual);
}

void rms_norm_forward(DType dtype, DType y_dtype, const void* x, const void* weight, void* y,
                      float* rstd, int64_t rows, int64_t width, double eps, cudaStream_t stream) {
  normalize_forward<false>("rms_norm_forward", dtype, y_dtype, x, weight, nullptr, y, nullptr,
                           rstd, rows, width, eps, stream);
}

void rms_norm_backward(DType dtype, DType dy_dtype, const void* dy, const void* x,
                       const void* weight, const float* rstd, void* dx, void* dweight,
                       int64_t rows, int64_t width, void* workspace, cudaStream_t stream) {
  normalize_backward<false>("rms_norm_backward", dtype, dy_dtype, dy, x, weight, nullptr, rstd,
                            dx, dweight, nullptr, rows, width, workspace, stream);
}

}  // namespace loom::kernels::cuda
