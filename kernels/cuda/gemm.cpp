// Row-major GEMM through cuBLASLt (contract in gemm.h).
//
// cuBLASLt is column-major. A row-major [r, c] matrix with leading dimension ld is, byte for
// byte, the column-major [c, r] matrix with the same ld, i.e. its transpose. So the row-major
// product C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: cuBLASLt's
// "A" operand is our B, its "B" operand is our A, and its result is [n, m]. The bias
// epilogue adds a vector of length "rows of D" = n, broadcast over D's columns = our rows,
// which is exactly bias[j] added to every row of the row-major result.
//
// Note [GEMM resources]
// - One cuBLASLt handle per device, created on first use under the registry lock.
// - One 32 MiB workspace per (device, stream): a GEMM's kernels use the workspace
//   asynchronously, so two streams sharing one could corrupt each other's split-K partials.
//   cudaStreamPerThread names a different stream in every thread, so that handle is keyed by
//   thread as well. Workspaces live until process exit. Caveat: a stream destroyed while
//   GEMMs are still queued on it, whose handle is then reused by a new stream, would share
//   the workspace with that queued work; synchronise streams before destroying them (Loom's
//   own streams live for the whole process).
// - A plan cache: matmul descriptor, layouts and the heuristic's algorithm, keyed by
//   everything the heuristic sees (device, dtype, transposes, sizes, leading dimensions,
//   batch strides, bias, TF32, and the pointer alignments, which the heuristic also assumes:
//   by default it expects 256-byte aligned buffers, which views with offsets are not).
//   Plans are never evicted (a training run has a few dozen shapes); they are built once
//   and then only read, except the bias pointer, which lives in the descriptor and is
//   therefore set and used under the plan's own mutex.
// - When cuBLASLt offers no algorithm with the bias epilogue, or k == 0 (never handed to
//   cuBLASLt: C = (accumulate ? C : 0) + bias needs no product), the bias is added by a
//   second, rank-1 GEMM: C += ones[m, 1] bias[1, n], with a per-device vector of ones. Column
//   sums of op(B) that the BGRADA epilogue cannot give are likewise ones[1, k] op(B). That
//   keeps this file free of hand-written kernels.
// All of this is freed at process exit; if the CUDA runtime is already unloading by then,
// the failures are expected and stay silent (the driver reclaims everything).

#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublaslt_library.h"
#include "kernels/cuda/elementwise.h"

namespace loom::kernels::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kOnesRows = 65536;  // rows per rank-1 bias GEMM

std::atomic<bool> g_allow_tf32{false};

// --- dtype helpers ---------------------------------------------------------------------------

int dtype_slot(DType dtype) {
  return dtype == DType::F32 ? 0 : dtype == DType::BF16 ? 1 : 2;
}

cudaDataType_t cuda_type(DType dtype) {
  return dtype == DType::F32 ? CUDA_R_32F : dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// --- RAII for cuBLASLt objects and device memory --------------------------------------------

void warn_cublas(cublasStatus_t status, const char* what) noexcept {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%swarning: %s failed during cleanup: %s\n", tag::kLoom.prefix().c_str(),
                 what, cuda_detail::cublas_status_name(status));
  }
}

// Destroy: the CublasLt member that destroys a Handle.
template <typename Handle, auto Destroy>
struct LtDeleter {
  void operator()(Handle handle) const noexcept {
    warn_cublas((cublaslt().*Destroy)(handle), "cuBLASLt destroy");
  }
};

template <typename Handle, auto Destroy>
using LtPtr = std::unique_ptr<std::remove_pointer_t<Handle>, LtDeleter<Handle, Destroy>>;

using HandlePtr = LtPtr<cublasLtHandle_t, &CublasLt::destroy>;
using MatmulDescPtr = LtPtr<cublasLtMatmulDesc_t, &CublasLt::matmul_desc_destroy>;
using LayoutPtr = LtPtr<cublasLtMatrixLayout_t, &CublasLt::matrix_layout_destroy>;
using PreferencePtr = LtPtr<cublasLtMatmulPreference_t, &CublasLt::matmul_preference_destroy>;

