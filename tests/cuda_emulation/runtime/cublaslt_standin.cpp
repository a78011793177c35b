// A reference stand-in for cuBLASLt, answering the calls kernels/cuda/gemm.cpp makes through
// the table of kernels/cuda/cublaslt_library.h, so that Loom's CUDA matmul runs on the
// emulated device (this file replaces cublaslt_library.cpp in the program that links it).
//
// It does what cuBLASLt documents for those calls: column-major D = alpha op(A) op(B) +
// beta C (+ a bias of D's row count with CUBLASLT_EPILOGUE_BIAS; with
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS, GELU (tanh form) of the biased f32 sum into D and the sum
// into the aux matrix; with CUBLASLT_EPILOGUE_DGELU, the f32 sum times GELU's derivative at
// the aux matrix's element; with CUBLASLT_EPILOGUE_BGRADA, op(A) summed over k into a vector
// of D's row count; the aux matrix's leading dimension a multiple of 8, as documented), strided
// batches, f32 accumulation and scale, operands and result in the layouts' types (f32, bf16, f16;
// 16-bit operands may give an f32 result), the result rounded once, to nearest even. Sums run over
// k in order, so results agree with cuBLASLt's to rounding, not bitwise. Each cublasLtMatmul is one
// launch in the WorkLog. An attribute or value it does not implement is
// CUBLAS_STATUS_NOT_SUPPORTED, so a new use of cuBLASLt in gemm.cpp (another epilogue) fails here
// until the stand-in has it.

#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "cublaslt_standin.h"
#include "kernels/cuda/cublaslt_library.h"
#include "stream_capture.h"
#include "work_log.h"

namespace loom::cuda_emulation {
namespace {
bool epilogues_refused = false;
}  // namespace

EpiloguesRefused::EpiloguesRefused() {
  epilogues_refused = true;
}

EpiloguesRefused::~EpiloguesRefused() {
  epilogues_refused = false;
}

}  // namespace loom::cuda_emulation

