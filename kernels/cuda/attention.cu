// Fused causal attention kernels (FlashAttention-2 style); contracts in attention.h.
//
// Note [Attention versions]
// All three versions share one plan. Forward: a block owns a tile of query rows of one (b, h) and
// walks the key tiles left to right, keeping each row's running max m and denominator l
// (online softmax), rescaling its output accumulator by exp(m_old - m_new) when the max
// grows; key tiles wholly above the diagonal are never visited, so the block of query tile i
// visits i + 1 key tiles, and blocks start with the longest tiles. Scores live in base 2
// (scale * log2(e) folded in), so exp2f does the exponentials; logsumexp is stored in natural
// log. Backward is atomic-free: D_i = rowsum(dout * out) goes to the workspace, then one kernel
// owns a key tile of a key/value head and loops over the query tiles at or below the diagonal
// of each query head of its group, head by head, accumulating dK and dV (so grouped-query
// attention sums its group's gradients in f32, in one order, and plain multi-head attention
// is a group of one), and another owns a query tile and loops over key tiles of its query
// head's key/value head, accumulating dQ; both recompute
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
//   v3: bf16 tiles, mma.sync m16n8k16 with PTX's documented register layouts (warp_mma.cuh),
//       FlashAttention-2's way: 64-row tiles, 4 warps; at head dims up to 64 a block owns 128
//       rows (queries, or keys for dK/dV) and a warp two 16-row tiles that share every B
//       operand (half the shared-memory reads per MMA), at head dim 128 64 rows and one tile
//       a warp. Scores stay in the accumulators; the softmax runs on them where they are (a
//       row is spread over the 4 lanes of a quad, whose max and sum take two shuffles), and
//       the probabilities, rounded to bf16, become the next product's A operand without
//       leaving registers (an m16n8k16 accumulator pair is an A fragment). Operands come
//       from shared memory through ldmatrix (transposed for the products whose B is a tile's
//       columns). The tiles a block walks are double-buffered: the next one's cp.async copies are
//       issued before the current one is computed, so loads overlap the products. Backward computes
//       dK/dV's scores transposed (S^T = K Q^T), so that P^T and dS^T are A operands too; its query
//       tiles are walked 32 queries at a time for head dims above 32, to keep the scores and
//       both accumulators in registers, and dQ walks its key tiles 32 keys at a time with two
//       row tiles a warp, for the same reason. Nothing goes through a scratch tile.
// v1 and v2 read rows in 16-byte chunks when head_dim fills the padded head dim and rows are
// aligned (GPT-2's fused projection), v2 with cp.async straight into shared memory; otherwise
// element by element; v3 issues the same 16-byte cp.async pieces (zero-filled past T) or
// element loads. Rows and dims past the ends are zero-filled either way.
// The kernels live in attention_simt.cuh (v1), attention_tensor_core.cuh (v2) and
// attention_mma.cuh (v3), their shared pieces in attention_common.cuh; this file holds the
// launchers.

#include "core/tags.h"
#include "core/tunables.h"
#include "kernels/cuda/attention.h"

#include <atomic>
#include <initializer_list>
#include <string_view>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_simt.cuh"
#include "kernels/cuda/attention_tensor_core.cuh"

