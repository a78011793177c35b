// Softmax and cross-entropy kernels (see softmax.h for the contracts).
//
// Row softmax: one warp per row (8 rows per 256-thread block) while a row is at most
// kWarpRowMaxPacks 16-byte packs, one block per row beyond. Each thread keeps an online
// (max, sum of exp(x - max)) over its elements, so one read of the row finds both; the groups
// combine them, and a second read (from L1/L2) writes y.
//
// Cross-entropy: the vocabulary row (50304 logits for GPT-2) is far wider than a warp's fair
// share, so one block per row, with the same online max/sum in one pass over the row. The row
// losses go to a buffer and one small block adds them in f64 in an order fixed by the row count
// (a strided share per thread, then a fixed tree; not the CPU's row order, so the two agree to
// f64 rounding), so the mean is deterministic and needs no atomics. Backward recomputes softmax
// from the saved logsumexp.

#include "kernels/cuda/softmax.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;       // threads per block in the warp-per-row kernels
constexpr int kWarpRowMaxPacks = 512;  // wider rows get a whole block each
constexpr int kVocabMaxThreads = 512;  // threads per block in the cross-entropy kernels
constexpr int kMeanThreads = 1024;     // the one block that averages the row losses

// Threads for a block per row: about `per_thread` packs per thread, within [lo, hi], a
// multiple of the warp size.
int row_block_threads(int64_t packs, int64_t per_thread, int lo, int hi) {
  int64_t threads = ceil_div(ceil_div(packs, per_thread), kWarpSize) * kWarpSize;
  return static_cast<int>(threads < lo ? lo : (threads > hi ? hi : threads));
}

// Running softmax statistics of a set of values: m = max, s = sum of exp(v - m). -inf values
// contribute nothing (a set of only -inf values stays m = -inf, s = 0).
struct OnlineSoftmax {
  float m = -INFINITY, s = 0.0f;

  template <int V>
  __device__ __forceinline__ void add(const float (&v)[V]) {
    float pack_max = v[0];
#pragma unroll
    for (int k = 1; k < V; ++k)
      pack_max = fmaxf(pack_max, v[k]);
    const float new_m = fmaxf(m, pack_max);
    if (new_m == -INFINITY) return;
    float add = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k)
      add += expf(v[k] - new_m);
    s = (new_m == m ? s : s * expf(m - new_m)) + add;
    m = new_m;
  }

  // Combines the statistics of all threads of the group; every thread gets the total.
  template <bool kBlockPerRow>
  __device__ __forceinline__ OnlineSoftmax reduce(const RowGroup<kBlockPerRow>& g,
                                                  float* scratch) const {
    OnlineSoftmax total;
    total.m = g.max(m, scratch);
    total.s = g.sum(m == -INFINITY ? 0.0f : s * expf(m - total.m), scratch);
    return total;
  }
};

// Prints and traps (a device-side assert that survives NDEBUG) when target is outside
// [0, vocab). `target` must be the same for all threads of the block.
__device__ __forceinline__ void check_target(int64_t row, int64_t target, int64_t vocab) {
  if (target < 0 || target >= vocab) {
    if (threadIdx.x == 0) {
      printf(
          "[loom] cross_entropy: target %lld of row %lld is out of range; expected 0 <= "
          "target < vocab = %lld\n",
          static_cast<long long>(target), static_cast<long long>(row),
          static_cast<long long>(vocab));
    }
    __syncthreads();  // uniform branch: the message is written before any thread traps
    __trap();
  }
}

// y may alias x: every read of the first pass ends before the group reduction, and the last
// pass reads each pack right before the same thread overwrites it.
template <typename T, int V, bool kBlockPerRow>
__global__ void __launch_bounds__(1024)
    softmax_forward_kernel(const T* x, T* y, int64_t rows, int width, int64_t causal_t) {
  __shared__ float scratch[kWarpSize];
  const RowGroup<kBlockPerRow> g;
  if (g.row >= rows) return;  // a whole warp (warp mode only; block mode has grid == rows)
  const int valid = causal_t > 0 ? static_cast<int>(g.row % causal_t) + 1 : width;
  const int valid_packs = static_cast<int>(ceil_div(valid, V));
  const int packs = width / V;
  const T* xr = x + g.row * width;

  OnlineSoftmax stats;
  for (int p = g.lane; p < valid_packs; p += g.lanes) {
    const Pack<T, V> xv = load_pack<V>(xr + p * V);
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k)
      v[k] = p * V + k < valid ? to_float(xv.v[k]) : -INFINITY;
    stats.add(v);
  }
  const OnlineSoftmax total = stats.reduce(g, scratch);
  const float inv = 1.0f / total.s;

  T* yr = y + g.row * width;
  for (int p = g.lane; p < packs; p += g.lanes) {
    Pack<T, V> out;
    if (p < valid_packs) {
      const Pack<T, V> xv = load_pack<V>(xr + p * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out.v[k] =
            from_float<T>(p * V + k < valid ? expf(to_float(xv.v[k]) - total.m) * inv : 0.0f);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k)
        out.v[k] = from_float<T>(0.0f);
    }
    store_pack<V>(yr + p * V, out);
  }
}