namespace loom::kernels::cuda {
namespace {

struct Handle {};

struct MatmulDesc {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // GELU_AUX_BIAS: the biased sum, in D's type; DGELU: GELU's input
  int64_t aux_ld = 0;
};

// GELU's tanh form, as kernels/cuda/elementwise.cu computes it in f32.
float gelu_tanh(float x) {
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

// Its derivative, as kernels/cuda/elementwise.cu's GeluBackwardFn computes it in f32.
float gelu_tanh_derivative(float x) {
  const float c = 0.7978845608028654f, k = 0.044715f;
  const float t = std::tanh(c * (x + k * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * k * x * x);
}

bool gelu_epilogue(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU;
}

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

// The aux matrix a GELU epilogue reads or writes fits D (one product, a leading dimension of at
// least D's rows and, as cuBLASLt documents, divisible by 8).
bool aux_fits(const MatmulDesc& desc, const Layout& d) {
  return d.batch == 1 && desc.aux_ld >= static_cast<int64_t>(d.rows) && desc.aux_ld % 8 == 0;
}

struct Preference {};

template <typename T>
cublasStatus_t read_value(const void* buffer, size_t bytes, T& value) {
  if (buffer == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&value, buffer, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool known_type(cudaDataType_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

size_t type_size(cudaDataType_t type) {
  return type == CUDA_R_32F ? 4 : 2;
}

float load(cudaDataType_t type, const void* base, int64_t index) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[index];
  const uint16_t bits = static_cast<const uint16_t*>(base)[index];
  return type == CUDA_R_16BF ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
}

void store(cudaDataType_t type, void* base, int64_t index, float value) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(base)[index] = value;
    return;
  }
  static_cast<uint16_t*>(base)[index] =
      type == CUDA_R_16BF ? float_to_bf16_bits(value) : float_to_f16_bits(value);
}

const void* offset(const void* base, const Layout& layout, int64_t batch) {
  return static_cast<const char*>(base) +
         batch * layout.stride * static_cast<int64_t>(type_size(layout.type));
}

// op(X)'s (i, j) in X's column-major layout.
int64_t element(const Layout& x, cublasOperation_t op, int64_t i, int64_t j) {
  return op == CUBLAS_OP_N ? i + j * x.ld : j + i * x.ld;
}

// The product's sizes, or false when the layouts do not make one.
bool sizes(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c, int64_t& m,
           int64_t& n, int64_t& k) {
  m = static_cast<int64_t>(c.rows);
  n = static_cast<int64_t>(c.cols);
  const uint64_t a_rows = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t a_cols = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t b_rows = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t b_cols = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  k = static_cast<int64_t>(a_cols);
  // The types of cuBLASLt's table for CUBLAS_COMPUTE_32F that Loom uses: A, B and C alike,
  // or 16-bit A and B with an f32 C.
  const bool types = a.type == b.type && (c.type == a.type || c.type == CUDA_R_32F);
  return a_rows == c.rows && b_cols == c.cols && b_rows == a_cols && types &&
         c.ld >= static_cast<int64_t>(c.rows) && (a.batch == c.batch || a.batch == 1) &&
         (b.batch == c.batch || b.batch == 1);
}

size_t standin_get_version() {
  return CUBLAS_VERSION;
}

cublasStatus_t standin_create(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = reinterpret_cast<cublasLtHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_destroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<Handle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_desc_create(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                   cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
      scale != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new MatmulDesc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_desc_destroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<MatmulDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_desc_set(cublasLtMatmulDesc_t raw, cublasLtMatmulDescAttributes_t attribute,
                                const void* buffer, size_t bytes) {
  MatmulDesc& d = *reinterpret_cast<MatmulDesc*>(raw);
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_value(buffer, bytes, d.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_value(buffer, bytes, d.trans_b);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_value(buffer, bytes, d.bias);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return read_value(buffer, bytes, d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return read_value(buffer, bytes, d.aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      cublasLtEpilogue_t epilogue{};
      if (cublasStatus_t s = read_value(buffer, bytes, epilogue); s != CUBLAS_STATUS_SUCCESS)
        return s;
      if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && epilogue != CUBLASLT_EPILOGUE_BIAS &&
          epilogue != CUBLASLT_EPILOGUE_BGRADA && !gelu_epilogue(epilogue))
        return CUBLAS_STATUS_NOT_SUPPORTED;
      d.epilogue = epilogue;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: {  // one bias for the whole batch only
      int64_t stride = -1;
      if (cublasStatus_t s = read_value(buffer, bytes, stride); s != CUBLAS_STATUS_SUCCESS)
        return s;
      return stride == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t standin_layout_create(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                     uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!known_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_layout_destroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<Layout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_layout_set(cublasLtMatrixLayout_t raw,
                                  cublasLtMatrixLayoutAttribute_t attribute, const void* buffer,
                                  size_t bytes) {
  Layout& layout = *reinterpret_cast<Layout*>(raw);
  switch (attribute) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return read_value(buffer, bytes, layout.batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return read_value(buffer, bytes, layout.stride);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t standin_preference_create(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_preference_destroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Preference*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

// Every preference (workspace size, alignments) is met by the one algorithm there is.
cublasStatus_t standin_preference_set(cublasLtMatmulPreference_t,
                                      cublasLtMatmulPreferenceAttributes_t, const void* buffer,
                                      size_t) {
  return buffer == nullptr ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_heuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                 cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                 cublasLtMatmulPreference_t, int requested,
                                 cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (returned == nullptr || results == nullptr || requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  int64_t m = 0, n = 0, k = 0;
  const MatmulDesc& matmul = *reinterpret_cast<MatmulDesc*>(desc);
  if (c != d ||
      !sizes(matmul, *reinterpret_cast<Layout*>(a), *reinterpret_cast<Layout*>(b),
             *reinterpret_cast<Layout*>(c), m, n, k) ||
      (cuda_emulation::epilogues_refused && matmul.epilogue != CUBLASLT_EPILOGUE_DEFAULT) ||
      (matmul.epilogue == CUBLASLT_EPILOGUE_BGRADA && reinterpret_cast<Layout*>(d)->batch > 1) ||
      (gelu_epilogue(matmul.epilogue) && !aux_fits(matmul, *reinterpret_cast<Layout*>(d)))) {
    *returned = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t standin_matmul(cublasLtHandle_t, cublasLtMatmulDesc_t raw_desc, const void* alpha,
                              const void* a_data, cublasLtMatrixLayout_t raw_a, const void* b_data,
                              cublasLtMatrixLayout_t raw_b, const void* beta, const void* c_data,
                              cublasLtMatrixLayout_t raw_c, void* d_data,
                              cublasLtMatrixLayout_t raw_d, const cublasLtMatmulAlgo_t*, void*,
                              size_t, cudaStream_t stream) {
  // Copies of the descriptors and scalars: a captured matmul runs after the call returns.
  const MatmulDesc desc = *reinterpret_cast<MatmulDesc*>(raw_desc);
  const Layout a = *reinterpret_cast<Layout*>(raw_a), b = *reinterpret_cast<Layout*>(raw_b);
  const Layout c = *reinterpret_cast<Layout*>(raw_c), d = *reinterpret_cast<Layout*>(raw_d);
  int64_t m = 0, n = 0, k = 0;
  if (!sizes(desc, a, b, d, m, n, k) || c.type != d.type || c.ld != d.ld || alpha == nullptr ||
      beta == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if ((desc.epilogue == CUBLASLT_EPILOGUE_BIAS || desc.epilogue == CUBLASLT_EPILOGUE_BGRADA ||
       desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) &&
      desc.bias == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (gelu_epilogue(desc.epilogue) && (desc.aux == nullptr || !aux_fits(desc, d)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (desc.epilogue == CUBLASLT_EPILOGUE_BGRADA && d.batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float scale_ab = *static_cast<const float*>(alpha);
  const float scale_c = *static_cast<const float*>(beta);
  auto run = [=] {
    for (int64_t batch = 0; batch < d.batch; ++batch) {
      const void* pa = offset(a_data, a, a.batch == 1 ? 0 : batch);
      const void* pb = offset(b_data, b, b.batch == 1 ? 0 : batch);
      const void* pc = offset(c_data, c, batch);
      void* pd = const_cast<void*>(offset(d_data, d, batch));
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          float sum = 0.0f;
          for (int64_t p = 0; p < k; ++p)
            sum += load(a.type, pa, element(a, desc.trans_a, i, p)) *
                   load(b.type, pb, element(b, desc.trans_b, p, j));
          float value = scale_ab * sum;
          if (scale_c != 0.0f) value += scale_c * load(c.type, pc, i + j * c.ld);
          if (desc.epilogue == CUBLASLT_EPILOGUE_BIAS) value += load(d.type, desc.bias, i);
          if (desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            value += load(d.type, desc.bias, i);
            store(d.type, desc.aux, i + j * desc.aux_ld, value);
            value = gelu_tanh(value);
          }
          if (desc.epilogue == CUBLASLT_EPILOGUE_DGELU)
            value *= gelu_tanh_derivative(load(d.type, desc.aux, i + j * desc.aux_ld));
          store(d.type, pd, i + j * d.ld, value);  // C may be D: its (i, j) is read first
        }
      }
    }
    if (desc.epilogue == CUBLASLT_EPILOGUE_BGRADA) {  // op(A)'s rows summed over k, in order
      for (int64_t i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (int64_t p = 0; p < k; ++p)
          sum += load(a.type, a_data, element(a, desc.trans_a, i, p));
        store(d.type, const_cast<void*>(desc.bias), i, sum);
      }
    }
  };
  const cudaError_t refused =
      cuda_emulation::submit(stream, cuda_emulation::WorkKind::kMatmul, "cublasLtMatmul", run,
                             {{a_data, true},
                              {b_data, true},
                              {c_data, true},
                              {d_data, false},
                              {desc.bias, desc.epilogue != CUBLASLT_EPILOGUE_BGRADA},
                              {desc.aux, desc.epilogue == CUBLASLT_EPILOGUE_DGELU}});
  return refused == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

const char* cublaslt_soname() {
  return "the emulation's cuBLASLt stand-in";
}

const CublasLt& cublaslt() {
  static const CublasLt table{standin_get_version,       standin_create,
                              standin_destroy,           standin_matmul,
                              standin_heuristic,         standin_desc_create,
                              standin_desc_destroy,      standin_desc_set,
                              standin_preference_create, standin_preference_destroy,
                              standin_preference_set,    standin_layout_create,
                              standin_layout_destroy,    standin_layout_set};
  return table;
}

}  // namespace loom::kernels::cuda
