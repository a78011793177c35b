#include "kernels/cuda/reduce.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/chunk_plan.cuh"
#include "kernels/cuda/common.cuh"

// Note [Deterministic reduction trees]
// Every reduction here has the same shape: each thread folds a strided subset of the reduced
// axis in index order, then the partial states meet in a fixed tree (a warp's xor butterfly,
// then a fixed pairing across warps or across the rows of a 2-D block). The subsets and the
// tree depend only on the sizes (the launch configuration is chosen from them, never from the
// device), so results are bitwise reproducible. The combining operations are commutative, so
// every lane of a butterfly ends with identical bits.
//
// Note [Argmax as an associative operation]
// The CPU loop `best = x[0]; for d >= 1: if (x[d] > best) take d` has to be recast as an
// associative, commutative combine to run as a tree. Each element becomes a state (value,
// index): a NaN at d = 0 stays {NaN, 0} and wins every combine (nothing is `>` NaN, so the CPU
// never replaces it); a NaN at d > 0 becomes the identity {-inf, none} (the CPU never takes
// it); otherwise the larger value wins and ties (including -0 == +0) go to the smaller index,
// the CPU's "first maximal". This is a total order on states, hence associative. The stored
// value is re-read from x at the winning index, so it is bitwise the CPU's (sign of zero and
// NaN payload included).

namespace loom::kernels::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;



// ---------------------------------------------------------------------------------------------
// Reduction operations: State, identity, make (from element value and axis index), combine,
// and a warp shuffle of the state.

template <typename A>
struct SumOp {
  using State = A;
  __device__ static State identity() { return A(0); }
  __device__ static State make(A v, int64_t) { return v; }
  __device__ static State combine(State a, State b) { return a + b; }
  __device__ static State shuffle_xor(State s, int offset) {
    return __shfl_xor_sync(kFullMask, s, offset);
  }
};

template <typename A>
struct ArgMaxState {
  A value;
  int64_t index;
};

// See Note [Argmax as an associative operation].
template <typename A>
struct ArgMaxOp {
  using State = ArgMaxState<A>;
  static constexpr int64_t kNone = INT64_MAX;
  __device__ static State identity() { return {-INFINITY, kNone}; }
  __device__ static State make(A v, int64_t d) {
    if (v != v && d != 0) return identity();
    return {v, d};
  }
  __device__ static State combine(State a, State b) {
    if (a.value != a.value) return a;
    if (b.value != b.value) return b;
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index <= b.index ? a : b;
  }
  __device__ static State shuffle_xor(State s, int offset) {
    State r;
    r.value = __shfl_xor_sync(kFullMask, s.value, offset);
    r.index = __shfl_xor_sync(kFullMask, static_cast<long long>(s.index), offset);
    return r;
  }
};

template <typename Op>
__device__ __forceinline__ typename Op::State warp_reduce(typename Op::State s) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    s = Op::combine(s, Op::shuffle_xor(s, offset));
  return s;
}

// Reduces over a 1-D block (blockDim.x a multiple of 32); every thread gets the result.
// `scratch` holds 32 states in shared memory; the call synchronises.
template <typename Op>
__device__ __forceinline__ typename Op::State block_reduce(typename Op::State s,
                                                           typename Op::State* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  s = warp_reduce<Op>(s);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  s = lane < warps ? scratch[lane] : Op::identity();
  return warp_reduce<Op>(s);
}

// Where a reduced state goes: sums are rounded to Out (the input's type, or f32 for a 16-bit
// input summed into f32); argmax re-reads the winning element.
template <typename Out>
struct SumStore {
  Out* out;
  template <typename A>
  __device__ void operator()(int64_t pos, A s, const void*, int64_t) const {
    out[pos] = narrow<Out>(s);
  }
};
template <typename T>
struct ArgMaxStore {
  T* out;
  int64_t* argmax;
  // `base` is x's element for d = 0 of this output, `step` the distance between d and d + 1.
  template <typename S>
  __device__ void operator()(int64_t pos, S s, const T* base, int64_t step) const {
    out[pos] = base[s.index * step];
    argmax[pos] = s.index;
  }
};