// dx may alias y or dy (same argument as the forward kernel).
template <typename T, int V, bool kBlockPerRow>
__global__ void __launch_bounds__(1024)
    softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows, int width) {
  __shared__ float scratch[kWarpSize];
  const RowGroup<kBlockPerRow> g;
  if (g.row >= rows) return;
  const int packs = width / V;
  const T* yr = y + g.row * width;
  const T* dyr = dy + g.row * width;

  float dot = 0.0f;
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> yv = load_pack<V>(yr + p * V);
    const Pack<T, V> dyv = load_pack<V>(dyr + p * V);
#pragma unroll
    for (int k = 0; k < V; ++k)
      dot += to_float(yv.v[k]) * to_float(dyv.v[k]);
  }
  dot = g.sum(dot, scratch);

  T* dxr = dx + g.row * width;
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> yv = load_pack<V>(yr + p * V);
    const Pack<T, V> dyv = load_pack<V>(dyr + p * V);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k)
      out.v[k] = from_float<T>(to_float(yv.v[k]) * (to_float(dyv.v[k]) - dot));
    store_pack<V>(dxr + p * V, out);
  }
}

// The logsumexp of a row of `packs` packs, every thread of the block getting it (one read of
// the row: online max and sum of exps).
template <typename T, int V>
__device__ __forceinline__ float row_logsumexp(const T* xr, int packs, const RowGroup<true>& g,
                                               float* scratch) {
  OnlineSoftmax stats;
#pragma unroll 2
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> xv = load_pack<V>(xr + p * V);
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k)
      v[k] = to_float(xv.v[k]);
    stats.add(v);
  }
  const OnlineSoftmax total = stats.reduce(g, scratch);
  return total.m + logf(total.s);
}

// One block per row: logsumexp and loss of the row, in one read of the logits. Of a part of
// the classes (kernels::Part): the logsumexp of the part, and in row_losses the target's logit
// where it falls in the part, else 0.
template <typename T, int V>
__global__ void __launch_bounds__(kVocabMaxThreads)
    cross_entropy_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                 float* __restrict__ logsumexp, float* __restrict__ row_losses,
                                 int vocab, Part part) {
  __shared__ float scratch[kWarpSize];
  const RowGroup<true> g;
  const int64_t target = targets[g.row] - part.first;
  if (!part.part) check_target(g.row, target, vocab);
  const int packs = vocab / V;
  const T* xr = logits + g.row * vocab;

  const float lse = row_logsumexp<T, V>(xr, packs, g, scratch);
  if (threadIdx.x == 0) {
    logsumexp[g.row] = lse;
    if (!part.part) {
      row_losses[g.row] = lse - to_float(xr[target]);
    } else {
      row_losses[g.row] = target >= 0 && target < vocab ? to_float(xr[target]) : 0.0f;
    }
  }
}

// mean_loss = (sum of row_losses in f64) / rows. One block: each thread adds a strided subset
// in order, then a fixed shuffle tree, so the result does not depend on timing.
__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void __launch_bounds__(kMeanThreads)
    mean_loss_kernel(const float* __restrict__ row_losses, float* __restrict__ mean_loss,
                     int64_t rows) {
  __shared__ double scratch[kWarpSize];
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    sum += row_losses[r];
  sum = warp_sum_f64(sum);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) scratch[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarpSize;
    sum = warp_sum_f64(lane < warps ? scratch[lane] : 0.0);
    if (lane == 0) mean_loss[0] = static_cast<float>(sum / static_cast<double>(rows));
  }
}

