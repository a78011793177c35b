// cuBLASLt, loaded on first use (Note [cuBLASLt is loaded on first use] in the header).

#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <type_traits>

#include "core/error.h"
#include "core/tags.h"

namespace loom::kernels::cuda {

namespace {

#define LOOM_CUBLASLT_STRINGIFY_(x) #x
#define LOOM_CUBLASLT_STRINGIFY(x) LOOM_CUBLASLT_STRINGIFY_(x)
constexpr const char* kSoname = "libcublasLt.so." LOOM_CUBLASLT_STRINGIFY(CUBLAS_VER_MAJOR);
#undef LOOM_CUBLASLT_STRINGIFY
#undef LOOM_CUBLASLT_STRINGIFY_

template <typename Function>
void resolve(void* library, const char* name, Function& function) {
  dlerror();
  function = reinterpret_cast<Function>(dlsym(library, name));
  if (function == nullptr) {
    const char* reason = dlerror();
    tag::kKernelsCuda.fail(
        kSoname, " has no function ", name, " (", reason != nullptr ? reason : "null symbol",
        "): it is not the cuBLASLt of the CUDA ", CUBLAS_VER_MAJOR, " headers Loom was built with");
  }
}

CublasLt load() {
  // Never closed: the handles and plans made from it live until exit.
  void* library = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    tag::kKernelsCuda.fail("cannot load ", kSoname, " for the CUDA matmul (",
                           reason != nullptr ? reason : "no reason given", "); install the CUDA ",
                           CUBLAS_VER_MAJOR,
                           " toolkit's cuBLAS, or add the directory that holds it (the one of "
                           "libcudart) to LD_LIBRARY_PATH");
  }
  CublasLt table{};
  resolve(library, "cublasLtGetVersion", table.get_version);
  resolve(library, "cublasLtCreate", table.create);
  resolve(library, "cublasLtDestroy", table.destroy);
  resolve(library, "cublasLtMatmul", table.matmul);
  resolve(library, "cublasLtMatmulAlgoGetHeuristic", table.matmul_algo_get_heuristic);
  resolve(library, "cublasLtMatmulDescCreate", table.matmul_desc_create);
  resolve(library, "cublasLtMatmulDescDestroy", table.matmul_desc_destroy);
  resolve(library, "cublasLtMatmulDescSetAttribute", table.matmul_desc_set_attribute);
  resolve(library, "cublasLtMatmulPreferenceCreate", table.matmul_preference_create);
  resolve(library, "cublasLtMatmulPreferenceDestroy", table.matmul_preference_destroy);
  resolve(library, "cublasLtMatmulPreferenceSetAttribute", table.matmul_preference_set_attribute);
  resolve(library, "cublasLtMatrixLayoutCreate", table.matrix_layout_create);
  resolve(library, "cublasLtMatrixLayoutDestroy", table.matrix_layout_destroy);
  resolve(library, "cublasLtMatrixLayoutSetAttribute", table.matrix_layout_set_attribute);
  return table;
}

}  // namespace

const char* cublaslt_soname() {
  return kSoname;
}

// Trivially destructible, so that destructors of other statics (gemm.cpp's handles and plans)
// may still call through it at exit.
static_assert(std::is_trivially_destructible_v<CublasLt>);

const CublasLt& cublaslt() {
  // A failed load throws out of the initialiser, so the next call tries again.
  static const CublasLt table = load();
  return table;
}

}  // namespace loom::kernels::cuda
