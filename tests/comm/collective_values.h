#pragma once
// Inputs and expected results of the collective tests, shared by the conformance suite and
// the CUDA ones (nccl, staging): rank r's contribution to element i is chosen so that every
// reduction is exact in every dtype, and results are compared as doubles.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/reduce_op.h"
#include "tensor/tensor.h"

namespace loom::comm::testing {

constexpr DType kAllDtypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                DType::I32, DType::I64, DType::U8};
constexpr ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max,
                                ReduceOp::Prod};
constexpr int64_t kCounts[] = {0, 1, 7, 1000, 300001};

// A CPU tensor of `dtype` with element i = value(i) (exact for the small integers used here).
inline Tensor filled(DType dtype, int64_t n, const std::function<double(int64_t)>& value) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = value(i);
  return Tensor::from_vector(v, {n}).to(dtype);
}

// Rank r's contribution to element i.
inline double contribution(ReduceOp op, int r, int64_t i) {
  if (op == ReduceOp::Prod) return 1 + ((r + i) % 2);  // products are powers of two
  return (r + 1) * (i % 5 + 1);
}

// Element i of the reduction over `size` ranks (u8 products wrap around).
inline double expected(ReduceOp op, int size, int64_t i, DType dtype = DType::F64) {
  double k = static_cast<double>(i % 5 + 1);
  switch (op) {
    case ReduceOp::Sum: return k * size * (size + 1) / 2;
    case ReduceOp::Avg: return k * (size + 1) / 2.0;
    case ReduceOp::Min: return k;
    case ReduceOp::Max: return k * size;
    case ReduceOp::Prod: {
      double p = 1;
      for (int r = 0; r < size; ++r)
        p *= contribution(op, r, i);
      return dtype == DType::U8 ? std::fmod(p, 256.0) : p;
    }
  }
  return 0;
}

inline bool valid(ReduceOp op, DType dtype) {
  return op != ReduceOp::Avg || is_floating(dtype);
}

// Compares t (on any device) exactly, except Avg (a multiplication by 1/size) within a
// relative 1e-6 (2^-7 for bf16/f16, which round the scaled value once).
inline void expect_values(const Tensor& t, const std::function<double(int64_t)>& want, ReduceOp op,
                          const std::string& context) {
  std::vector<double> got = t.to(Device::cpu()).to(DType::F64).to_vector<double>();
  double tol = op != ReduceOp::Avg                                     ? 0.0
               : is_16bit_float(t.dtype()) ? 1.0 / 128
                                                                       : 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    double w = want(static_cast<int64_t>(i));
    if (std::abs(got[i] - w) > tol * std::abs(w)) {
      ADD_FAILURE() << context << ": element " << i << " is " << got[i] << ", expected " << w;
      return;
    }
  }
}

// "allreduce bf16 n=7 op=sum rank=1" (rank left out when negative).
inline std::string describe(const char* what, DType d, int64_t n, ReduceOp op = ReduceOp::Sum,
                            int rank = -1) {
  std::string text = std::string(what) + " " + std::string(dtype_name(d)) +
                     " n=" + std::to_string(n) + " op=" + std::string(reduce_op_name(op));
  return rank < 0 ? text : text + " rank=" + std::to_string(rank);
}

}  // namespace loom::comm::testing