// ---------------------------------------------------------------------------------------------
// inner == 1: each row x[o, 0..extent) is reduced by a group of `group` threads: one warp
// (group 32, blockDim.x / 32 rows per block) for short rows, the whole block for long ones.

template <typename T, typename Op, typename Store>
__global__ void reduce_rows_kernel(const T* x, int64_t rows, int64_t extent, int group,
                                   Store store) {
  using State = typename Op::State;
  __shared__ State scratch[kWarpSize];
  const int rows_per_block = blockDim.x / group;
  const int lane = threadIdx.x % group;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / group;
  const int64_t step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  // In block mode every thread of the block runs the same iterations (the barriers inside
  // block_reduce need that); in warp mode only the warp's lanes share them.
  for (int64_t row = first; row < rows; row += step) {
    const T* src = x + row * extent;
    State s = Op::identity();
    for (int64_t d = lane; d < extent; d += group)
      s = Op::combine(s, Op::make(widen(src[d]), d));
    s = group == kWarpSize ? warp_reduce<Op>(s) : block_reduce<Op>(s, scratch);
    if (lane == 0) store(row, s, src, 1);
  }
}

// inner > 1: a 2-D block of 32 x Y threads covers 32 neighbouring columns i (coalesced loads)
// and splits the reduced axis d among its Y rows; the Y partial states per column then meet in
// a fixed pairwise tree in shared memory. Y is a power of two, at most kMaxColumnSplit.
constexpr int kMaxColumnSplit = 16;

// One column's share of a 32 x Y block: Op over base[d * inner] for d = first, first + step, ...
// below end, in that order (unrolled so that the loads are in flight together).
template <typename T, typename Op>
__device__ typename Op::State fold_column(const T* base, int64_t first, int64_t end, int step,
                                          int64_t inner) {
  typename Op::State s = Op::identity();
#pragma unroll 8
  for (int64_t d = first; d < end; d += step)
    s = Op::combine(s, Op::make(widen(base[d * inner]), d));
  return s;
}

// The Y states of each of the block's 32 columns meet in a fixed pairwise tree in `partial`;
// every thread calls it, and row ty == 0 gets its column's result.
template <typename Op>
__device__ typename Op::State column_tree(typename Op::State s,
                                          typename Op::State (*partial)[kWarpSize + 1]) {
  const int tx = threadIdx.x, ty = threadIdx.y, split = blockDim.y;
  __syncthreads();  // the previous iteration's tree may still read `partial`
  partial[ty][tx] = s;
  __syncthreads();
  for (int half = split / 2; half > 0; half /= 2) {
    if (ty < half) partial[ty][tx] = Op::combine(partial[ty][tx], partial[ty + half][tx]);
    __syncthreads();
  }
  return partial[0][tx];
}

template <typename T, typename Op, typename Store>
__global__ void reduce_columns_kernel(const T* x, int64_t outer, int64_t extent, int64_t inner,
                                      Store store) {
  using State = typename Op::State;
  __shared__ State partial[kMaxColumnSplit][kWarpSize + 1];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = x + o * extent * inner + i;
    const State s = i < inner ? fold_column<T, Op>(base, threadIdx.y, extent, blockDim.y, inner)
                              : Op::identity();
    const State total = column_tree<Op>(s, partial);
    if (threadIdx.y == 0 && i < inner) store(o * inner + i, total, base, inner);
  }
}

constexpr int64_t kMaxGridX = 65535LL * 8;
constexpr int64_t kMaxGridY = 65535;

// Long columns (the bias gradients of a linear layer: extent = batch x tokens, inner = width)
// leave the kernel above with only ceil(inner / 32) blocks, each thread folding extent / 16
// rows one dependent load at a time: 8.5% of the H200's bandwidth, 20% of a GPT-2 step (the
// GPU check of 2026-11-27). So from kLongColumn rows on, the reduced axis is cut into chunks
// of kChunkRows (at most kMaxChunks chunks; both from the sizes alone): pass 1 folds each
// chunk of 32 columns in a block of 32 x kMaxColumnSplit threads and its fixed tree into a
// partial state in the workspace, and pass 2 folds the chunks' partials of each column in
// chunk order.
constexpr int64_t kLongColumn = 1024;
constexpr int64_t kChunkRows = 256;
constexpr int64_t kMaxChunks = 256;
constexpr int kFinishColumnThreads = 256;

