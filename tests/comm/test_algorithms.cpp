// Conformance of the generic collectives in comm/algorithms/ over ThreadTransport: world
// sizes 1..8 (threads), counts including 0 and ones not divisible by the size, every
// ReduceOp and dtype, every root, against closed-form expected values that are exact in
// every dtype (small integers: bf16 holds integers up to 256 exactly).

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "reference_algorithms/reference_algorithms.h"
#include "comm/algorithms/subset_transport.h"
#include "reference_algorithms/thread_transport.h"
#include "comm/backend.h"
#include "comm/error.h"
#include "comm/shm/shm_backend.h"
#include "core/error.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;

constexpr DType kTypes[] = {DType::F32, DType::F64, DType::I32, DType::I64,
                            DType::U8,  DType::BF16, DType::F16};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max,
                             ReduceOp::Prod};

// f16 from a value it holds exactly as a normal number (the tests use small integers and
// halves), and back from any bits.
uint16_t to_f16(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (x == 0) return sign;
  int e = 0;
  const double m = std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  const auto mantissa = static_cast<uint16_t>(std::lround((2 * m - 1) * 1024));
  return static_cast<uint16_t>(sign | ((e + 14) << 10) | mantissa);
}

double from_f16(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 31;
  const int mantissa = h & 1023;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

uint16_t to_bf16(double x) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(float(x)) >> 16);
}
double from_bf16(uint16_t b) {
  return std::bit_cast<float>(uint32_t{b} << 16);
}

void store(DType type, void* data, size_t i, double x) {
  switch (type) {
    case DType::F32: static_cast<float*>(data)[i] = static_cast<float>(x); break;
    case DType::F64: static_cast<double*>(data)[i] = x; break;
    case DType::I32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(x); break;
    case DType::I64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(x); break;
    case DType::U8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(x); break;
    case DType::BF16: static_cast<uint16_t*>(data)[i] = to_bf16(x); break;
    case DType::F16: static_cast<uint16_t*>(data)[i] = to_f16(x); break;
  }
}

double load(DType type, const void* data, size_t i) {
  switch (type) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::F64: return static_cast<const double*>(data)[i];
    case DType::I32: return static_cast<const int32_t*>(data)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::U8: return static_cast<const uint8_t*>(data)[i];
    case DType::BF16: return from_bf16(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return from_f16(static_cast<const uint16_t*>(data)[i]);
  }
  return NAN;
}

// A buffer of `count` elements of `type`.
struct Buffer {
  Buffer(DType type, size_t count) : type(type), bytes(count * dtype_size(type)) {}
  void* data() { return bytes.data(); }
  void set(size_t i, double x) { store(type, bytes.data(), i, x); }
  double get(size_t i) const { return load(type, bytes.data(), i); }
  DType type;
  std::vector<std::byte> bytes;
};

// Element i of rank r's contribution, and the closed form of its reduction over a world of
// w ranks. The rank holding the extreme value changes with i; signed types go negative.
// Prod uses factors 1 and 2 only, so the product (2^k, k <= 3 for w <= 8) stays exact.
double offset(DType type) {
  return type == DType::U8 ? 0 : 10;
}

double contribution(DType type, ReduceOp op, int r, size_t i, int w) {
  if (op == ReduceOp::Prod) return (i + static_cast<size_t>(r)) % 3 == 0 ? 2 : 1;
  const auto rotated =
      static_cast<double>((i + static_cast<size_t>(r)) % static_cast<size_t>(w) + 1);
  return rotated * static_cast<double>(i % 5 + 1) - offset(type);
}

double expected(DType type, ReduceOp op, size_t i, int w) {
  const double base = static_cast<double>(i % 5 + 1);
  switch (op) {
    case ReduceOp::Sum: return base * w * (w + 1) / 2 - w * offset(type);
    case ReduceOp::Avg: return base * (w + 1) / 2 - offset(type);
    case ReduceOp::Min: return base - offset(type);
    case ReduceOp::Max: return base * w - offset(type);
    case ReduceOp::Prod: {
      double product = 1;
      for (int r = 0; r < w; ++r)
        product *= contribution(type, op, r, i, w);
      return product;
    }
  }
  return NAN;
}