class DeviceMemory {
 public:
  // Created once and kept, so also during a graph capture (capture_mode.h).
  explicit DeviceMemory(size_t bytes) {
    RelaxedCaptureMode relaxed;
    LOOM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    cudaError_t status = cudaFree(ptr_);
    if (status != cudaSuccess && status != cudaErrorCudartUnloading)
      cuda_detail::warn_cuda_error(status, "cudaFree(gemm resource)", __FILE__, __LINE__);
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// --- one problem, plan keys and plans --------------------------------------------------------

struct Problem {
  DType dtype, out_dtype;  // A and B; C and the bias
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c, batch;
  bool accumulate;
  const void* bias;
  void* b_sums;  // op(B)'s column sums (BGRADA), or null
  void* gelu_aux = nullptr;  // gemm_bias_gelu: C = gelu(product + bias), this = product + bias
  const void* dgelu_aux = nullptr;  // gemm_dgelu: C = gelu'(this) * product
};

// The largest power of two (at most 256) dividing the address of every matrix of the batch.
uint32_t alignment_of(const void* ptr, int64_t stride, DType dtype, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr);
  if (batch > 1) bits |= static_cast<uint64_t>(stride) * dtype_size(dtype);
  uint32_t align = 256;
  while (align > 1 && bits % align != 0)
    align /= 2;
  return align;
}

struct PlanKey {
  int device;
  DType dtype, out_dtype;
  bool trans_a, trans_b, accumulate, bias, b_sums, gelu, dgelu, tf32;
  int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const noexcept {
    uint64_t h = 0xCBF29CE484222325ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 29); };
    mix(static_cast<uint64_t>(key.device));
    mix(static_cast<uint64_t>(key.dtype) | static_cast<uint64_t>(key.out_dtype) << 8);
    mix((key.trans_a ? 1u : 0u) | (key.trans_b ? 2u : 0u) | (key.accumulate ? 4u : 0u) |
        (key.bias ? 8u : 0u) | (key.tf32 ? 16u : 0u) | (key.b_sums ? 32u : 0u) |
        (key.gelu ? 64u : 0u) | (key.dgelu ? 128u : 0u));
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc, key.stride_a, key.stride_b,
                      key.stride_c, key.batch})
      mix(static_cast<uint64_t>(v));
    mix((uint64_t{key.align_a} << 48) | (uint64_t{key.align_b} << 32) |
        (uint64_t{key.align_c} << 16) | key.align_bias);
    mix(key.align_aux);
    return static_cast<size_t>(h);
  }
};

PlanKey make_key(int device, const Problem& p) {
  bool batched = p.batch > 1;  // strides of a single product are irrelevant: normalise them
  PlanKey key{};
  key.device = device;
  key.dtype = p.dtype;
  key.out_dtype = p.out_dtype;
  key.trans_a = p.trans_a;
  key.trans_b = p.trans_b;
  key.accumulate = p.accumulate;
  key.bias = p.bias != nullptr;
  key.b_sums = p.b_sums != nullptr;
  key.gelu = p.gelu_aux != nullptr;
  key.dgelu = p.dgelu_aux != nullptr;
  key.tf32 = p.dtype == DType::F32 && g_allow_tf32.load(std::memory_order_relaxed);
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.lda = p.lda;
  key.ldb = p.ldb;
  key.ldc = p.ldc;
  key.stride_a = batched ? p.stride_a : 0;
  key.stride_b = batched ? p.stride_b : 0;
  key.stride_c = batched ? p.stride_c : 0;
  key.batch = p.batch;
  key.align_a = alignment_of(p.a, key.stride_a, p.dtype, p.batch);
  key.align_b = alignment_of(p.b, key.stride_b, p.dtype, p.batch);
  key.align_c = alignment_of(p.c, key.stride_c, p.out_dtype, p.batch);
  const void* vector = p.bias ? p.bias : p.b_sums;  // the epilogue's vector
  key.align_bias = vector ? alignment_of(vector, 0, p.out_dtype, 1) : 0;
  const void* aux = p.gelu_aux ? p.gelu_aux : p.dgelu_aux;
  key.align_aux = aux ? alignment_of(aux, 0, p.out_dtype, 1) : 0;
  return key;
}

