#include "kernels/cpu/gemm.h"

#include <dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <Eigen/Core>
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tags.h"
#include "core/tunables.h"
#include "kernels/cpu/thread_pool.h"

// The OpenMP runtime libdnnl runs on, GNU's libgomp (linked by name: CMakeLists.txt), whose
// function is declared here rather than through <omp.h>, which a clang build would take from
// LLVM's OpenMP.
extern "C" void omp_set_num_threads(int threads);

namespace loom::kernels::cpu {

namespace {

template <typename T>
using RowMajorMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
               Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using MutableRowMajorMap =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
               Eigen::OuterStride<>>;

template <typename T, typename A, typename B>
void multiply(const A& a, const B& b, MutableRowMajorMap<T>& c, bool accumulate) {
  if (accumulate) {
    c.noalias() += a * b;
  } else {
    c.noalias() = a * b;
  }
}

// oneDNN runs its GEMM on OpenMP threads, as many as the calling thread's OpenMP setting
// says (by default every core). Loom keeps each call on one thread: the first call on a
// thread sets that thread's OpenMP team to one (omp_set_num_threads, above).
void keep_onednn_on_this_thread() {
  static thread_local const bool one_thread = (omp_set_num_threads(1), true);
  (void)one_thread;
}

void sgemm_on_this_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                          int64_t ldc, bool accumulate) {
  keep_onednn_on_this_thread();
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f,
                                          a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
  if (status != dnnl_success) {
    tag::kKernelsCpu.fail("oneDNN sgemm failed (status ", static_cast<int>(status), ") for ", m,
                          " x ", n, " x ", k, ", lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
  }
}

// Note [GEMM blocks]
// A product of at least kBlockedWork multiply-adds is computed as blocks of rows of C (or
// columns, when C is wider than tall), one call each, their size a function of the shape alone
// (128 to 512), whatever the thread count; the threads share out the blocks. Each element of
// C is then always computed by the same call on the same operands, so the bits do not depend
// on the number of threads. Blocks of 128 cost up to a third of a large product's time on
// GPT-2 small's shapes (every call packs the other operand again; 2026-12-04, an AVX-512
// Xeon), hence larger ones where the product is large enough to keep four.
// `run(m, n, a, b, c)` multiplies one block on the calling thread.
constexpr int64_t kBlockedWork = int64_t{1} << 21;

template <typename E, typename C, typename Run>
void for_each_block(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const E* a,
                    int64_t lda, const E* b, int64_t ldb, C* c, int64_t ldc, const Run& run) {
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  // Every call packs the other operand again, so blocks are as large as leaves four of them
  // (work for the threads to share): 128, 256 or 512. A function of the shape alone.
  int64_t block = 128;
  while (block < 512 && extent >= 8 * block)
    block *= 2;
  const int64_t blocks = m * n * k >= kBlockedWork ? (extent + block - 1) / block : 1;
  if (blocks == 1) {
    run(m, n, a, b, c);
    return;
  }
  parallel_for(blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t begin = index * block, size = std::min(block, extent - begin);
      if (by_rows) {  // rows begin.. of op(A) and of C
        run(size, n, trans_a ? a + begin : a + begin * lda, b, c + begin * ldc);
      } else {  // columns begin.. of op(B) and of C
        run(m, size, a, trans_b ? b + begin * ldb : b + begin, c + begin);
      }
    }
  });
}

// An empty sum (oneDNN refuses k = 0): zeros (all bits clear in f32 and bf16 alike), or C
// unchanged when accumulating.
template <typename C>
void empty_product(int64_t m, int64_t n, C* c, int64_t ldc, bool accumulate) {
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i)
      std::fill(c + i * ldc, c + i * ldc + n, C(0));
}