// Avg divides by the size in floating point: allow two units in the last place.
double tolerance(DType type, ReduceOp op) {
  if (op != ReduceOp::Avg) return 0;
  switch (type) {
    case DType::BF16: return 0x1p-7;
    case DType::F16: return 0x1p-10;
    case DType::F32: return 0x1p-22;
    default: return 0x1p-51;
  }
}

std::string describe(DType type, size_t count, int w) {
  return std::string(dtype_name(type)) + " count " + std::to_string(count) + " world " +
         std::to_string(w);
}
std::string describe(DType type, ReduceOp op, size_t count, int w) {
  return describe(type, count, w) + " op " + std::string(reduce_op_name(op));
}

// Records at most a few failures per rank, so a broken algorithm does not flood the log.
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  // Elements [0, count) of `actual` against want(i); true when all match.
  template <typename Want>
  bool expect(const Buffer& actual, size_t first, size_t count, Want want, double tol,
              const std::string& context) {
    for (size_t i = 0; i < count; ++i) {
      const double got = actual.get(first + i);
      const double w = want(i);
      if (!(std::fabs(got - w) <= tol * std::max(1.0, std::fabs(w)))) {
        if (++failures_ <= 3) {
          ADD_FAILURE() << "rank " << rank_ << ", " << context << ": element " << i << " is " << got
                        << ", expected " << w;
        }
        return false;
      }
    }
    return true;
  }

 private:
  int rank_;
  int failures_ = 0;
};

uint64_t fnv1a(const std::vector<std::byte>& bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (std::byte b : bytes)
    hash = (hash ^ std::to_integer<uint64_t>(b)) * 1099511628211ull;
  return hash;
}

Deadline generous() {
  return deadline_after(30s);
}

// --- Per-rank bodies, shared by the thread and the shm runs -----------------------------
// Each runs one collective over a matrix of dtypes, ops, counts (and roots) on one rank of
// `t`, checking this rank's result.

using Allreduce = void (*)(Transport&, void*, size_t, DType, ReduceOp, Deadline);

// Appends a hash of every result to `hashes`, for the cross-rank bitwise comparison.
void allreduce_body(Allreduce allreduce, Transport& t, const std::vector<size_t>& counts,
                    std::vector<uint64_t>& hashes) {
  const int w = t.size();
  Checker checker(t.rank());
  for (DType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_floating(type)) continue;
      for (size_t count : counts) {
        Buffer data(type, count);
        for (size_t i = 0; i < count; ++i)
          data.set(i, contribution(type, op, t.rank(), i, w));
        allreduce(t, data.data(), count, type, op, generous());
        checker.expect(
            data, 0, count, [&](size_t i) { return expected(type, op, i, w); }, tolerance(type, op),
            describe(type, op, count, w));
        hashes.push_back(fnv1a(data.bytes));
      }
    }
  }
}

// Element i of rank r's block in gathers and broadcasts: exact in every dtype.
double block_value(int r, size_t i) {
  return static_cast<double>((static_cast<size_t>(r) * 37 + i) % 200);
}

void all_gather_body(Transport& t, const std::vector<size_t>& counts) {
  const int w = t.size();
  Checker checker(t.rank());
  const auto rank = static_cast<size_t>(t.rank());
  for (DType type : kTypes) {
    for (size_t count : counts) {
      for (bool in_place : {false, true}) {
        Buffer output(type, count * static_cast<size_t>(w));
        Buffer input(type, count);
        for (size_t i = 0; i < count * static_cast<size_t>(w); ++i)
          output.set(i, 255);
        Buffer& source = in_place ? output : input;
        const size_t first = in_place ? rank * count : 0;
        for (size_t i = 0; i < count; ++i)
          source.set(first + i, block_value(t.rank(), i));
        algorithms::ring_all_gather(
            t, static_cast<std::byte*>(source.data()) + first * dtype_size(type), output.data(),
            count, type, generous());
        for (int r = 0; r < w; ++r) {
          checker.expect(
              output, static_cast<size_t>(r) * count, count,
              [&](size_t i) { return block_value(r, i); }, 0,
              describe(type, count, w) + (in_place ? " in place" : "") + " block " +
                  std::to_string(r));
        }
      }
    }
  }
}