namespace loom::kernels::cuda {

using namespace attention_detail;

namespace {

// ---- Launchers -----------------------------------------------------------------------------

template <typename T>
Operand<T> operand(T* ptr, const int64_t* strides) {
  return {ptr, strides[0], strides[1], strides[2]};
}

// Lets `kernel` take `smem` bytes of dynamic shared memory, opting in past the 48 KiB default
// (the attribute is per function and device, so it is set before every launch). Each launch
// names its kernel where it is made, so that the emulated device's work log and its tests
// tell the versions apart.
template <typename Args>
void allow_shared_memory(void (*kernel)(Args), size_t smem) {
  if (smem > 48 * 1024) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
}

// Calls f.template operator()<T>() with the storage type (f32 or bf16).
template <typename F>
void dispatch_storage(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::BF16: f.template operator()<bf16>(); return;
    default:
      tag::kKernelsCuda.fail(op, ": the CUDA attention kernels take f32 or bf16, got dtype #",
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
    tag::kKernelsCuda.fail(op, ": version v", static_cast<int>(version), " does not take dtype #",
                           static_cast<int>(dtype), " (v1: f32, bf16; v2, v3: bf16)");
  }
  if (s.batch < 0 || s.heads < 0 || s.time < 0 || s.head_dim < 0) {
    tag::kKernelsCuda.fail(op, ": negative size in shape [B=", s.batch, ", H=", s.heads,
                           ", T=", s.time, ", D=", s.head_dim, "]");
  }
  if (s.heads > 0 && (s.kv_heads < 1 || s.heads % s.kv_heads != 0)) {
    tag::kKernelsCuda.fail(op, ": expected key/value heads dividing the ", s.heads,
                           " query heads (heads for multi-head attention, 1 for multi-query), got ",
                           s.kv_heads);
  }
  if (s.batch == 0 || s.heads == 0 || s.time == 0) return false;
  if (s.head_dim < 1 || s.head_dim > kMaxHeadDim) {
    tag::kKernelsCuda.fail(op, ": head_dim must be in [1, ", kMaxHeadDim, "], got ", s.head_dim);
  }
  if (s.batch * s.heads > INT32_MAX || s.time > int64_t(kMaxGridY) * kSimtTile) {
    tag::kKernelsCuda.fail(
        op, ": expected batch * heads <= 2^31 - 1 and time <= ", int64_t(kMaxGridY) * kSimtTile,
        ", got batch * heads = ", s.batch * s.heads, ", time = ", s.time);
  }
  for (const void* p : pointers)
    if (p == nullptr) tag::kKernelsCuda.fail(op, ": null operand pointer or strides");
  return true;
}

// Whether the current device runs real v2 and v3 kernels: they are compiled as traps for
// virtual architectures below sm_80 (LOOM_ATTENTION_TC, LOOM_WARP_MMA_PTX), e.g. in a build
// for sm_75 that a newer GPU JIT-compiles. Asked once per device.
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

// The version LOOM_CUDA_ATTENTION names for bf16 operands, kDefaultBf16Version when it is
// unset. Read at each call, as cheap beside a launch, so that a test may set it.
AttentionVersion chosen_bf16_version() {
  const char* named = tunable_value(tunables::kCudaAttention);
  if (named == nullptr) return kDefaultBf16Version;
  const std::string_view name(named);
  if (name == "v1") return AttentionVersion::kSimt;
  if (name == "v2") return AttentionVersion::kTensorCore;
  if (name == "v3") return AttentionVersion::kMma;
  tag::kKernelsCuda.fail(tunables::kCudaAttention.name, "='", name,
                         "': expected v1, v2 or v3 (or leave it unset for v3)");
}

// v1 for f32; for bf16 the chosen version, or v1 where the device cannot run v2 and v3.
AttentionVersion public_version(DType dtype) {
  const AttentionVersion chosen = chosen_bf16_version();
  if (dtype == DType::BF16 && chosen != AttentionVersion::kSimt && tensor_core_kernels_run_here()) {
    return chosen;
  }
  return AttentionVersion::kSimt;
}

// One block per tile of `tile` rows of each of `heads` heads of each batch element.
dim3 grid_for_tiles(const AttentionShape& s, int64_t heads, int tile) {
  return dim3(static_cast<unsigned>(s.batch * heads),
              static_cast<unsigned>(ceil_div(s.time, tile)));
}
}  // namespace

bool attention_version_supports(AttentionVersion version, DType dtype) {
  switch (version) {
    case AttentionVersion::kSimt: return dtype == DType::F32 || dtype == DType::BF16;
    case AttentionVersion::kTensorCore:
    case AttentionVersion::kMma: return dtype == DType::BF16;
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
                              static_cast<int>(s.heads / s.kv_heads),
                              scale_log2};
    dispatch_head_dim(s.head_dim, [&]<int kD>() {
      if constexpr (std::is_same_v<T, bf16>) {
        if (version == AttentionVersion::kMma) {
          allow_shared_memory(attention_forward_mma<kD>, mma_forward_smem<kD>());
          attention_forward_mma<kD><<<grid_for_tiles(s, s.heads, mma_block_rows<kD>()), kMmaThreads,
                                      mma_forward_smem<kD>(), stream>>>(args);
          LOOM_CUDA_CHECK_LAUNCH();
          return;
        }
        if (version == AttentionVersion::kTensorCore) {
          allow_shared_memory(attention_forward_tc<kD>, tc_forward_smem<kD>());
          attention_forward_tc<kD>
              <<<grid_for_tiles(s, s.heads, kTcTile), kTcThreads, tc_forward_smem<kD>(), stream>>>(
                  args);
          LOOM_CUDA_CHECK_LAUNCH();
          return;
        }
      }
      allow_shared_memory(attention_forward_simt<T, kD>, simt_forward_smem<kD>());
      attention_forward_simt<T, kD><<<grid_for_tiles(s, s.heads, kSimtTile), kSimtThreads,
                                      simt_forward_smem<kD>(), stream>>>(args);
      LOOM_CUDA_CHECK_LAUNCH();
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
                               static_cast<int>(s.heads / s.kv_heads),
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
        if (version == AttentionVersion::kMma) {
          allow_shared_memory(attention_backward_dkdv_mma<kD>, mma_dkdv_smem<kD>());
          attention_backward_dkdv_mma<kD><<<grid_for_tiles(s, s.kv_heads, mma_block_rows<kD>()),
                                            kMmaThreads, mma_dkdv_smem<kD>(), stream>>>(args);
          LOOM_CUDA_CHECK_LAUNCH();
          allow_shared_memory(attention_backward_dq_mma<kD>, mma_dq_smem<kD>());
          attention_backward_dq_mma<kD><<<grid_for_tiles(s, s.heads, mma_block_rows<kD>()),
                                          kMmaThreads, mma_dq_smem<kD>(), stream>>>(args);
          LOOM_CUDA_CHECK_LAUNCH();
          return;
        }
        if (version == AttentionVersion::kTensorCore) {
          allow_shared_memory(attention_backward_dkdv_tc<kD>, tc_dkdv_smem<kD>());
          attention_backward_dkdv_tc<kD>
              <<<grid_for_tiles(s, s.kv_heads, kTcTile), kTcThreads, tc_dkdv_smem<kD>(), stream>>>(
                  args);
          LOOM_CUDA_CHECK_LAUNCH();
          allow_shared_memory(attention_backward_dq_tc<kD>, tc_dq_smem<kD>());
          attention_backward_dq_tc<kD>
              <<<grid_for_tiles(s, s.heads, kTcTile), kTcThreads, tc_dq_smem<kD>(), stream>>>(args);
          LOOM_CUDA_CHECK_LAUNCH();
          return;
        }
      }
      allow_shared_memory(attention_backward_dkdv_simt<T, kD>, simt_dkdv_smem<kD>());
      attention_backward_dkdv_simt<T, kD><<<grid_for_tiles(s, s.kv_heads, kSimtTile), kSimtThreads,
                                            simt_dkdv_smem<kD>(), stream>>>(args);
      LOOM_CUDA_CHECK_LAUNCH();
      allow_shared_memory(attention_backward_dq_simt<T, kD>, simt_dq_smem<kD>());
      attention_backward_dq_simt<T, kD>
          <<<grid_for_tiles(s, s.heads, kSimtTile), kSimtThreads, simt_dq_smem<kD>(), stream>>>(
              args);
      LOOM_CUDA_CHECK_LAUNCH();
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
