// Embedding kernels (see embedding.h for the contracts).
//
// Forward is a gather: one warp per looked-up row, 16-byte packs.
//
// Backward is a scatter-add, which on a GPU is usually done with atomicAdd; that makes the
// order of additions (and so the bits of the result) depend on timing. Instead:
//   1. keys[n] = indices[n] - first (u32, range-checked), values[n] = n; for a part of a
//      table (kernels::Part), an index outside it gets key vocab instead, sorted last and
//      added nowhere;
//   2. cub::DeviceRadixSort::SortPairs by key. The radix sort is stable, so equal indices keep
//      their positions in increasing n;
//   3. one thread per (sorted slot, column pack); a thread whose slot starts a run of equal
//      keys walks the run and adds dout[n] for each n in order into an f32 accumulator that
//      starts at zero, then adds it, rounded to the storage type, to the dweight row and
//      stores once. Other threads return at once.
//      The kernel takes as long as the longest run (a frequent token): its rows are loaded in
//      batches of kRunBatch to keep that walk short, but it stays serial, which is the price
//      of adding in the CPU's order.
// Each dweight element is written by exactly one thread, in the CPU kernel's order of n.

#include "kernels/cuda/embedding.h"

#include <cstdint>
#include <cstdio>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {


constexpr int kThreads = 256;
constexpr size_t kWorkspaceAlign = 256;
constexpr int kRunBatch = 8;  // rows of a run whose loads are issued together

// Prints and traps (a device-side assert that survives NDEBUG) when index is outside
// [0, vocab). Called by one thread, or by a whole warp with the same index.
__device__ __forceinline__ void check_index(const char* op, int64_t position, int64_t index,
                                            int64_t vocab, bool print) {
  if (index < 0 || index >= vocab) {
    if (print) {
      printf(
          "[loom] %s: index %lld at position %lld is out of range; expected 0 <= index < "
          "vocab = %lld\n",
          op, static_cast<long long>(index), static_cast<long long>(position),
          static_cast<long long>(vocab));
    }
    __syncwarp(__activemask());  // the message is written before the warp traps
    __trap();
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(const int64_t* __restrict__ indices, const T* __restrict__ weight,
                             T* __restrict__ out, int64_t count, int width, int64_t vocab,
                             Part part) {
  const int64_t n =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= count) return;
  const int64_t index = indices[n] - part.first;
  T* dst = out + n * width;
  if (part.part && (index < 0 || index >= vocab)) {  // another rank's row: zeros
    Pack<T, V> zero;
#pragma unroll
    for (int k = 0; k < V; ++k)
      zero.v[k] = from_float<T>(0.0f);
    for (int p = lane; p < width / V; p += kWarpSize)
      store_pack<V>(dst + p * V, zero);
    return;
  }
  check_index("embedding_forward", n, index, vocab, lane == 0);
  const T* src = weight + index * width;
  for (int p = lane; p < width / V; p += kWarpSize)
    store_pack<V>(dst + p * V, load_pack<V>(src + p * V));
}

__global__ void __launch_bounds__(kThreads)
    make_sort_pairs_kernel(const int64_t* __restrict__ indices, uint32_t* __restrict__ keys,
                           int32_t* __restrict__ positions, int64_t count, int64_t vocab,
                           Part part) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < count;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t index = indices[n] - part.first;
    if (part.part && (index < 0 || index >= vocab)) {
      keys[n] = static_cast<uint32_t>(vocab);  // another rank's row: sorted last, added nowhere
    } else {
      check_index("embedding_backward", n, index, vocab, true);
      keys[n] = static_cast<uint32_t>(index);
    }
    positions[n] = static_cast<int32_t>(n);
  }
}

// Thread (slot i, pack p): if slot i starts a run of equal keys below `vocab`, adds the run's
// dout rows in sorted (= increasing n) order to dweight[key], columns [p * V, p * V + V).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    add_runs_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ positions,
                    const T* __restrict__ dout, T* __restrict__ dweight, int64_t count, int width,
                    int64_t vocab) {
  const int packs = width / V;
  const int64_t total = count * packs;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t / packs;
    const int p = static_cast<int>(t - i * packs);
    const uint32_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;  // not the start of a run
    if (key >= vocab) continue;                 // another rank's rows (kernels::Part)
    T* dst = dweight + static_cast<int64_t>(key) * width + p * V;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k)
      acc[k] = 0.0f;
    // The run's rows in batches: the loads of a batch are independent and issued together
    // (a run of a frequent token can be hundreds of rows long), the additions stay in order.
    for (int64_t j = i;; j += kRunBatch) {
      bool in_run[kRunBatch];
      Pack<T, V> g[kRunBatch];
#pragma unroll
      for (int u = 0; u < kRunBatch; ++u) {
        in_run[u] = j + u < count && keys[j + u] == key;  // sorted: a prefix of the batch
        if (in_run[u])
          g[u] = load_pack<V>(dout + static_cast<int64_t>(positions[j + u]) * width + p * V);
      }
#pragma unroll
      for (int u = 0; u < kRunBatch; ++u) {
        if (in_run[u]) {
#pragma unroll
          for (int k = 0; k < V; ++k)
            acc[k] += to_float(g[u].v[k]);
        }
      }
      if (!in_run[kRunBatch - 1]) break;
    }
    // The run's sum, rounded to T as a gradient of zeros would hold it, added to the row once.
    const Pack<T, V> old = load_pack<V>(dst);
    Pack<T, V> result;