using ReduceScatter = void (*)(Transport&, const void*, void*, size_t, DType, ReduceOp,
                               Deadline);

void reduce_scatter_body(Transport& t, const std::vector<size_t>& counts,
                         ReduceScatter reduce_scatter = &algorithms::ring_reduce_scatter) {
  const int w = t.size();
  Checker checker(t.rank());
  const auto rank = static_cast<size_t>(t.rank());
  for (DType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_floating(type)) continue;
      for (size_t count : counts) {
        for (bool in_place : {false, true}) {
          // Element j of the whole [w * count] input is contribution(.., j, ..).
          const size_t total = count * static_cast<size_t>(w);
          Buffer input(type, total);
          for (size_t j = 0; j < total; ++j)
            input.set(j, contribution(type, op, t.rank(), j, w));
          const std::vector<std::byte> original = input.bytes;
          Buffer output(type, count);
          Buffer& result = in_place ? input : output;
          const size_t first = in_place ? rank * count : 0;
          reduce_scatter(t, input.data(),
                         static_cast<std::byte*>(result.data()) + first * dtype_size(type), count,
                         type, op, generous());
          const std::string context = describe(type, op, count, w) + (in_place ? " in place" : "");
          checker.expect(
              result, first, count,
              [&](size_t i) { return expected(type, op, rank * count + i, w); },
              tolerance(type, op), context);
          if (!in_place) {
            EXPECT_TRUE(input.bytes == original)
                << "rank " << rank << ", " << context << ": input was modified";
          }
        }
      }
    }
  }
}

void broadcast_body(Transport& t, const std::vector<size_t>& counts) {
  const int w = t.size();
  Checker checker(t.rank());
  for (int root = 0; root < w; ++root) {
    for (DType type : kTypes) {
      for (size_t count : counts) {
        Buffer data(type, count);
        for (size_t i = 0; i < count; ++i)
          data.set(i, t.rank() == root ? block_value(root, i) : 255);
        algorithms::tree_broadcast(t, data.data(), count, type, root, generous());
        checker.expect(
            data, 0, count, [&](size_t i) { return block_value(root, i); }, 0,
            describe(type, count, w) + " root " + std::to_string(root));
      }
    }
  }
}

void reduce_body(Transport& t, const std::vector<size_t>& counts) {
  const int w = t.size();
  Checker checker(t.rank());
  for (int root = 0; root < w; ++root) {
    for (DType type : kTypes) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::Avg && !is_floating(type)) continue;
        for (size_t count : counts) {
          Buffer data(type, count);
          for (size_t i = 0; i < count; ++i)
            data.set(i, contribution(type, op, t.rank(), i, w));
          algorithms::tree_reduce(t, data.data(), count, type, op, root, generous());
          const std::string context =
              describe(type, op, count, w) + " root " + std::to_string(root);
          if (t.rank() == root) {
            checker.expect(
                data, 0, count, [&](size_t i) { return expected(type, op, i, w); },
                tolerance(type, op), context);
          } else {
            checker.expect(
                data, 0, count, [&](size_t i) { return contribution(type, op, t.rank(), i, w); }, 0,
                context + " (non-root data must stay unchanged)");
          }
        }
      }
    }
  }
}

// --- Ranks as threads (ThreadTransport) -------------------------------------------------

const std::vector<size_t> kCounts = {0, 1, 7, 1000, 4099};