// One logit's gradient, scale * (softmax - onehot) with scale = dloss / rows: the arithmetic of
// cross_entropy_backward_kernel and of the one-pass kernel, so that both write the same bits.
__device__ __forceinline__ float logit_gradient(float logit, float lse, float scale,
                                                bool is_target) {
  // __fmul_rn keeps the product rounded before the subtraction, as the CPU kernel does.
  const float d = __fmul_rn(scale, expf(logit - lse));
  return is_target ? d - scale : d;
}

// dlogits = scale * (softmax - onehot), scale = dloss / rows. dlogits may alias logits: each
// pack is read right before the same thread overwrites it, and no other thread reads it.
template <typename T, int V>
__global__ void __launch_bounds__(kVocabMaxThreads)
    cross_entropy_backward_kernel(const T* logits, const int64_t* __restrict__ targets,
                                  const float* __restrict__ logsumexp,
                                  const float* __restrict__ dloss, T* dlogits, int64_t rows,
                                  int vocab, Part part) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row] - part.first;  // of a part: outside it, no onehot below
  if (!part.part) check_target(row, target, vocab);
  // As the CPU op: the scale in double, rounded once to the compute type.
  const float scale = static_cast<float>(static_cast<double>(dloss[0]) / static_cast<double>(rows));
  const float lse = logsumexp[row];
  const int packs = vocab / V;
  const T* xr = logits + row * vocab;
  T* dr = dlogits + row * vocab;
  const auto grad = [&](const Pack<T, V>& xv, int p) {
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k)
      out.v[k] = from_float<T>(logit_gradient(to_float(xv.v[k]), lse, scale, p * V + k == target));
    return out;
  };
  // Two packs per step, both loaded before either store: dlogits may alias logits, so the
  // compiler may not move a load above an earlier store on its own.
  for (int p = threadIdx.x; p < packs; p += 2 * blockDim.x) {
    const int q = p + blockDim.x;
    const Pack<T, V> a = load_pack<V>(xr + p * V);
    Pack<T, V> b;
    if (q < packs) b = load_pack<V>(xr + q * V);
    store_pack<V>(dr + p * V, grad(a, p));
    if (q < packs) store_pack<V>(dr + q * V, grad(b, q));
  }
}

// cross_entropy_forward_kernel's statistics and loss, then cross_entropy_backward_kernel's
// gradient over the logits: one block per row. The target's logit is read for the loss before
// the barrier, and each pack of the second pass is read right before the same thread
// overwrites it.
template <typename T, int V>
__global__ void __launch_bounds__(kVocabMaxThreads)
    cross_entropy_forward_backward_kernel(T* logits, const int64_t* __restrict__ targets,
                                          float* __restrict__ logsumexp,
                                          float* __restrict__ row_losses, float scale, int vocab) {
  __shared__ float scratch[kWarpSize];
  const RowGroup<true> g;
  const int64_t target = targets[g.row];
  check_target(g.row, target, vocab);
  const int packs = vocab / V;
  T* xr = logits + g.row * vocab;

  const float lse = row_logsumexp<T, V>(xr, packs, g, scratch);
  if (threadIdx.x == 0) {
    logsumexp[g.row] = lse;
    row_losses[g.row] = lse - to_float(xr[target]);
  }
  __syncthreads();  // the target's logit is read before any thread overwrites it
  for (int p = g.lane; p < packs; p += g.lanes) {
    const Pack<T, V> xv = load_pack<V>(xr + p * V);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int column = p * V + k;
      out.v[k] = from_float<T>(logit_gradient(to_float(xv.v[k]), lse, scale, column == target));
    }
    store_pack<V>(xr + p * V, out);
  }
}

// dlogits *= *dloss / expected unless they are equal (then every block returns at once).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rescale_kernel(T* dlogits, const float* __restrict__ dloss, float expected,
                                 int64_t count) {
  const float got = dloss[0];
  if (got == expected) return;
  const float factor = got / expected;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dlogits[i] = from_float<T>(to_float(dlogits[i]) * factor);
}

void check_sizes(const char* op, int64_t rows, int64_t width) {
  if (rows < 0 || width < 0 || width > INT32_MAX || rows > INT32_MAX) {
    fail(op, ": expected 0 <= rows <= 2^31 - 1 and 0 <= width <= 2^31 - 1, got rows ", rows,
         " and width ", width);
  }
}

