#include "tools/loom_perf/checks.h"

#include <array>
#include <cmath>
#include <cstring>

namespace loom::perf {

namespace {

using comm::ReduceOp;

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{float_to_bf16_bits(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, Half>) {
    return Half{float_to_f16_bits(static_cast<float>(v))};
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(v));  // wraps like the integer reduction
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16_bits_to_float(v.bits);
  } else if constexpr (std::is_same_v<T, Half>) {
    return f16_bits_to_float(v.bits);
  } else {
    return static_cast<double>(v);
  }
}

// Relative tolerance: exact for integers and for every op but avg, whose 1/n scaling may
// round differently from the exact quotient.
template <typename T>
double tolerance() {
  if constexpr (std::is_same_v<T, BFloat16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, Half>) return 1.0 / 1024;
  if constexpr (std::is_same_v<T, float>) return 1e-6;
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  return 0.0;
}

using Table = std::array<double, 7>;  // expected value by (3 j + seed) mod 7

double g(ReduceOp op, int m) {
  if (op == ReduceOp::Prod) return m == 0 ? 2.0 : 1.0;
  return m + 1.0;
}

// What rank `r` holds at positions whose residue is k.
Table rank_table(ReduceOp op, int r) {
  Table t{};
  for (int k = 0; k < 7; ++k)
    t[k] = g(op, (k + 5 * r) % 7);
  return t;
}

// The reduction over all ranks at positions whose residue is k.
Table reduced_table(ReduceOp op, int nranks) {
  Table t{};
  for (int k = 0; k < 7; ++k) {
    double acc = g(op, k);
    for (int r = 1; r < nranks; ++r) {
      double v = g(op, (k + 5 * r) % 7);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc += v; break;
        case ReduceOp::Prod: acc *= v; break;
        case ReduceOp::Min: acc = std::min(acc, v); break;
        case ReduceOp::Max: acc = std::max(acc, v); break;
      }
    }
    t[k] = op == ReduceOp::Avg ? acc / nranks : acc;
  }
  return t;
}

size_t residue(size_t j, uint32_t seed) {
  return (3 * j + seed) % 7;
}

// data[i] = table[residue(first + i)] for i < count.
template <typename T>
void fill_values(T* data, size_t count, size_t first, uint32_t seed, const Table& table) {
  std::array<T, 7> values{};
  for (int k = 0; k < 7; ++k)
    values[k] = from_double<T>(table[k]);
  size_t k = residue(first, seed);
  for (size_t i = 0; i < count; ++i) {
    data[i] = values[k];
    k += 3;
    if (k >= 7) k -= 7;
  }
}

template <typename T>
int64_t mismatches(const T* data, size_t count, size_t first, uint32_t seed, const Table& table) {
  std::array<double, 7> expected{};
  std::array<double, 7> slack{};
  for (int k = 0; k < 7; ++k) {
    expected[k] = to_double(from_double<T>(table[k]));  // what the dtype can represent
    slack[k] = tolerance<T>() * std::max(1.0, std::abs(expected[k]));
  }
  int64_t wrong = 0;
  size_t k = residue(first, seed);
  for (size_t i = 0; i < count; ++i) {
    double got = to_double(data[i]);
    if (!(std::abs(got - expected[k]) <= slack[k])) ++wrong;  // NaN counts as wrong
    k += 3;
    if (k >= 7) k -= 7;
  }
  return wrong;
}

void fill_slice(DType dtype, void* base, size_t offset, size_t count, size_t first, uint32_t seed,
                const Table& table) {
  visit_dtype(dtype, [&]<typename T>() {
    fill_values(static_cast<T*>(base) + offset, count, first, seed, table);
  });
}

int64_t check_slice(DType dtype, const void* base, size_t offset, size_t count, size_t first,
                    uint32_t seed, const Table& table) {
  int64_t wrong = 0;
  visit_dtype(dtype, [&]<typename T>() {
    wrong = mismatches(static_cast<const T*>(base) + offset, count, first, seed, table);
  });
  return wrong;
}

}  // namespace

void fill_case(const CheckSpec& s, CaseBuffers& b, uint32_t seed) {
  if (s.collective == Collective::Barrier) return;
  std::memset(b.output.raw_data(), 0xAB, b.output.nbytes());
  const Table mine = rank_table(s.op, s.rank);
  switch (s.collective) {
    case Collective::Broadcast:
      if (s.rank == s.root) fill_slice(s.dtype, b.input.raw_data(), 0, s.count, 0, seed, mine);
      break;
    case Collective::AllGather:
      fill_slice(s.dtype, b.input.raw_data(), 0, s.per_rank, 0, seed, mine);
      break;
    default: fill_slice(s.dtype, b.input.raw_data(), 0, s.count, 0, seed, mine); break;
  }
}

int64_t count_wrong(const CheckSpec& s, const CaseBuffers& b, uint32_t seed) {
  const void* out = b.output.raw_data();
  const size_t per = s.per_rank;
  int64_t wrong = 0;
  switch (s.collective) {
    case Collective::AllReduce:
      return check_slice(s.dtype, out, 0, s.count, 0, seed, reduced_table(s.op, s.nranks));
    case Collective::Reduce:
      if (s.rank != s.root) return 0;
      return check_slice(s.dtype, out, 0, s.count, 0, seed, reduced_table(s.op, s.nranks));
    case Collective::Broadcast:
      return check_slice(s.dtype, out, 0, s.count, 0, seed, rank_table(s.op, s.root));
    case Collective::AllGather:
      for (int q = 0; q < s.nranks; ++q) {
        wrong += check_slice(s.dtype, out, q * per, per, 0, seed, rank_table(s.op, q));
      }
      return wrong;
    case Collective::ReduceScatter:
      return check_slice(s.dtype, out, 0, per, s.rank * per, seed, reduced_table(s.op, s.nranks));
    case Collective::AllToAll:
      // Slice q of the output came from rank q, which sent its input's slice s.rank.
      for (int q = 0; q < s.nranks; ++q) {
        wrong += check_slice(s.dtype, out, q * per, per, s.rank * per, seed, rank_table(s.op, q));
      }
      return wrong;
    case Collective::SendRecv: {
      int prev = (s.rank + s.nranks - 1) % s.nranks;
      return check_slice(s.dtype, out, 0, s.count, 0, seed, rank_table(s.op, prev));
    }
    case Collective::Barrier: return 0;
  }
  return wrong;
}

}  // namespace loom::perf