// Runs fn on `w` thread ranks and fails the test with any rank's exception.
void run_threads(int w, const std::function<void(ThreadTransport&)>& fn) {
  const std::vector<std::exception_ptr> errors = run_in_threads(w, fn);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

class ThreadRanks : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }

  void check_allreduce(Allreduce allreduce) {
    const int w = world();
    std::vector<std::vector<uint64_t>> hashes(static_cast<size_t>(w));
    run_threads(w, [&](ThreadTransport& t) {
      allreduce_body(allreduce, t, kCounts, hashes[static_cast<size_t>(t.rank())]);
    });
    for (int r = 1; r < w; ++r) {
      EXPECT_EQ(hashes[static_cast<size_t>(r)], hashes[0])
          << "rank " << r << " got different bits than rank 0";
    }
  }
};

TEST_P(ThreadRanks, RingAllreduce) {
  check_allreduce(&algorithms::ring_allreduce);
}

TEST_P(ThreadRanks, HalvingDoublingAllreduce) {
  check_allreduce(&algorithms::halving_doubling_allreduce);
}

TEST_P(ThreadRanks, RankOrderedAllreduce) {
  check_allreduce(&algorithms::rank_ordered_allreduce);
}

TEST_P(ThreadRanks, RankOrderedReduceScatter) {
  run_threads(world(), [](ThreadTransport& t) {
    reduce_scatter_body(t, kCounts, &algorithms::rank_ordered_reduce_scatter);
  });
}

// Every rank's data for a rank-order test (n elements of `type` per rank, w ranks) and what
// the shm backend computes from it: reduce_inputs over the ranks' buffers in rank order.
struct RankOrderCase {
  std::vector<Buffer> all;  // by rank
  Buffer want;
};

RankOrderCase rank_order_case(DType type, ReduceOp op, int w, size_t n) {
  RankOrderCase c{{}, Buffer(type, n)};
  std::vector<const void*> pointers;
  for (int r = 0; r < w; ++r) {
    c.all.emplace_back(type, n);
    for (size_t i = 0; i < n; ++i)
      c.all.back().set(i, std::sin(static_cast<double>(i) * 0.37 + r * 1.3) * 1e3 / (1 + i % 17));
  }
  for (const Buffer& b : c.all)
    pointers.push_back(b.bytes.data());
  kernels::cpu::reduce_inputs(type, reduce_kind_of(op), c.want.data(), pointers.data(),
                              static_cast<size_t>(w), n, op == ReduceOp::Avg ? 1.0 / w : 1.0);
  return c;
}

// Note [Rank-ordered reductions]: the bits of reduce_inputs over every rank's data in rank
// order (what the shm backend computes), in one call or in pieces of any size.
TEST_P(ThreadRanks, RankOrderedAllreduceGivesTheRankOrderBitsInAnyPieces) {
  const int w = world();
  const size_t n = 10007;
  for (DType type : {DType::F32, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      // Named members, not a structured binding: clang 14 cannot capture those in a lambda.
      const RankOrderCase data = rank_order_case(type, op, w, n);
      const std::vector<Buffer>& all = data.all;
      const Buffer& want = data.want;
      run_threads(w, [&](ThreadTransport& t) {
        const size_t es = dtype_size(type);
        Buffer whole = all[static_cast<size_t>(t.rank())];
        algorithms::rank_ordered_allreduce(t, whole.data(), n, type, op, generous());
        Buffer pieces = all[static_cast<size_t>(t.rank())];
        for (size_t start = 0; start < n; start += 999) {
          algorithms::rank_ordered_allreduce(t, pieces.bytes.data() + start * es,
                                             std::min<size_t>(999, n - start), type, op,
                                             generous());
        }
        const std::string context = std::string(dtype_name(type)) + " " + std::string(reduce_op_name(op)) +
                                    ", rank " + std::to_string(t.rank());
        EXPECT_TRUE(whole.bytes == want.bytes) << context << ": one call";
        EXPECT_TRUE(pieces.bytes == want.bytes) << context << ": in pieces of 999";
      });
    }
  }
}

