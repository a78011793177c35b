#pragma once
// cuBLASLt, loaded on first use.
//
// Note [cuBLASLt is loaded on first use]
// libcublasLt is half a gigabyte, and its static initialisers allocate and touch tens of
// megabytes: linked into a program, they cost every start of it about 0.15 s of CPU (0.18 s
// for `train_gpt --help` against 0.01 s unlinked, AMD EPYC, CUDA 13.0, 2026-12-02), whether
// or not the run ever uses a GPU. So no Loom library links it: the CUDA GEMM (gemm.cpp, its only
// user) calls it through the table below, which the first call of cublaslt() fills by dlopen of the
// library's soname, found the way the dynamic linker finds libcudart (the program's RUNPATH,
// LD_LIBRARY_PATH, the system's directories: the toolkit keeps both in one directory). A CPU run
// never loads it. The types and the signatures are the header's own (decltype of each function), so
// a mismatch with the header cannot compile.

#include <cublasLt.h>

namespace loom::kernels::cuda {

// The cuBLASLt functions Loom calls.
struct CublasLt {
  decltype(&::cublasLtGetVersion) get_version;
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) matmul_preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) matmul_preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) matrix_layout_set_attribute;
};

// The soname that cublaslt() loads: libcublasLt.so.<the major version of the headers Loom
// was built with>.
const char* cublaslt_soname();

// The process's one table. The first call loads the library and resolves every function
// (thread-safe; the library stays loaded until exit). Throws loom::Error naming the soname
// and the loader's reason when the library or one of its functions cannot be found.
const CublasLt& cublaslt();

}  // namespace loom::kernels::cuda
