#pragma once
// nvcuda::wmma for emulated kernels: the 16x16x16 shapes with bf16 or f16 inputs and float
// accumulators that Loom's tensor-core attention uses.
//
// On a GPU a fragment is spread over the 32 lanes of a warp in an unspecified layout; here
// every lane holds the whole matrix, which gives the same results through the API, since a
// kernel may only reach a fragment's elements through load/store/fill (Loom's never index
// x[]). Every operation is warp-collective: all 32 lanes of the warp must reach it together,
// as the _sync suffix requires, with the same pointer, ldm and layout (or fill value) in
// every lane, and pointers must be 32-byte aligned with ldm a multiple of 16 bytes, as CUDA
// requires. So every lane's fragments are equal, and mma_sync computes the product once per
// warp (in the first lane to go on) and hands it to the others.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "loom_emulation/device.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <typename Use, int M, int N, int K>
struct Extent;
template <int M, int N, int K>
struct Extent<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Extent<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Extent<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

// The arguments every lane must pass alike.
struct Operands {
  const void* p;
  unsigned ldm;
  int layout;
};
template <typename T>
void collective(const char* operation, const T* p, unsigned ldm, int layout) {
  const Operands operands{p, ldm, layout};
  ::loom::cuda_emulation::warp_collective(operation, &operands, sizeof(operands));
}

template <typename T>
void check_operands(const char* operation, const T* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    throw ::loom::cuda_emulation::EmulationError(
        std::string("[cuda emulation] ") + operation +
        ": the pointer must be 32-byte aligned and ldm a multiple of 16 bytes, got offset " +
        std::to_string(reinterpret_cast<uintptr_t>(p) % 32) + " and ldm " + std::to_string(ldm));
  }
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
 public:
  static constexpr int kRows = detail::Extent<Use, M, N, K>::rows;
  static constexpr int kCols = detail::Extent<Use, M, N, K>::cols;
  static constexpr int num_elements = kRows * kCols;
  T x[num_elements];  // row-major, whatever the fragment's Layout
  T& at(int r, int c) { return x[r * kCols + c]; }
  const T& at(int r, int c) const { return x[r * kCols + c]; }
};

template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& value) {
  const T v = static_cast<T>(value);
  ::loom::cuda_emulation::warp_collective("wmma::fill_fragment", &v, sizeof(v));
  for (auto& e : f.x) e = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  detail::collective("wmma::load_matrix_sync", p, ldm, std::is_same_v<Layout, col_major>);
  detail::check_operands("wmma::load_matrix_sync", p, ldm);
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::kRows; ++r)
    for (int c = 0; c < F::kCols; ++c)
      f.at(r, c) = std::is_same_v<Layout, col_major> ? p[c * ldm + r] : p[r * ldm + c];
}

// accumulator: the layout is given.
template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  detail::collective("wmma::load_matrix_sync", p, ldm, layout);
  detail::check_operands("wmma::load_matrix_sync", p, ldm);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.at(r, c) = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  detail::collective("wmma::store_matrix_sync", p, ldm, layout);
  detail::check_operands("wmma::store_matrix_sync", p, ldm);
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      if (layout == mem_col_major)
        p[c * ldm + r] = f.at(r, c);
      else
        p[r * ldm + c] = f.at(r, c);
    }
}

// d = a b + c, products of the inputs exact in float, summed in k order in float.
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  using Result = fragment<accumulator, M, N, K, TC>;
  auto* result = static_cast<Result*>(::loom::cuda_emulation::warp_scratch(sizeof(Result)));
  if (::loom::cuda_emulation::warp_collective("wmma::mma_sync")) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float sum = static_cast<float>(c.at(i, j));
        for (int k = 0; k < K; ++k)
          sum += static_cast<float>(a.at(i, k)) * static_cast<float>(b.at(k, j));
        result->at(i, j) = static_cast<TC>(sum);
      }
  }
  d = *result;
}

}  // namespace nvcuda::wmma