// Out of place (no copy of the input first): the in-place bits, the input left unchanged,
// on both paths (one shot, and reduce-scatter then all-gather past 256 KiB per peer).
TEST_P(ThreadRanks, RankOrderedAllreduceOutOfPlaceGivesTheInPlaceBits) {
  for (size_t n : {size_t{10007}, size_t{70001}}) {
    run_threads(world(), [n](ThreadTransport& t) {
      Buffer input(DType::F32, n);
      for (size_t i = 0; i < n; ++i)
        input.set(i, std::sin(static_cast<double>(i) * 0.37 + t.rank() * 1.3) * 1e3);
      const Buffer original = input;
      Buffer in_place = input;
      algorithms::rank_ordered_allreduce(t, in_place.data(), n, DType::F32, ReduceOp::Sum,
                                         generous());
      Buffer output(DType::F32, n);
      algorithms::rank_ordered_allreduce(t, input.data(), output.data(), n, DType::F32,
                                         ReduceOp::Sum, generous());
      EXPECT_TRUE(output.bytes == in_place.bytes) << n << " elements, rank " << t.rank();
      EXPECT_TRUE(input.bytes == original.bytes) << n << " elements, rank " << t.rank();
    });
  }
}

// Note [Pieces of a rank-ordered reduction]: parts longer than a piece (512 KiB) go piece by
// piece, an allreduce passing each reduced piece on at once. Parts of 1.5 pieces and of
// unequal lengths: the rank-order bits, in place and out of place, and for reduce-scatter.
// From four ranks up the pieces are 16 KiB, the same walk over megabytes less per rank (at 8
// ranks the 512 KiB pieces took 14 s under ThreadSanitizer); the buffers still exceed the
// one-shot budget, so the allreduce goes through its reduce-scatter.
TEST_P(ThreadRanks, RankOrderedReductionsInPiecesGiveTheRankOrderBits) {
  EXPECT_THROW(algorithms::set_rank_ordered_piece_bytes_for_testing(12), loom::Error);
  const int w = world();
  const size_t piece_bytes = w >= 4 ? size_t{16} << 10 : size_t{512} << 10;
  algorithms::set_rank_ordered_piece_bytes_for_testing(w >= 4 ? piece_bytes : 0);
  struct RestorePiece {
    ~RestorePiece() { algorithms::set_rank_ordered_piece_bytes_for_testing(0); }
  } restore_piece;
  for (DType type : {DType::F32, DType::BF16}) {
    const size_t piece = piece_bytes / dtype_size(type);
    const size_t n = static_cast<size_t>(w) * (piece + piece / 2) + 3;
    const RankOrderCase data = rank_order_case(type, ReduceOp::Sum, w, n);
    const std::vector<Buffer>& all = data.all;
    const Buffer& want = data.want;
    run_threads(w, [&](ThreadTransport& t) {
      const std::string context =
          std::string(dtype_name(type)) + ", rank " + std::to_string(t.rank());
      const Buffer& mine = all[static_cast<size_t>(t.rank())];
      Buffer in_place = mine;
      algorithms::rank_ordered_allreduce(t, in_place.data(), n, type, ReduceOp::Sum, generous());
      EXPECT_TRUE(in_place.bytes == want.bytes) << context << ": allreduce in place";
      Buffer input = mine;
      Buffer output(type, n);
      algorithms::rank_ordered_allreduce(t, input.data(), output.data(), n, type, ReduceOp::Sum,
                                         generous());
      EXPECT_TRUE(output.bytes == want.bytes) << context << ": allreduce out of place";
      EXPECT_TRUE(input.bytes == mine.bytes) << context << ": allreduce changed its input";
      // Reduce-scatter of the first w * m elements: this rank's m of the sum.
      const size_t m = n / static_cast<size_t>(w);
      const size_t es = dtype_size(type);
      Buffer scattered(type, m);
      algorithms::rank_ordered_reduce_scatter(t, input.data(), scattered.data(), m, type,
                                              ReduceOp::Sum, generous());
      const auto* first = want.bytes.data() + static_cast<size_t>(t.rank()) * m * es;
      EXPECT_TRUE(std::equal(first, first + m * es, scattered.bytes.begin()))
          << context << ": reduce-scatter";
    });
  }
}