#pragma unroll
    for (int k = 0; k < V; ++k)
      result.v[k] = from_float<T>(to_float(old.v[k]) + to_float(from_float<T>(acc[k])));
    store_pack<V>(dst, result);
  }
}

size_t round_up(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Sort key bits for keys in [0, vocab): at least 1.
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < vocab)
    ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t count, int end_bit) {
  size_t bytes = 0;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(count),
      0, end_bit));
  return bytes;
}

void check_sizes(const char* op, int64_t count, int64_t width, int64_t vocab) {
  if (count < 0 || width < 0 || vocab < 0 || count > INT32_MAX || width > INT32_MAX ||
      vocab > INT32_MAX) {
    fail(op, ": expected count, width and vocab in [0, 2^31 - 1], got count ", count, ", width ",
         width, " and vocab ", vocab);
  }
}

template <typename T, int V>
void launch_forward(const int64_t* indices, const void* weight, void* out, int64_t count, int width,
                    int64_t vocab, Part part, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(ceil_div(count, kThreads / kWarpSize));
  embedding_forward_kernel<T, V><<<grid, kThreads, 0, stream>>>(
      indices, static_cast<const T*>(weight), static_cast<T*>(out), count, width, vocab, part);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T, int V>
void launch_add_runs(const uint32_t* keys, const int32_t* positions, const void* dout,
                     void* dweight, int64_t count, int width, int64_t vocab, cudaStream_t stream) {
  add_runs_kernel<T, V><<<grid_for(count * (width / V), kThreads), kThreads, 0, stream>>>(
      keys, positions, static_cast<const T*>(dout), static_cast<T*>(dweight), count, width, vocab);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(DType dtype, const int64_t* indices, const void* weight, void* out,
                       int64_t count, int64_t width, int64_t vocab, cudaStream_t stream,
                       Part part) {
  check_sizes("embedding_forward", count, width, vocab);
  dispatch_float_storage(dtype, "embedding_forward", [&]<typename T>() {
    if (count == 0 || width == 0) return;
    const int w = static_cast<int>(width);
    constexpr int V = kPackElems<T>;
    if (width % V == 0 && aligned16(weight) && aligned16(out)) {
      launch_forward<T, V>(indices, weight, out, count, w, vocab, part, stream);
    } else {
      launch_forward<T, 1>(indices, weight, out, count, w, vocab, part, stream);
    }
  });
}

size_t embedding_backward_workspace(int64_t count) {
  check_sizes("embedding_backward_workspace", count, 0, 0);
  if (count == 0) return 0;
  const size_t array = round_up(static_cast<size_t>(count) * sizeof(uint32_t));
  // 32 key bits: the most any vocab needs (the temp storage grows with the number of passes).
  return 4 * array + round_up(sort_temp_bytes(count, 32));
}

void embedding_backward(DType dtype, const int64_t* indices, const void* dout, void* dweight,
                        int64_t count, int64_t width, int64_t vocab, void* workspace,
                        cudaStream_t stream, Part part) {
  check_sizes("embedding_backward", count, width, vocab);
  dispatch_float_storage(dtype, "embedding_backward", [&]<typename T>() {
    if (count == 0 || width == 0) return;
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0) {
      fail("embedding_backward: expected a ", kWorkspaceAlign,
           "-byte aligned workspace of "
           "embedding_backward_workspace(",
           count, ") bytes, got ", workspace);
    }
    const int end_bit = key_bits(part.part ? vocab + 1 : vocab);  // a part sorts others last
    const size_t array = round_up(static_cast<size_t>(count) * sizeof(uint32_t));
    size_t temp_bytes = sort_temp_bytes(count, end_bit);
    const size_t reserved = embedding_backward_workspace(count) - 4 * array;
    if (temp_bytes > reserved) {
      fail("embedding_backward: CUB asks for ", temp_bytes, " bytes of sort storage for ", count,
           " keys of ", end_bit, " bits, more than the ", reserved, " that the workspace holds");
    }
    auto* base = static_cast<char*>(workspace);
    auto* keys_in = reinterpret_cast<uint32_t*>(base);
    auto* positions_in = reinterpret_cast<int32_t*>(base + array);
    auto* keys = reinterpret_cast<uint32_t*>(base + 2 * array);
    auto* positions = reinterpret_cast<int32_t*>(base + 3 * array);
    void* temp = base + 4 * array;

    make_sort_pairs_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(
        indices, keys_in, positions_in, count, vocab, part);
    LOOM_CUDA_CHECK_LAUNCH();
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, positions_in,
                                                    positions, static_cast<int>(count), 0, end_bit,
                                                    stream));
    const int w = static_cast<int>(width);
    constexpr int V = kPackElems<T>;
    if (width % V == 0 && aligned16(dout) && aligned16(dweight)) {
      launch_add_runs<T, V>(keys, positions, dout, dweight, count, w, vocab, stream);
    } else {
      launch_add_runs<T, 1>(keys, positions, dout, dweight, count, w, vocab, stream);
    }
  });
}

}  // namespace loom::kernels::cuda