int64_t column_chunks(int64_t extent, int64_t inner) {
  if (inner <= 1 || extent < kLongColumn) return 0;  // the one-pass kernels
  return std::min(ceil_div(extent, kChunkRows), kMaxChunks);
}

// Each thread folds kCols neighbouring columns, each in fold_column's order (so the bits do not
// depend on kCols): 2 for 16-bit types, whose warp then reads 128 contiguous bytes of a row
// in one 4-byte load per thread, as f32's 32 columns do (one column each: 3% of the H200's
// bandwidth for bf16 before, 2026-12-04).
template <typename T, int kCols>
struct alignas(sizeof(T) * kCols) ColumnGroup {
  T v[kCols];
};

template <typename T, typename Op, int kCols>
__global__ void column_partials_kernel(const T* x, int64_t outer, int64_t extent, int64_t inner,
                                       int64_t chunk_rows, typename Op::State* partials) {
  using State = typename Op::State;
  __shared__ State partial[kMaxColumnSplit][kWarpSize + 1];
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x) * kCols;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t begin = chunk * chunk_rows;
  const int64_t end = begin + chunk_rows < extent ? begin + chunk_rows : extent;
  // Whole groups are read in one load where every row's group is aligned.
  const bool grouped = i + kCols <= inner && inner % kCols == 0 &&
                       reinterpret_cast<uintptr_t>(x) % sizeof(ColumnGroup<T, kCols>) == 0;
  for (int64_t o = blockIdx.z; o < outer; o += gridDim.z) {
    const T* base = x + o * extent * inner + i;
    State s[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      s[c] = Op::identity();
#pragma unroll 8
    for (int64_t d = begin + threadIdx.y; d < end; d += blockDim.y) {
      if (grouped) {
        const ColumnGroup<T, kCols> g =
            *reinterpret_cast<const ColumnGroup<T, kCols>*>(base + d * inner);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          s[c] = Op::combine(s[c], Op::make(widen(g.v[c]), d));
      } else {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (i + c < inner) s[c] = Op::combine(s[c], Op::make(widen(base[d * inner + c]), d));
      }
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const State total = column_tree<Op>(s[c], partial);
      if (threadIdx.y == 0 && i + c < inner)
        partials[(o * chunks + chunk) * inner + i + c] = total;
    }
  }
}

template <typename Op, typename Store>
__global__ void finish_columns_kernel(const typename Op::State* partials, int64_t outer,
                                      int64_t chunks, int64_t inner, Store store) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < outer * inner;
       k += stride) {
    const int64_t o = k / inner, i = k % inner;
    typename Op::State s = Op::identity();
    for (int64_t c = 0; c < chunks; ++c)
      s = Op::combine(s, partials[(o * chunks + c) * inner + i]);
    store(k, s, nullptr, inner);
  }
}

template <typename T, typename Op, typename Store>
void launch_chunked_columns(const T* x, int64_t outer, int64_t extent, int64_t inner,
                            int64_t chunks, Store store, void* workspace, cudaStream_t stream) {
  using State = typename Op::State;
  auto* partials = static_cast<State*>(workspace);
  const int64_t chunk_rows = ceil_div(extent, chunks);
  constexpr int kCols = sizeof(T) == 2 ? 2 : 1;
  const dim3 block(kWarpSize, kMaxColumnSplit);
  const dim3 grid(static_cast<unsigned>(ceil_div(inner, kWarpSize * kCols)),
                  static_cast<unsigned>(chunks), static_cast<unsigned>(std::min(outer, kMaxGridY)));
  column_partials_kernel<T, Op, kCols>
      <<<grid, block, 0, stream>>>(x, outer, extent, inner, chunk_rows, partials);
  LOOM_CUDA_CHECK_LAUNCH();
  const int64_t blocks = std::min(ceil_div(outer * inner, kFinishColumnThreads), kMaxGridX);
  finish_columns_kernel<Op, Store><<<static_cast<unsigned>(blocks), kFinishColumnThreads, 0,
                                     stream>>>(partials, outer, chunks, inner, store);
  LOOM_CUDA_CHECK_LAUNCH();
}