// A subset of ranks, in an order of its own, runs collectives over the whole's streams; the
// other ranks take no part. Members that repeat or are out of range, and a rank that is not a
// member, are refused.
TEST(SubsetTransport, CollectivesAmongSomeRanksInTheirOwnOrder) {
  run_threads(4, [](ThreadTransport& whole) {
    EXPECT_THROW(algorithms::SubsetTransport(whole, {0, 1, 2, 3, 3}), Error);
    EXPECT_THROW(algorithms::SubsetTransport(whole, {0, 1, 2, 4}), Error);
    if (whole.rank() != 3 && whole.rank() != 1) {
      EXPECT_THROW(algorithms::SubsetTransport(whole, {3, 1}), Error);
      return;
    }
    algorithms::SubsetTransport subset(whole, {3, 1});
    EXPECT_EQ(subset.rank(), whole.rank() == 3 ? 0 : 1);
    EXPECT_EQ(subset.size(), 2);
    std::vector<float> data = {1.0f * static_cast<float>(whole.rank()), 10.0f};
    algorithms::rank_ordered_allreduce(subset, data.data(), data.size(), DType::F32, ReduceOp::Sum,
                                       generous());
    EXPECT_EQ(data, (std::vector<float>{4.0f, 20.0f}));
    std::vector<float> gathered(2);
    const float mine = static_cast<float>(whole.rank());
    algorithms::ring_all_gather(subset, &mine, gathered.data(), 1, DType::F32, generous());
    EXPECT_EQ(gathered, (std::vector<float>{3.0f, 1.0f}));  // subset rank order
  });
}

TEST_P(ThreadRanks, RingAllGather) {
  run_threads(world(), [](ThreadTransport& t) { all_gather_body(t, kCounts); });
}

TEST_P(ThreadRanks, RingReduceScatter) {
  run_threads(world(), [](ThreadTransport& t) { reduce_scatter_body(t, kCounts); });
}

TEST_P(ThreadRanks, TreeBroadcast) {
  run_threads(world(), [](ThreadTransport& t) { broadcast_body(t, kCounts); });
}

TEST_P(ThreadRanks, TreeReduce) {
  run_threads(world(), [](ThreadTransport& t) { reduce_body(t, kCounts); });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ThreadRanks, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "W" + std::to_string(info.param);
                         });

// --- Ranks as forked processes over the shm backend's Transport --------------------------

Bytes hash_bytes(const std::vector<uint64_t>& hashes) {
  Bytes bytes(hashes.size() * sizeof(uint64_t));
  if (!bytes.empty()) std::memcpy(bytes.data(), hashes.data(), bytes.size());
  return bytes;
}

class ShmRanks : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

// Every algorithm in one set of processes (forking and attaching cost more than the
// collectives); fewer counts than the thread runs, which cover the arithmetic.
TEST_P(ShmRanks, AllAlgorithms) {
  testing::expect_all_ok(testing::run_ranks(world(), [](int rank, int size,
                                                        std::shared_ptr<Store> store) {
    const std::vector<size_t> counts = {0, 1, 7, 4099};
    auto backend =
        std::make_unique<shm::ShmBackend>(BackendContext{.rank = rank,
                                                         .size = size,
                                                         .store = store,
                                                         .timeout = 30s,
                                                         .group_name = "test_algorithms"});
    Transport& t = *backend;
    const std::pair<const char*, Allreduce> allreduces[] = {
        {"ring", &algorithms::ring_allreduce},
        {"halving_doubling", &algorithms::halving_doubling_allreduce}};
    for (const auto& [name, allreduce] : allreduces) {
      std::vector<uint64_t> hashes;
      allreduce_body(allreduce, t, counts, hashes);
      store->set(std::string("hashes/") + name + "/" + std::to_string(rank), hash_bytes(hashes));
      if (rank == 0) {
        for (int r = 1; r < size; ++r) {
          EXPECT_EQ(store->get(std::string("hashes/") + name + "/" + std::to_string(r), 30s),
                    hash_bytes(hashes))
              << name << ": rank " << r << " got different bits than rank 0";
        }
      }
    }
    all_gather_body(t, counts);
    reduce_scatter_body(t, counts);
    broadcast_body(t, counts);
    reduce_body(t, counts);
  }));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ShmRanks, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "W" + std::to_string(info.param);
                         });