// Note [Rows 512 floats apart]
// On an AVX2 host (2026-12-04), oneDNN's sgemm ran at 39-65 GFLOP/s instead of 85-95 on
// products whose operands' rows lie a multiple of 512 floats (2 KB) apart, as model widths of
// 512, 1024 or 2048 lay them out: a 512-wide GPT's weight gradient X^T dY at 39-61, its MLP's
// x W with a [2048, 512] weight at 63 (one thread; bench/gemm_backends/padded_rows.cpp). With
// those rows 16 floats further apart the same products ran at 89-95: rows that share cache
// sets are what slows it. So an operand of a large product whose rows are a multiple of 512
// floats apart is first copied into rows kRowPad floats longer, when the copy is small
// against the product (the other side of C at least kPadFromExtent: K x N copied for M x N x
// K multiply-adds). The choice depends on the shape and layout alone, so the bits still do
// not depend on the thread count. The copies go to this thread's two buffers, reused, which
// grow to the largest operand padded (12.6 MB for GPT-2 small's [1024, 3072] gradients).
constexpr int64_t kSlowRowStride = 512;
constexpr int64_t kRowPad = 16;
constexpr int64_t kPadFromExtent = 64;

// Rows `rows` x `cols` of x (leading dimension ld) copied into `buffer` with a leading
// dimension that is not a multiple of kSlowRowStride; returns that dimension.
int64_t copy_padded(const float* x, int64_t rows, int64_t cols, int64_t ld,
                    std::vector<float>& buffer) {
  int64_t padded = (cols + kRowPad - 1) / kRowPad * kRowPad;
  if (padded % kSlowRowStride == 0) padded += kRowPad;
  buffer.resize(static_cast<size_t>(rows * padded));
  float* out = buffer.data();
  parallel_rows(rows, cols, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      std::copy(x + r * ld, x + r * ld + cols, out + r * padded);
  });
  return padded;
}

// Whether an operand of a product of `work` multiply-adds, read with leading dimension ld,
// is copied (Note [Rows 512 floats apart]); `extent` is the other side of C.
bool pads(int64_t ld, int64_t extent, int64_t work) {
  return ld % kSlowRowStride == 0 && extent >= kPadFromExtent && work >= kBlockedWork;
}