// Launches a row kernel: warp per row for narrow rows, block per row for wide ones.
template <typename WarpKernel, typename BlockKernel, typename... Args>
void launch_rows(WarpKernel warp_kernel, BlockKernel block_kernel, int64_t rows, int64_t packs,
                 cudaStream_t stream, Args... args) {
  if (packs <= kWarpRowMaxPacks) {
    const auto grid = static_cast<unsigned>(ceil_div(rows, kRowThreads / kWarpSize));
    warp_kernel<<<grid, kRowThreads, 0, stream>>>(args...);
  } else {
    block_kernel<<<static_cast<unsigned>(rows), row_block_threads(packs, 8, 128, 1024), 0,
                   stream>>>(args...);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void softmax_forward(DType dtype, const void* x, void* y, int64_t rows, int64_t width,
                     int64_t causal_t, cudaStream_t stream) {
  check_sizes("softmax_forward", rows, width);
  if (causal_t > 0 && causal_t != width) {
    fail(
        "softmax_forward: a causal softmax needs [..., T, T] rows, so causal_t must equal width; "
        "got causal_t ",
        causal_t, " and width ", width);
  }
  dispatch_float_storage(dtype, "softmax_forward", [&]<typename T>() {
    if (rows == 0 || width == 0) return;
    const int w = static_cast<int>(width);
    const auto* xp = static_cast<const T*>(x);
    auto* yp = static_cast<T*>(y);
    constexpr int V = kPackElems<T>;
    if (width % V == 0 && aligned16(x) && aligned16(y)) {
      launch_rows(softmax_forward_kernel<T, V, false>, softmax_forward_kernel<T, V, true>, rows,
                  width / V, stream, xp, yp, rows, w, causal_t);
    } else {
      launch_rows(softmax_forward_kernel<T, 1, false>, softmax_forward_kernel<T, 1, true>, rows,
                  width, stream, xp, yp, rows, w, causal_t);
    }
  });
}

void softmax_backward(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                      int64_t width, cudaStream_t stream) {
  check_sizes("softmax_backward", rows, width);
  dispatch_float_storage(dtype, "softmax_backward", [&]<typename T>() {
    if (rows == 0 || width == 0) return;
    const int w = static_cast<int>(width);
    const auto* yp = static_cast<const T*>(y);
    const auto* dyp = static_cast<const T*>(dy);
    auto* dxp = static_cast<T*>(dx);
    constexpr int V = kPackElems<T>;
    if (width % V == 0 && aligned16(y) && aligned16(dy) && aligned16(dx)) {
      launch_rows(softmax_backward_kernel<T, V, false>, softmax_backward_kernel<T, V, true>, rows,
                  width / V, stream, yp, dyp, dxp, rows, w);
    } else {
      launch_rows(softmax_backward_kernel<T, 1, false>, softmax_backward_kernel<T, 1, true>, rows,
                  width, stream, yp, dyp, dxp, rows, w);
    }
  });
}

namespace {

// The row kernel of cross_entropy_forward and cross_entropy_part_forward.
void launch_cross_entropy_rows(DType dtype, const void* logits, const int64_t* targets,
                               float* logsumexp, float* row_values, int64_t rows, int64_t vocab,
                               Part part, cudaStream_t stream) {
  dispatch_float_storage(dtype, "cross_entropy_forward", [&]<typename T>() {
    const int v = static_cast<int>(vocab);
    const auto* lp = static_cast<const T*>(logits);
    const auto grid = static_cast<unsigned>(rows);
    constexpr int V = kPackElems<T>;
    if (vocab % V == 0 && aligned16(logits)) {
      const int threads = row_block_threads(vocab / V, 4, kWarpSize, kVocabMaxThreads);
      cross_entropy_forward_kernel<T, V>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, row_values, v, part);
    } else {
      const int threads = row_block_threads(vocab, 4 * V, kWarpSize, kVocabMaxThreads);
      cross_entropy_forward_kernel<T, 1>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, row_values, v, part);
    }
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// The sizes of a mean loss over rows: at least one row and one class.
void check_loss_sizes(const char* op, int64_t rows, int64_t vocab) {
  check_sizes(op, rows, vocab);
  if (rows == 0 || vocab == 0) {
    fail(op, ": expected at least one row and one class, got rows ", rows, " and vocab ", vocab,
         "; the mean over zero targets is undefined");
  }
}

void launch_mean_loss(const float* row_losses, float* mean_loss, int64_t rows,
                      cudaStream_t stream) {
  mean_loss_kernel<<<1, kMeanThreads, 0, stream>>>(row_losses, mean_loss, rows);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cross_entropy_part_forward(DType dtype, const void* logits, const int64_t* targets,
                                int64_t first, float* logsumexp, float* picked, int64_t rows,
                                int64_t vocab, cudaStream_t stream) {
  check_sizes("cross_entropy_part_forward", rows, vocab);
  if (rows == 0) return;
  if (vocab == 0) fail("cross_entropy_part_forward: a part of no classes");
  launch_cross_entropy_rows(dtype, logits, targets, logsumexp, picked, rows, vocab,
                            {first, true}, stream);
}

void cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets,
                           float* logsumexp, float* row_losses, float* mean_loss, int64_t rows,
                           int64_t vocab, cudaStream_t stream) {
  check_loss_sizes("cross_entropy_forward", rows, vocab);
  launch_cross_entropy_rows(dtype, logits, targets, logsumexp, row_losses, rows, vocab, {},
                            stream);
  launch_mean_loss(row_losses, mean_loss, rows, stream);
}

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets,
                            const float* logsumexp, const float* dloss, void* dlogits, int64_t rows,
                            int64_t vocab, cudaStream_t stream, Part part) {
  check_sizes("cross_entropy_backward", rows, vocab);
  dispatch_float_storage(dtype, "cross_entropy_backward", [&]<typename T>() {
    if (rows == 0 || vocab == 0) return;
    const int v = static_cast<int>(vocab);
    const auto* lp = static_cast<const T*>(logits);
    auto* out = static_cast<T*>(dlogits);
    const auto grid = static_cast<unsigned>(rows);
    constexpr int V = kPackElems<T>;
    if (vocab % V == 0 && aligned16(logits) && aligned16(dlogits)) {
      const int threads = row_block_threads(vocab / V, 4, kWarpSize, kVocabMaxThreads);
      cross_entropy_backward_kernel<T, V>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, dloss, out, rows, v, part);
    } else {
      const int threads = row_block_threads(vocab, 4 * V, kWarpSize, kVocabMaxThreads);
      cross_entropy_backward_kernel<T, 1>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, dloss, out, rows, v, part);
    }
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_forward_backward(DType dtype, void* logits_then_gradient, const int64_t* targets,
                                    float* logsumexp, float* row_losses, float* mean_loss,
                                    float dloss, int64_t rows, int64_t vocab, cudaStream_t stream) {
  check_loss_sizes("cross_entropy_forward_backward", rows, vocab);
  // As cross_entropy_backward_kernel's scale: in double, rounded once.
  const float scale = static_cast<float>(static_cast<double>(dloss) / static_cast<double>(rows));
  dispatch_float_storage(dtype, "cross_entropy_forward_backward", [&]<typename T>() {
    const int v = static_cast<int>(vocab);
    auto* lp = static_cast<T*>(logits_then_gradient);
    const auto grid = static_cast<unsigned>(rows);
    constexpr int V = kPackElems<T>;
    if (vocab % V == 0 && aligned16(lp)) {
      const int threads = row_block_threads(vocab / V, 4, kWarpSize, kVocabMaxThreads);
      cross_entropy_forward_backward_kernel<T, V>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, row_losses, scale, v);
    } else {
      const int threads = row_block_threads(vocab, 4 * V, kWarpSize, kVocabMaxThreads);
      cross_entropy_forward_backward_kernel<T, 1>
          <<<grid, threads, 0, stream>>>(lp, targets, logsumexp, row_losses, scale, v);
    }
    LOOM_CUDA_CHECK_LAUNCH();
  });
  launch_mean_loss(row_losses, mean_loss, rows, stream);
}

void cross_entropy_rescale(DType dtype, void* dlogits, const float* dloss, float expected,
                           int64_t count, cudaStream_t stream) {
  if (!std::isfinite(expected) || expected == 0.0f) {
    fail("cross_entropy_rescale: expected a finite, nonzero expected gradient, got ", expected);
  }
  if (count < 0) fail("cross_entropy_rescale: expected count >= 0, got ", count);
  dispatch_float_storage(dtype, "cross_entropy_rescale", [&]<typename T>() {
    if (count == 0) return;
    // Few blocks: when nothing is to be done, the launch is all it costs.
    cross_entropy_rescale_kernel<T><<<grid_for(count, kRowThreads, 1024), kRowThreads, 0, stream>>>(
        static_cast<T*>(dlogits), dloss, expected, count);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace loom::kernels::cuda