// The shm transport has no close(): rank 1 attaches, then never calls; rank 2 receives from
// it first and must name it at about the deadline.
TEST(ShmFailure, RingAllreduceNamesAbsentPeer) {
  testing::expect_all_ok(
      testing::run_ranks(3, [](int rank, int size, std::shared_ptr<Store> store) {
        shm::ShmBackend backend(BackendContext{.rank = rank,
                                               .size = size,
                                               .store = store,
                                               .timeout = 30s,
                                               .group_name = "test_algorithms"});
        if (rank == 1) {
          std::this_thread::sleep_for(600ms);
          return;
        }
        std::vector<float> buffer(100, 1.0f);
        const auto start = Clock::now();
        try {
          algorithms::ring_allreduce(backend, buffer.data(), buffer.size(), DType::F32,
                                     ReduceOp::Sum, deadline_after(200ms));
          ADD_FAILURE() << "rank " << rank << ": allreduce without rank 1 succeeded";
        } catch (const CommError& e) {
          if (rank == 2) {
            EXPECT_EQ(e.peer(), 1) << e.what();
            EXPECT_NE(std::string(e.what()).find("peer 1"), std::string::npos) << e.what();
          }
        }
        const auto elapsed = Clock::now() - start;
        EXPECT_LT(elapsed, 1500ms) << "rank " << rank;
        if (rank == 2) {
          EXPECT_GE(elapsed, 190ms);
        }
      }));
}

// --- Failures -------------------------------------------------------------------------

struct Outcome {
  bool threw_comm_error = false;
  std::optional<int> peer;
  std::string message;
  std::chrono::milliseconds elapsed{0};
};

// Every rank but `absent` runs `collective` with a 200 ms deadline; `absent` never calls.
std::vector<Outcome> run_with_absent_rank(
    int w, int absent, const std::function<void(Transport&, Deadline)>& collective) {
  std::vector<Outcome> outcomes(static_cast<size_t>(w));
  const std::vector<std::exception_ptr> errors = run_in_threads(w, [&](ThreadTransport& t) {
    if (t.rank() == absent) return;
    Outcome& outcome = outcomes[static_cast<size_t>(t.rank())];
    const auto start = Clock::now();
    try {
      collective(t, deadline_after(200ms));
    } catch (const CommError& e) {
      outcome.threw_comm_error = true;
      outcome.peer = e.peer();
      outcome.message = e.what();
    }
    outcome.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  });
  for (const auto& error : errors)
    EXPECT_FALSE(error) << "unexpected exception type";
  return outcomes;
}

// `waiter` waits on `absent` directly: it must name it, at about the deadline; every other
// calling rank must fail too, soon after.
void expect_deadline_failure(const std::vector<Outcome>& outcomes, int absent, int waiter) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (static_cast<int>(r) == absent) continue;
    const Outcome& o = outcomes[r];
    EXPECT_TRUE(o.threw_comm_error) << "rank " << r << " did not fail";
    EXPECT_LT(o.elapsed, 1500ms) << "rank " << r << ": " << o.message;
  }
  const Outcome& o = outcomes[static_cast<size_t>(waiter)];
  EXPECT_EQ(o.peer, absent) << o.message;
  EXPECT_NE(o.message.find("peer " + std::to_string(absent)), std::string::npos) << o.message;
  EXPECT_GE(o.elapsed, 190ms) << o.message;
}

TEST(AlgorithmsFailure, RingAllreduceNamesAbsentPeer) {
  auto outcomes = run_with_absent_rank(4, 2, [](Transport& t, Deadline deadline) {
    std::vector<float> buffer(100, 1.0f);
    algorithms::ring_allreduce(t, buffer.data(), buffer.size(), DType::F32, ReduceOp::Sum,
                               deadline);
  });
  expect_deadline_failure(outcomes, 2, 3);  // rank 3 receives from rank 2 first
}