constexpr int kRowThreads = 256;
constexpr int kLongRowThreads = 512;
constexpr int64_t kLongRow = 2048;  // rows at least this long get a block each

template <typename T, typename Op, typename Store>
void launch_axis_reduce(const T* x, int64_t outer, int64_t extent, int64_t inner, Store store,
                        cudaStream_t stream) {
  if (outer == 0 || inner == 0) return;
  if (inner == 1) {
    const bool block_per_row = extent >= kLongRow;
    const int threads = block_per_row ? kLongRowThreads : kRowThreads;
    const int group = block_per_row ? threads : kWarpSize;
    const int64_t rows_per_block = threads / group;
    const int64_t blocks = std::min(ceil_div(outer, rows_per_block), kMaxGridX);
    reduce_rows_kernel<T, Op, Store>
        <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, outer, extent, group, store);
  } else {
    int split = 1;
    while (split < kMaxColumnSplit && split < extent)
      split *= 2;
    const dim3 block(kWarpSize, static_cast<unsigned>(split));
    const dim3 grid(static_cast<unsigned>(ceil_div(inner, kWarpSize)),
                    static_cast<unsigned>(std::min(outer, kMaxGridY)));
    reduce_columns_kernel<T, Op, Store><<<grid, block, 0, stream>>>(x, outer, extent, inner, store);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void check_sizes(const char* op, int64_t outer, int64_t extent, int64_t inner) {
  if (outer < 0 || extent < 0 || inner < 0) {
    fail(op, ": sizes must be non-negative, got outer ", outer, ", extent ", extent, ", inner ",
         inner);
  }
  if (ceil_div(inner, kWarpSize) > INT32_MAX) fail(op, ": inner size ", inner, " is too large");
}

// ---------------------------------------------------------------------------------------------
// Whole-buffer sums: pass 1 runs a number of blocks fixed by n (at most kMaxPartials), each
// folding a grid-strided share of x into one partial in the workspace; pass 2 (one block)
// reduces the partials in a fixed tree and writes the result. They accumulate in double, as the
// CPU's sum_all and sum_of_squares do: one double add per element is far below what any GPU's
// f64 units sustain at memory speed, and a loss or a gradient norm then agrees with the CPU to
// double rounding before the final cast.

constexpr int kSumThreads = 256;
constexpr int kFinishThreads = 1024;
constexpr int64_t kMaxPartials = kFinishThreads;  // pass 2 reads one partial per thread
constexpr int64_t kMinPerThread = 16;

int64_t partial_count(int64_t n) {
  if (n <= 0) return 0;
  return std::min(ceil_div(n, kSumThreads * kMinPerThread), kMaxPartials);
}

// 16-byte loads over the first `vectors` whole vectors (0 when x is unaligned), then single
// elements; each thread folds its elements in index order.
template <typename T, bool kSquare>
__global__ void partial_sums_kernel(const T* x, int64_t n, int64_t vectors, double* partials) {
  using Op = SumOp<double>;
  constexpr int kVec = Vec16<T>::kSize;
  __shared__ double scratch[kWarpSize];
  double s = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = tid; v < vectors; v += stride) {
    const Vec16<T> in = reinterpret_cast<const Vec16<T>*>(x)[v];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const double e = static_cast<double>(widen(in.v[j]));
      s += kSquare ? e * e : e;
    }
  }
  for (int64_t i = vectors * kVec + tid; i < n; i += stride) {
    const double e = static_cast<double>(widen(x[i]));
    s += kSquare ? e * e : e;
  }
  s = block_reduce<Op>(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

template <typename A, typename Out>
__global__ void finish_sum_kernel(const A* partials, int64_t count, Out* out) {
  __shared__ A scratch[kWarpSize];
  A s = threadIdx.x < count ? partials[threadIdx.x] : A(0);
  s = block_reduce<SumOp<A>>(s, scratch);
  if (threadIdx.x == 0) *out = narrow<Out>(s);
}

template <typename T, bool kSquare, typename Out>
void launch_sum(const void* x, int64_t n, Out* out, void* workspace, cudaStream_t stream) {
  if (n < 0) fail("sum: negative element count ", n);
  const int64_t blocks = partial_count(n);
  auto* partials = static_cast<double*>(workspace);
  if (blocks > 0) {
    if (workspace == nullptr) {
      fail("sum: a workspace of ", reduce_workspace_bytes(n), " bytes is needed for ", n,
           " elements, got nullptr");
    }
    const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int64_t vectors = aligned ? n / Vec16<T>::kSize : 0;
    partial_sums_kernel<T, kSquare><<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(
        static_cast<const T*>(x), n, vectors, partials);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  finish_sum_kernel<double, Out><<<1, kFinishThreads, 0, stream>>>(partials, blocks, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Sums of squares of many tensors (Note [Multi-tensor launches]).

constexpr int64_t kSquaresChunk = 65536;
constexpr int kSquaresThreads = 512;
constexpr int kMaxFinishTensors = 256;

struct SquaresTable {
  const void* x[kMaxChunkTensors];
  int64_t n[kMaxChunkTensors];
  ChunkPlan plan;
};
static_assert(sizeof(SquaresTable) + sizeof(void*) <= kMaxKernelParameterBytes);

// Where each tensor's chunk sums start in the workspace, and how many there are.
struct SquaresFinishTable {
  int64_t first[kMaxFinishTensors];
  int32_t chunks[kMaxFinishTensors];
};
static_assert(sizeof(SquaresFinishTable) + 2 * sizeof(void*) <= kMaxKernelParameterBytes);

// partials[b] = the sum of squares of block b's chunk, in double.
template <typename T>
__global__ void __launch_bounds__(kSquaresThreads)
    chunk_squares_kernel(const __grid_constant__ SquaresTable table, double* partials) {
  __shared__ double scratch[kWarpSize];
  const int t = table.plan.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.plan.block_chunk[blockIdx.x]) * kSquaresChunk;
  const int64_t len = table.n[t] - start < kSquaresChunk ? table.n[t] - start : kSquaresChunk;
  const T* x = static_cast<const T*>(table.x[t]) + start;
  // 16-byte loads, several in flight per thread (one at a time left the H200 at 15% of its
  // bandwidth), where the chunk is aligned: every chunk of an aligned tensor is, kSquaresChunk
  // being a multiple of every vector's length. Then single elements.
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? len / kVec : 0;
  double s = 0;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec16<T> in = reinterpret_cast<const Vec16<T>*>(x)[v];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const double e = static_cast<double>(widen(in.v[j]));
      s += e * e;
    }
  }
  for (int64_t i = vectors * kVec + threadIdx.x; i < len; i += blockDim.x) {
    const double e = static_cast<double>(widen(x[i]));
    s += e * e;
  }
  s = block_reduce<SumOp<double>>(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// squares[b] = tensor b's chunk sums added by one warp (lane-strided in order, then a fixed
// butterfly), rounded to Out (float, or double: not rounded).
template <typename Out>
__global__ void __launch_bounds__(kWarpSize)
    finish_squares_kernel(const __grid_constant__ SquaresFinishTable table,
                          const double* partials, Out* squares) {
  double s = 0;
  for (int c = threadIdx.x; c < table.chunks[blockIdx.x]; c += kWarpSize)
    s += partials[table.first[blockIdx.x] + c];
  s = warp_reduce<SumOp<double>>(s);
  if (threadIdx.x == 0) squares[blockIdx.x] = static_cast<Out>(s);
}

int64_t square_chunks(const TensorSpan* tensors, int count) {
  int64_t chunks = 0;
  for (int k = 0; k < count; ++k) {
    if (tensors[k].n < 0)
      fail("multi_tensor_sum_of_squares: tensor #", k, " has a negative size ", tensors[k].n);
    if (tensors[k].n > 0 && tensors[k].data == nullptr)
      fail("multi_tensor_sum_of_squares: tensor #", k, " (", tensors[k].n, " elements) is null");
    if (ceil_div(tensors[k].n, kSquaresChunk) > INT32_MAX)
      fail("multi_tensor_sum_of_squares: tensor #", k, " has too many elements (", tensors[k].n,
           ")");
    chunks += ceil_div(tensors[k].n, kSquaresChunk);
  }
  return chunks;
}

}  // namespace

size_t multi_tensor_squares_workspace_bytes(const TensorSpan* tensors, int count) {
  if (count > 0 && tensors == nullptr)
    fail("multi_tensor_sum_of_squares: tensors is null for ", count, " tensors");
  return static_cast<size_t>(square_chunks(tensors, count)) * sizeof(double);
}

namespace {

template <typename Out>
void sums_of_squares(DType dtype, const TensorSpan* tensors, int count, Out* squares,
                     void* workspace, cudaStream_t stream) {
  if (count < 0) fail("multi_tensor_sum_of_squares: negative tensor count ", count);
  if (count == 0) return;
  if (squares == nullptr) fail("multi_tensor_sum_of_squares: squares is null");
  if (multi_tensor_squares_workspace_bytes(tensors, count) > 0 && workspace == nullptr)
    fail("multi_tensor_sum_of_squares: a workspace of ",
         multi_tensor_squares_workspace_bytes(tensors, count), " bytes is needed, got nullptr");
  auto* partials = static_cast<double*>(workspace);
  dispatch_arithmetic(dtype, "multi_tensor_sum_of_squares", [&]<typename T>() {
    SquaresTable table;
    int64_t done = 0;  // chunks summed by earlier launches: where this launch's sums go
    for_each_chunk_plan(
        table, count, kSquaresChunk, [&](int k) { return tensors[k].n; },
        [&](int slot, int k) {
          table.x[slot] = tensors[k].data;
          table.n[slot] = tensors[k].n;
        },
        [&](int blocks) {
          chunk_squares_kernel<T>
              <<<blocks, kSquaresThreads, 0, stream>>>(table, partials + done);
          LOOM_CUDA_CHECK_LAUNCH();
          done += blocks;
        });
  });
  SquaresFinishTable finish;
  int64_t first = 0;
  for (int k0 = 0; k0 < count; k0 += kMaxFinishTensors) {
    const int m = std::min(count - k0, kMaxFinishTensors);
    for (int j = 0; j < m; ++j) {
      finish.first[j] = first;
      finish.chunks[j] = static_cast<int32_t>(ceil_div(tensors[k0 + j].n, kSquaresChunk));
      first += finish.chunks[j];
    }
    finish_squares_kernel<Out><<<m, kWarpSize, 0, stream>>>(finish, partials, squares + k0);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void multi_tensor_sum_of_squares(DType dtype, const TensorSpan* tensors, int count,
                                 float* squares, void* workspace, cudaStream_t stream) {
  sums_of_squares(dtype, tensors, count, squares, workspace, stream);
}

void multi_tensor_sum_of_squares(DType dtype, const TensorSpan* tensors, int count,
                                 double* squares, void* workspace, cudaStream_t stream) {
  sums_of_squares(dtype, tensors, count, squares, workspace, stream);
}

namespace {

// One thread, in order: the arithmetic of optim::grad_norm and clip_grads_to_norm on the host,
// each operation rounded as written (no contraction into fused multiply-adds).
__global__ void clip_coefficient_kernel(const float* squares, int count, double max_norm,
                                        double* total_norm, float* factor) {
  double total = 0.0;
  for (int k = 0; k < count; ++k) {
    const double norm = sqrt_rn(static_cast<double>(squares[k]));
    total = add_rn(total, mul_rn(norm, norm));
  }
  total = sqrt_rn(total);
  const double coefficient = div_rn(max_norm, add_rn(total, 1e-6));
  *total_norm = total;
  *factor = coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;  // NaN: 1 as well
}

}  // namespace

void clip_coefficient(const float* squares, int count, double max_norm, double* total_norm,
                      float* factor, cudaStream_t stream) {
  if (count < 0) fail("clip_coefficient: negative tensor count ", count);
  if (!(max_norm > 0.0)) fail("clip_coefficient: max_norm must be positive, got ", max_norm);
  clip_coefficient_kernel<<<1, 1, 0, stream>>>(squares, count, max_norm, total_norm, factor);
  LOOM_CUDA_CHECK_LAUNCH();
}

size_t sum_axis_workspace_bytes(DType dtype, int64_t outer, int64_t extent, int64_t inner) {
  check_sizes("sum_axis", outer, extent, inner);
  size_t state = 0;  // the partial sums' type, Acc<T>
  dispatch_arithmetic(dtype, "sum_axis", [&]<typename T>() { state = sizeof(Acc<T>); });
  return static_cast<size_t>(outer * column_chunks(extent, inner) * inner) * state;
}

void sum_axis(DType dtype, DType out_dtype, const void* x, void* out, int64_t outer, int64_t extent,
              int64_t inner, void* workspace, cudaStream_t stream) {
  check_sizes("sum_axis", outer, extent, inner);
  if (out_dtype != dtype && !(out_dtype == DType::F32 && is_16bit_float(dtype))) {
    fail("sum_axis: ", dtype_name(dtype), " is summed into ", dtype_name(dtype),
         is_16bit_float(dtype) ? " or f32" : "", ", got ", dtype_name(out_dtype));
  }
  const int64_t chunks = column_chunks(extent, inner);
  dispatch_arithmetic(dtype, "sum_axis", [&]<typename T>() {
    auto launch = [&](auto store) {
      if (chunks == 0 || outer == 0) {
        launch_axis_reduce<T, SumOp<Acc<T>>>(static_cast<const T*>(x), outer, extent, inner, store,
                                             stream);
        return;
      }
      if (workspace == nullptr) {
        fail("sum_axis: a workspace of ", sum_axis_workspace_bytes(dtype, outer, extent, inner),
             " bytes is needed for [", outer, ", ", extent, ", ", inner, "], got nullptr");
      }
      launch_chunked_columns<T, SumOp<Acc<T>>>(static_cast<const T*>(x), outer, extent, inner,
                                               chunks, store, workspace, stream);
    };
    if (out_dtype == dtype) {
      launch(SumStore<T>{static_cast<T*>(out)});
    } else if constexpr (sizeof(T) == 2) {  // a 16-bit dtype summed into f32
      launch(SumStore<float>{static_cast<float*>(out)});
    }
  });
}

void max_axis(DType dtype, const void* x, void* out, int64_t* argmax, int64_t outer, int64_t extent,
              int64_t inner, cudaStream_t stream) {
  check_sizes("max_axis", outer, extent, inner);
  if (extent <= 0 && outer > 0 && inner > 0)
    fail("max_axis: the reduced extent must be positive, got ", extent);
  dispatch_arithmetic(dtype, "max_axis", [&]<typename T>() {
    launch_axis_reduce<T, ArgMaxOp<Acc<T>>>(static_cast<const T*>(x), outer, extent, inner,
                                            ArgMaxStore<T>{static_cast<T*>(out), argmax}, stream);
  });
}

size_t reduce_workspace_bytes(int64_t n) {
  return static_cast<size_t>(partial_count(n)) * sizeof(double);
}

void sum_all(DType dtype, const void* x, int64_t n, void* out, void* workspace,
             cudaStream_t stream) {
  dispatch_arithmetic(dtype, "sum_all", [&]<typename T>() {
    launch_sum<T, false>(x, n, static_cast<T*>(out), workspace, stream);
  });
}

void sum_of_squares(DType dtype, const void* x, int64_t n, float* out, void* workspace,
                    cudaStream_t stream) {
  dispatch_arithmetic(dtype, "sum_of_squares",
                  [&]<typename T>() { launch_sum<T, true>(x, n, out, workspace, stream); });
}

}  // namespace loom::kernels::cuda