// oneDNN's bf16 matmul primitives (bf16 in, bf16 or f32 out, f32 sums), made once per shape
// and thread (making one takes about a millisecond). The operands' strides are part of the
// shape: a transposed operand is the stored matrix read with swapped strides. Accumulating is
// the sum post-op: C's old value joins the f32 sum before the one rounding.
class Bf16Matmuls {
 public:
  template <typename C>
  void run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
           int64_t lda, const uint16_t* b, int64_t ldb, C* c, int64_t ldc, bool accumulate) {
    const Key key{trans_a, trans_b, accumulate, std::is_same_v<C, float>, m, n, k, lda, ldb, ldc};
    auto it = primitives_.find(key);
    if (it == primitives_.end()) {
      if (primitives_.size() >= kMaxPrimitives) primitives_.clear();
      it = primitives_.emplace(key, make(key)).first;
    }
    const dnnl::matmul::primitive_desc& pd = it->second.pd;
    dnnl::memory am(pd.src_desc(), engine_, const_cast<uint16_t*>(a));
    dnnl::memory bm(pd.weights_desc(), engine_, const_cast<uint16_t*>(b));
    dnnl::memory cm(pd.dst_desc(), engine_, c);
    it->second.primitive.execute(stream_,
                                 {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream_.wait();
  }

 private:
  struct Key {
    bool trans_a, trans_b, accumulate, f32_out;
    int64_t m, n, k, lda, ldb, ldc;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
  };
  static constexpr size_t kMaxPrimitives = 512;

  Entry make(const Key& key) const {
    using dnnl::memory;
    const memory::desc a({key.m, key.k}, memory::data_type::bf16,
                         key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
    const memory::desc b({key.k, key.n}, memory::data_type::bf16,
                         key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
    const memory::desc c({key.m, key.n},
                         key.f32_out ? memory::data_type::f32 : memory::data_type::bf16,
                         memory::dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    if (key.accumulate) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attr.set_post_ops(sum);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return {pd, dnnl::matmul(pd)};
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<Key, Entry> primitives_;
};

// op(X) of stored bf16 rows (rows x cols, leading dimension ld) widened into packed f32.
std::vector<float> widened(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      out[static_cast<size_t>(r * cols + j)] = bf16_bits_to_float(x[r * ld + j]);
  return out;
}

}  // namespace

template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, accumulate);
  static thread_local std::vector<float> padded_a, padded_b;
  const int64_t work = m * n * k;
  if (pads(lda, n, work)) {
    lda = trans_a ? copy_padded(a, k, m, lda, padded_a) : copy_padded(a, m, k, lda, padded_a);
    a = padded_a.data();
  }
  if (pads(ldb, m, work)) {
    ldb = trans_b ? copy_padded(b, n, k, ldb, padded_b) : copy_padded(b, k, n, ldb, padded_b);
    b = padded_b.data();
  }
  for_each_block(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                 [&](int64_t bm, int64_t bn, const float* ba, const float* bb, float* bc) {
                   sgemm_on_this_thread(trans_a, trans_b, bm, bn, k, ba, lda, bb, ldb, bc, ldc,
                                        accumulate);
                 });
}

bool bf16_gemm_is_native() {
  static const bool native = [] {
    if (const char* forced = tunable_value(tunables::kBf16Gemm); forced != nullptr) {
      if (std::string_view(forced) == "f32") return false;
      tag::kKernelsCpu.fail(tunables::kBf16Gemm.name, "='", forced,
                            "': expected f32 (or leave it unset)");
    }
    const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  }();
  return native;
}

const char* bf16_gemm_instructions() {
  if (!bf16_gemm_is_native()) return "none: computed in f32";
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx ? "AMX"
                                                                                : "AVX512_BF16";
}

namespace {

// gemm_bf16 into bf16 (C = uint16_t) or f32 (C = float).
template <typename C>
void bf16_product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                  int64_t lda, const uint16_t* b, int64_t ldb, C* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) return empty_product(m, n, c, ldc, accumulate);
  if (!bf16_gemm_is_native()) {
    const std::vector<float> wa = trans_a ? widened(a, k, m, lda) : widened(a, m, k, lda);
    const std::vector<float> wb = trans_b ? widened(b, n, k, ldb) : widened(b, k, n, ldb);
    if constexpr (std::is_same_v<C, float>) {
      gemm<float>(trans_a, trans_b, m, n, k, wa.data(), trans_a ? m : k, wb.data(), trans_b ? k : n,
                  c, ldc, accumulate);
    } else {
      std::vector<float> sums =
          accumulate ? widened(c, m, n, ldc) : std::vector<float>(static_cast<size_t>(m * n));
      gemm<float>(trans_a, trans_b, m, n, k, wa.data(), trans_a ? m : k, wb.data(), trans_b ? k : n,
                  sums.data(), n, accumulate);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          c[i * ldc + j] = float_to_bf16_bits(sums[static_cast<size_t>(i * n + j)]);
    }
    return;
  }
  for_each_block(
      trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
      [&](int64_t bm, int64_t bn, const uint16_t* ba, const uint16_t* bb, C* bc) {
        keep_onednn_on_this_thread();
        static thread_local Bf16Matmuls matmuls;
        try {
          matmuls.run(trans_a, trans_b, bm, bn, k, ba, lda, bb, ldb, bc, ldc, accumulate);
        } catch (const dnnl::error& e) {
          tag::kKernelsCpu.fail("oneDNN's bf16 matmul failed (", e.what(), ") for ", bm, " x ",
                                bn, " x ", k, ", lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
        }
      });
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c, int64_t ldc,
               bool accumulate) {
  bf16_product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  bf16_product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc,
                  bool accumulate) {
  using T = double;
  MutableRowMajorMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (!accumulate) cm.setZero();
    return;
  }
  // A transposed operand is the row-major map of the stored matrix, transposed for free.
  RowMajorMap<T> am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  RowMajorMap<T> bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) multiply<T>(am, bm, cm, accumulate);
  if (!trans_a && trans_b) multiply<T>(am, bm.transpose(), cm, accumulate);
  if (trans_a && !trans_b) multiply<T>(am.transpose(), bm, cm, accumulate);
  if (trans_a && trans_b) multiply<T>(am.transpose(), bm.transpose(), cm, accumulate);
}

}  // namespace loom::kernels::cpu