struct Plan {
  MatmulDescPtr desc;
  LayoutPtr layout_a, layout_b, layout_c;  // cuBLASLt's A (our B), its B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  // What the epilogue does: DEFAULT (nothing), BIAS, BGRADA (op(B)'s column sums),
  // GELU_AUX_BIAS or DGELU; a bias, sums, GELU or GELU's gradient it does not take are done by
  // other launches.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::mutex mutex;  // held while the epilogue's pointers are set in desc and the matmul enqueued
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  LOOM_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(desc, attribute, &value, sizeof value));
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value) {
  LOOM_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, attribute, &value, sizeof value));
}

LayoutPtr make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                      int64_t stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  LOOM_CUBLAS_CHECK(cublaslt().matrix_layout_create(
      &raw, cuda_type(dtype), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  LayoutPtr layout(raw);
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    LOOM_CUBLAS_CHECK(cublaslt().matrix_layout_set_attribute(
        raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LOOM_CUBLAS_CHECK(cublaslt().matrix_layout_set_attribute(
        raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return layout;
}

// Asks the heuristic for the best algorithm for plan's current descriptor; false when
// cuBLASLt has none for it.
bool find_algorithm(cublasLtHandle_t handle, const PlanKey& key, Plan& plan) {
  cublasLtMatmulPreference_t raw = nullptr;
  LOOM_CUBLAS_CHECK(cublaslt().matmul_preference_create(&raw));
  PreferencePtr pref(raw);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
  // cuBLASLt's A is our B and vice versa.
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  cublasStatus_t status = cublaslt().matmul_algo_get_heuristic(
      handle, plan.desc.get(), plan.layout_a.get(), plan.layout_b.get(), plan.layout_c.get(),
      plan.layout_c.get(), raw, 1, &result, &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  LOOM_CUBLAS_CHECK(status);
  if (count < 1 || result.state != CUBLAS_STATUS_SUCCESS) return false;
  plan.algo = result.algo;
  return true;
}

// Sets `epilogue` in plan's descriptor (its pointers already set) and asks for an algorithm
// with it: true, and plan->epilogue set, when there is one; else the descriptor's epilogue is
// DEFAULT again, and another launch will do what it would have.
bool try_epilogue(cublasLtHandle_t handle, const PlanKey& key, Plan& plan,
                  cublasLtEpilogue_t epilogue) {
  set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (find_algorithm(handle, key, plan)) {
    plan.epilogue = epilogue;
    return true;
  }
  set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  return false;
}

// `vector`: the bias, or where key.b_sums the column sums' output; `aux` GELU's input where
// key.gelu (written) or key.dgelu (read).
std::unique_ptr<Plan> build_plan(cublasLtHandle_t handle, const PlanKey& key, const void* vector,
                                 const void* aux) {
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  LOOM_CUBLAS_CHECK(cublaslt().matmul_desc_create(
      &desc, key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->desc.reset(desc);
  // C^T = op(B)^T op(A)^T (see the top of this file): a stored row-major operand already is
  // the transpose of itself in column-major terms, so each operand's flag carries over.
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  // Our B is stored row-major as [k, n] (or [n, k] when transposed): column-major [n, k] / [k, n].
  plan->layout_a = make_layout(key.dtype, key.trans_b ? key.k : key.n, key.trans_b ? key.n : key.k,
                               key.ldb, key.batch, key.stride_b);
  plan->layout_b = make_layout(key.dtype, key.trans_a ? key.m : key.k, key.trans_a ? key.k : key.m,
                               key.lda, key.batch, key.stride_a);
  plan->layout_c = make_layout(key.out_dtype, key.n, key.m, key.ldc, key.batch, key.stride_c);
  // The heuristic reads the pointers' alignments, so they are set before asking.
  if (key.gelu || key.dgelu) {
    // GELU_AUX_BIAS: GELU of the biased sum into D, the biased sum into aux; DGELU: the f32
    // product times GELU's derivative at aux, rounded once into D. aux in D's dtype and layout
    // (the default of CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE).
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.ldc);
    if (key.gelu) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
    if (try_epilogue(handle, key, *plan,
                     key.gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_DGELU))
      return plan;
    // else the biased product into aux and a GELU kernel after it, or the product into C and
    // GELU's backward kernel scaling it there
  }
  if (key.bias) {
    // Bias of length n = rows of the column-major D, one vector for the whole batch, in the
    // output dtype (the default of CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); else a rank-1 GEMM.
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
    if (key.batch > 1) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t{0});
    if (try_epilogue(handle, key, *plan, CUBLASLT_EPILOGUE_BIAS)) return plan;
  }
  if (key.b_sums) {
    // op(B) is cuBLASLt's A: BGRADA sums it over k into a vector of D's row count, n, in D's
    // dtype (the default of CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); else ones[1, k] op(B).
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
    if (try_epilogue(handle, key, *plan, CUBLASLT_EPILOGUE_BGRADA)) return plan;
  }
  if (!find_algorithm(handle, key, *plan)) {
    tag::kKernelsCudaGemm.fail("cuBLASLt has no algorithm for a ", dtype_name(key.dtype),
                               key.tf32 ? " (TF32)" : "", key.out_dtype != key.dtype ? " to " : "",
                               key.out_dtype != key.dtype ? dtype_name(key.out_dtype) : "",
                               " GEMM with op(A) ", key.trans_a ? "transposed" : "plain",
                               ", op(B) ", key.trans_b ? "transposed" : "plain", ", m=", key.m,
                               " n=", key.n, " k=", key.k, " lda=", key.lda, " ldb=", key.ldb,
                               " ldc=", key.ldc, " batch=", key.batch, " (strides ", key.stride_a,
                               "/", key.stride_b, "/", key.stride_c, ", pointer alignments ",
                               key.align_a, "/", key.align_b, "/", key.align_c, " bytes)");
  }
  return plan;
}

// --- per-device state and the registry -----------------------------------------------------

struct DeviceState {
  HandlePtr handle;
  std::mutex mutex;  // guards workspaces and ones
  std::map<std::pair<uintptr_t, std::thread::id>, std::unique_ptr<DeviceMemory>> workspaces;
  std::unique_ptr<DeviceMemory> ones[3];  // kOnesRows ones per float dtype, made on demand
};

class Registry {
 public:
  // The state of `device` (the current device), creating its handle on first use.
  DeviceState& device(int device) {
    std::lock_guard lock(mutex_);
    if (static_cast<size_t>(device) >= devices_.size()) devices_.resize(device + 1);
    std::unique_ptr<DeviceState>& state = devices_[device];
    if (!state) {
      auto fresh = std::make_unique<DeviceState>();
      cublasLtHandle_t raw = nullptr;
      LOOM_CUBLAS_CHECK(cublaslt().create(&raw));
      fresh->handle.reset(raw);
      state = std::move(fresh);
    }
    return *state;
  }

  // The cached plan for key, built (heuristic included) on first use. Plans are never
  // removed, so the reference stays valid.
  Plan& plan(cublasLtHandle_t handle, const PlanKey& key, const void* vector, const void* aux) {
    std::lock_guard lock(mutex_);
    std::unique_ptr<Plan>& slot = plans_[key];
    if (!slot) {
      try {
        slot = build_plan(handle, key, vector, aux);
      } catch (...) {
        plans_.erase(key);
        throw;
      }
    }
    return *slot;
  }

 private:
  std::mutex mutex_;
  // Declared before plans_ so that plans (descriptors only) go first at exit.
  std::vector<std::unique_ptr<DeviceState>> devices_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

void* workspace(DeviceState& state, cudaStream_t stream) {
  std::thread::id owner =
      stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  std::lock_guard lock(state.mutex);
  std::unique_ptr<DeviceMemory>& slot =
      state.workspaces[{reinterpret_cast<uintptr_t>(stream), owner}];
  if (!slot) slot = std::make_unique<DeviceMemory>(kWorkspaceBytes);
  return slot->get();
}

// kOnesRows ones in dtype on the current device. Made once per device and dtype with a
// blocking copy (one-time setup, like the handle).
const void* ones(DeviceState& state, DType dtype) {
  std::lock_guard lock(state.mutex);
  std::unique_ptr<DeviceMemory>& slot = state.ones[dtype_slot(dtype)];
  if (!slot) {
    size_t es = dtype_size(dtype);
    std::vector<unsigned char> host(kOnesRows * es);
    for (int64_t i = 0; i < kOnesRows; ++i) {
      if (dtype == DType::F32) {
        float one = 1.0f;
        std::memcpy(host.data() + i * es, &one, es);
      } else {
        uint16_t one = dtype == DType::BF16 ? 0x3F80 : 0x3C00;  // 1.0 in bf16 / f16
        std::memcpy(host.data() + i * es, &one, es);
      }
    }
    auto memory = std::make_unique<DeviceMemory>(host.size());
    RelaxedCaptureMode relaxed;  // a blocking copy, also when the first use is captured
    LOOM_CUDA_CHECK(cudaMemcpy(memory->get(), host.data(), host.size(), cudaMemcpyHostToDevice));
    slot = std::move(memory);
  }
  return slot->get();
}

// --- execution -----------------------------------------------------------------------------

void matmul(int device, const Problem& p, cudaStream_t stream);

// C_b (+)= ones[m, 1] bias[1, n] for every b: the bias as a rank-1 GEMM, in chunks of rows,
// in C's dtype (the bias's).
void add_bias_rank1(int device, const Problem& p, bool accumulate, cudaStream_t stream) {
  const void* one = ones(registry().device(device), p.out_dtype);
  size_t es = dtype_size(p.out_dtype);
  for (int64_t row = 0; row < p.m; row += kOnesRows) {
    Problem q{};
    q.dtype = p.out_dtype;
    q.out_dtype = p.out_dtype;
    q.m = std::min(kOnesRows, p.m - row);
    q.n = p.n;
    q.k = 1;
    q.a = one;
    q.lda = 1;
    q.b = p.bias;
    q.ldb = p.n;
    q.c = static_cast<unsigned char*>(p.c) + static_cast<size_t>(row * p.ldc) * es;
    q.ldc = p.ldc;
    q.stride_c = p.stride_c;
    q.batch = p.batch;  // A and B strides 0: the same ones and bias for every product
    q.accumulate = accumulate;
    matmul(device, q, stream);
  }
}

// sums[j] = sum_p op(B)[p, j] (batch 1): ones[1, k] op(B), in chunks of kOnesRows rows of
// op(B), each chunk's sums added to the ones before (f32 accumulation within a chunk).
void column_sums_rank1(int device, const Problem& p, cudaStream_t stream) {
  const void* one = ones(registry().device(device), p.dtype);
  const size_t es = dtype_size(p.dtype);
  for (int64_t row = 0; row < p.k; row += kOnesRows) {
    Problem q{};
    q.dtype = p.dtype;
    q.out_dtype = p.out_dtype;
    q.m = 1;
    q.n = p.n;
    q.k = std::min(kOnesRows, p.k - row);
    q.a = one;
    q.lda = q.k;
    // Row `row` of op(B): a row of B, or a column of the stored B^T.
    q.b = static_cast<const unsigned char*>(p.b) +
          static_cast<size_t>(p.trans_b ? row : row * p.ldb) * es;
    q.ldb = p.ldb;
    q.trans_b = p.trans_b;
    q.c = p.b_sums;
    q.ldc = p.n;
    q.batch = 1;
    q.accumulate = row > 0;
    matmul(device, q, stream);
  }
}

// One validated cuBLASLt call for k > 0 (m, n, batch > 0), plus the bias, the column sums,
// GELU or GELU's gradient if the epilogue could not take them. Without the GELU epilogue, a
// gemm_bias_gelu product goes to aux (biased) and GELU reads it from there into C; without
// DGELU, a gemm_dgelu product goes to C and GELU's backward scales it in place.
void matmul(int device, const Problem& p, cudaStream_t stream) {
  DeviceState& state = registry().device(device);
  PlanKey key = make_key(device, p);
  const void* vector = p.bias ? p.bias : p.b_sums;
  const void* aux = p.gelu_aux ? p.gelu_aux : p.dgelu_aux;
  Plan& plan = registry().plan(state.handle.get(), key, vector, aux);
  void* space = workspace(state, stream);
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  const bool gelu_apart = p.gelu_aux && plan.epilogue != CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu_apart = p.dgelu_aux && plan.epilogue != CUBLASLT_EPILOGUE_DGELU;
  Problem written = p;  // where the product goes
  if (gelu_apart) written.c = p.gelu_aux;
  {
    std::lock_guard lock(plan.mutex);
    if (vector != nullptr && plan.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, vector);
    if (plan.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
        plan.epilogue == CUBLASLT_EPILOGUE_DGELU)
      set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    LOOM_CUBLAS_CHECK(cublaslt().matmul(state.handle.get(), plan.desc.get(), &alpha, p.b,
                                        plan.layout_a.get(), p.a, plan.layout_b.get(), &beta,
                                        written.c, plan.layout_c.get(), written.c,
                                        plan.layout_c.get(), &plan.algo, space, kWorkspaceBytes,
                                        stream));
  }
  if (p.bias && plan.epilogue == CUBLASLT_EPILOGUE_DEFAULT)
    add_bias_rank1(device, written, /*accumulate=*/true, stream);
  if (p.b_sums && plan.epilogue == CUBLASLT_EPILOGUE_DEFAULT) column_sums_rank1(device, p, stream);
  if (gelu_apart) gelu_forward(p.out_dtype, p.gelu_aux, p.c, p.m * p.n, stream);
  if (dgelu_apart) gelu_backward(p.out_dtype, p.dgelu_aux, p.c, p.c, p.m * p.n, stream);
}

// C_b = 0 for every b (k == 0 without accumulate or bias).
void zero_output(const Problem& p, cudaStream_t stream) {
  size_t es = dtype_size(p.out_dtype);
  size_t pitch = static_cast<size_t>(p.ldc) * es, width = static_cast<size_t>(p.n) * es;
  if (p.batch == 1 || p.stride_c == p.m * p.ldc) {  // one pitched block
    LOOM_CUDA_CHECK(
        cudaMemset2DAsync(p.c, pitch, 0, width, static_cast<size_t>(p.m * p.batch), stream));
    return;
  }
  for (int64_t i = 0; i < p.batch; ++i) {
    void* c = static_cast<unsigned char*>(p.c) + static_cast<size_t>(i * p.stride_c) * es;
    LOOM_CUDA_CHECK(cudaMemset2DAsync(c, pitch, 0, width, static_cast<size_t>(p.m), stream));
  }
}

void validate(const Problem& p) {
  if (p.dtype != DType::F32 && p.dtype != DType::BF16 && p.dtype != DType::F16) {
    tag::kKernelsCudaGemm.fail("gemm takes f32, bf16 or f16 operands, got ", dtype_name(p.dtype));
  }
  if (p.out_dtype != p.dtype && !(p.out_dtype == DType::F32 && is_16bit_float(p.dtype))) {
    tag::kKernelsCudaGemm.fail("gemm writes ", dtype_name(p.dtype), " operands' product in ",
                               dtype_name(p.dtype), is_16bit_float(p.dtype) ? " or f32" : "",
                               ", got ", dtype_name(p.out_dtype));
  }
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) {
    tag::kKernelsCudaGemm.fail("sizes must be >= 0, got m=", p.m, " n=", p.n, " k=", p.k,
                               " batch=", p.batch);
  }
  if (p.batch > std::numeric_limits<int32_t>::max()) {
    tag::kKernelsCudaGemm.fail("batch must fit in int32 (cuBLASLt's batch count), got ", p.batch);
  }
  if (p.gelu_aux != nullptr &&
      (p.batch != 1 || p.accumulate || p.bias == nullptr || p.b_sums != nullptr || p.ldc != p.n ||
       p.out_dtype != p.dtype)) {
    tag::kKernelsCudaGemm.fail("gemm_bias_gelu is one product with a bias into a contiguous "
                               "result of the operands' dtype, got batch=", p.batch,
                               p.accumulate ? ", accumulate" : "", p.bias ? "" : ", no bias",
                               " ldc=", p.ldc, " n=", p.n);
  }
  if (p.dgelu_aux != nullptr && (p.batch != 1 || p.accumulate || p.bias != nullptr ||
                                 p.b_sums != nullptr || p.ldc != p.n || p.out_dtype != p.dtype)) {
    tag::kKernelsCudaGemm.fail(
        "gemm_dgelu is one product without a bias into a contiguous "
        "result of the operands' dtype, got batch=",
        p.batch, p.accumulate ? ", accumulate" : "", p.bias ? ", a bias" : "", " ldc=", p.ldc,
        " n=", p.n);
  }
  if (p.b_sums != nullptr && (p.batch != 1 || p.accumulate || p.bias != nullptr)) {
    tag::kKernelsCudaGemm.fail("column sums of op(B) are for a single product without accumulate "
                               "or bias, got batch=", p.batch, p.accumulate ? ", accumulate" : "",
                               p.bias ? ", a bias" : "");
  }
  if (p.stride_a < 0 || p.stride_b < 0 || p.stride_c < 0) {
    tag::kKernelsCudaGemm.fail("batch strides must be >= 0, got ", p.stride_a, "/", p.stride_b, "/",
                               p.stride_c);
  }
}

void validate_layout(const Problem& p) {
  int64_t a_row = p.trans_a ? p.m : p.k, b_row = p.trans_b ? p.k : p.n;
  if (p.lda < std::max<int64_t>(a_row, 1) || p.ldb < std::max<int64_t>(b_row, 1) ||
      p.ldc < std::max<int64_t>(p.n, 1)) {
    tag::kKernelsCudaGemm.fail(
        "leading dimensions too small: need lda >= ", std::max<int64_t>(a_row, 1),
        ", ldb >= ", std::max<int64_t>(b_row, 1), ", ldc >= ", std::max<int64_t>(p.n, 1),
        " for m=", p.m, " n=", p.n, " k=", p.k, (p.trans_a ? " op(A)=A^T" : ""),
        (p.trans_b ? " op(B)=B^T" : ""), "; got lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc);
  }
  if (p.batch > 1 && p.stride_c < (p.m - 1) * p.ldc + p.n) {
    tag::kKernelsCudaGemm.fail("the ", p.batch,
                               " results would overlap: stride_c must be >= (m-1)*ldc + n = ",
                               (p.m - 1) * p.ldc + p.n, ", got ", p.stride_c);
  }
  if (p.c == nullptr || (p.k > 0 && (p.a == nullptr || p.b == nullptr))) {
    tag::kKernelsCudaGemm.fail("null operand pointer (a ", p.a, ", b ", p.b, ", c ", p.c,
                               ") for m=", p.m, " n=", p.n, " k=", p.k);
  }
}

}  // namespace

void gemm(DType dtype, DType out_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
          int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch, bool accumulate,
          const void* bias, void* b_column_sums, cudaStream_t stream) {
  const Problem p{dtype, out_dtype, trans_a,  trans_b,    m,    n,            k,
                  a,     lda,       stride_a, b,          ldb,  stride_b,     c,
                  ldc,   stride_c,  batch,    accumulate, bias, b_column_sums};
  validate(p);
  if (n == 0 || batch == 0) return;
  if (m == 0 && b_column_sums == nullptr) return;
  validate_layout(p);
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  if (k == 0 && b_column_sums != nullptr) {  // empty columns
    const size_t bytes = static_cast<size_t>(n) * dtype_size(out_dtype);
    LOOM_CUDA_CHECK(cudaMemsetAsync(b_column_sums, 0, bytes, stream));
  }
  if (m == 0) {  // no product, only the column sums
    if (k > 0) column_sums_rank1(device, p, stream);
  } else if (k > 0) {
    matmul(device, p, stream);
  } else if (bias != nullptr) {
    add_bias_rank1(device, p, accumulate, stream);  // C = (accumulate ? C : 0) + bias
  } else if (!accumulate) {
    zero_output(p, stream);
  }
}

namespace {

// One product into a contiguous C of the operands' dtype (gemm_bias_gelu's, gemm_dgelu's).
Problem single_product(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       const void* a, int64_t lda, const void* b, int64_t ldb, const void* bias,
                       void* c) {
  return Problem{dtype, dtype, trans_a, trans_b, m, n, k, a,     lda,  0,
                 b,     ldb,   0,       c,       n, 0, 1, false, bias, nullptr};
}

// Validates p, whose GELU epilogue reads or writes `aux`, and multiplies when k > 0. Returns
// the device where the caller has C to fill without a product (k == 0, C not empty), else -1.
int run_with_gelu_epilogue(const Problem& p, const void* aux, const char* name,
                           cudaStream_t stream) {
  if (aux == nullptr) tag::kKernelsCudaGemm.fail(name, ": null aux (GELU's input)");
  validate(p);
  if (p.m == 0 || p.n == 0) return -1;
  validate_layout(p);
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  if (p.k == 0) return device;
  matmul(device, p, stream);
  return -1;
}

}  // namespace

void gemm_bias_gelu(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* b, int64_t ldb, const void* bias,
                    void* c, void* aux, cudaStream_t stream) {
  Problem p = single_product(dtype, trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c);
  p.gelu_aux = aux;
  const int device = run_with_gelu_epilogue(p, aux, "gemm_bias_gelu", stream);
  if (device < 0) return;
  Problem rows = p;  // aux = the bias in every row, then GELU
  rows.c = aux;
  rows.gelu_aux = nullptr;
  add_bias_rank1(device, rows, /*accumulate=*/false, stream);
  gelu_forward(dtype, aux, c, m * n, stream);
}

void gemm_dgelu(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const void* a, int64_t lda, const void* b, int64_t ldb, void* c, const void* aux,
                cudaStream_t stream) {
  Problem p = single_product(dtype, trans_a, trans_b, m, n, k, a, lda, b, ldb, nullptr, c);
  p.dgelu_aux = aux;
  if (run_with_gelu_epilogue(p, aux, "gemm_dgelu", stream) >= 0)
    zero_output(p, stream);  // an empty product: its gradient, scaled, is 0
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow, std::memory_order_relaxed);
}

bool allow_tf32() {
  return g_allow_tf32.load(std::memory_order_relaxed);
}

}  // namespace loom::kernels::cuda