TEST(AlgorithmsFailure, HalvingDoublingNamesAbsentPeer) {
  // Size 3: rank 0 folds into rank 1, which waits for it.
  auto outcomes = run_with_absent_rank(3, 0, [](Transport& t, Deadline deadline) {
    std::vector<int32_t> buffer(10, 1);
    algorithms::halving_doubling_allreduce(t, buffer.data(), buffer.size(), DType::I32,
                                           ReduceOp::Sum, deadline);
  });
  expect_deadline_failure(outcomes, 0, 1);
}

TEST(AlgorithmsFailure, TreeBroadcastNamesAbsentRoot) {
  auto outcomes = run_with_absent_rank(4, 1, [](Transport& t, Deadline deadline) {
    std::vector<double> buffer(10, 0.0);
    algorithms::tree_broadcast(t, buffer.data(), buffer.size(), DType::F64, 1, deadline);
  });
  expect_deadline_failure(outcomes, 1, 2);  // relative rank 1 is the root's first child
}

TEST(AlgorithmsFailure, MisuseThrowsBeforeSending) {
  auto fabric = std::make_shared<ThreadFabric>(2);
  ThreadTransport t(fabric, 0);
  std::vector<int32_t> ints(4, 1);
  EXPECT_THROW(algorithms::ring_allreduce(t, ints.data(), ints.size(), DType::I32,
                                          ReduceOp::Avg, generous()),
               loom::Error);
  EXPECT_THROW(
      algorithms::tree_broadcast(t, ints.data(), ints.size(), DType::I32, 2, generous()),
      loom::Error);
  EXPECT_THROW(algorithms::tree_reduce(t, ints.data(), ints.size(), DType::I32, ReduceOp::Sum,
                                       -1, generous()),
               loom::Error);
  EXPECT_THROW(
      algorithms::ring_allreduce(t, nullptr, 4, DType::I32, ReduceOp::Sum, generous()),
      loom::Error);
}

TEST(ThreadTransport, MismatchedSizeNamesPeer) {
  auto errors = run_in_threads(2, [](ThreadTransport& t) {
    int64_t value = 7;
    if (t.rank() == 0) {
      t.send(&value, sizeof value, 1, generous());
    } else {
      int32_t small = 0;
      try {
        t.recv(&small, sizeof small, 0, generous());
        ADD_FAILURE() << "recv of the wrong size succeeded";
      } catch (const CommError& e) {
        EXPECT_EQ(e.peer(), 0);
        EXPECT_EQ(e.rank(), 1);
        EXPECT_NE(std::string(e.what()).find("peer 0"), std::string::npos) << e.what();
      }
    }
  });
  for (const auto& error : errors)
    EXPECT_FALSE(error);
}

TEST(ThreadTransport, ClosedPeerFailsAtOnceAfterItsMessages) {
  auto fabric = std::make_shared<ThreadFabric>(2);
  ThreadTransport a(fabric, 0);
  ThreadTransport b(fabric, 1);
  const int sent = 42;
  a.send(&sent, sizeof sent, 1, generous());
  a.close();
  int got = 0;
  b.recv(&got, sizeof got, 0, generous());  // delivered despite the close
  EXPECT_EQ(got, 42);
  const auto start = Clock::now();
  try {
    b.recv(&got, sizeof got, 0, generous());
    ADD_FAILURE() << "recv from a closed peer succeeded";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), 0);
  }
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_THROW(b.send(&got, sizeof got, 0, generous()), CommError);
}

TEST(ThreadTransport, RecvTimesOutAtDeadline) {
  auto fabric = std::make_shared<ThreadFabric>(2);
  ThreadTransport a(fabric, 0);
  ThreadTransport b(fabric, 1);
  int got = 0;
  const auto start = Clock::now();
  try {
    b.recv(&got, sizeof got, 0, deadline_after(200ms));
    ADD_FAILURE() << "recv without a sender succeeded";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), 0);
    EXPECT_NE(std::string(e.what()).find("peer 0"), std::string::npos) << e.what();
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 190ms);
  EXPECT_LT(elapsed, 1s);
}

}  // namespace
}  // namespace loom::comm
