// Rank-ordered reductions over the point-to-point Transport.
//
// Note [Rank-ordered reductions]
// Ring and halving-doubling combine partial sums in an order that depends on the chunk an
// element falls in, so the same data reduced in one call or in pieces can differ in the last
// bits (Note [Rounding of bf16/f16 reductions]). Here the rank that owns a chunk receives
// every other rank's copy of it and reduces all of them at once, in rank order, with
// reduce_inputs: the element-wise result depends only on the values, as the shm backend's
// does, so a job gives the same bits on shm, on a network backend, and on both together
// (a hierarchical group). Each rank sends (size-1)/size of its data and receives as much, as
// a ring's reduce-scatter does, but in size-1 direct exchanges rather than around the ring.
//
// Note [Pieces of a rank-ordered reduction]
// A part longer than kPieceBytes is exchanged and reduced a piece at a time: the reduction
// reads each piece right after it arrived, still in cache (a whole 8 MiB part had left it),
// the scratch holds one piece per peer instead of one part, and an allreduce passes each
// reduced piece on to the other ranks at once, while it is in cache, instead of after the
// whole part. The reduction is element-wise, so the bits do not depend on the pieces. Between
// two namespace hosts over TCP (docs/performance_comm.md) this took 4 and 16 MiB allreduces
// to 0.88x-0.90x of their time in one message; 256 KiB pieces measured the same there, and
// cost 1 MiB (two pieces of its 512 KiB parts) 1-4%, 128 KiB pieces more.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/algorithms_impl.h"

namespace loom::comm::algorithms {

using detail::at;
using detail::Chunks;
using detail::exchange;

namespace {

// Below this many bytes sent per rank ((size - 1) x the buffer), allreduce goes in one shot.
constexpr size_t kOneShotBudget = size_t{256} << 10;
// Parts longer than this go in pieces (Note [Pieces of a rank-ordered reduction]); a multiple
// of every element size. Tests may set a smaller one (set_rank_ordered_piece_bytes_for_testing).
constexpr size_t kPieceBytes = size_t{512} << 10;
std::atomic<size_t> g_piece_bytes{kPieceBytes};

double scale_for(ReduceOp op, int size) {
  return op == ReduceOp::Avg ? 1.0 / size : 1.0;
}

// The part of a rank-ordered reduction every caller shares: part(r) is the span of `input`
// that rank r reduces (offset and length in elements); this rank's reduced part lands in
// `output`. Piece by piece (Note [Pieces of a rank-ordered reduction]): step k sends the
// piece of part(rank + k) to rank + k and receives the piece of part(rank) from rank - k;
// then the piece is reduced and after_piece(offset, piece) is called with the piece's first
// element within a part and the piece length (elements; a part's last piece may be shorter,
// or empty where a part is shorter than another). Every rank walks the same pieces.
template <typename Part, typename AfterPiece>
void reduce_parts(Transport& transport, const void* input, void* output, DType type, ReduceOp op,
                  const Part& part, Deadline deadline, const AfterPiece& after_piece) {
  const kernels::cpu::ReduceKind kind = detail::reduce_kind(op, type, "rank_ordered");
  const int size = transport.size();
  const int rank = transport.rank();
  const size_t es = dtype_size(type);
  const auto [mine, length] = part(rank);
  size_t longest = 0;
  for (int r = 0; r < size; ++r)
    longest = std::max(longest, part(r).second);
  const size_t piece = g_piece_bytes.load(std::memory_order_relaxed) / es;
  const size_t slot = std::min(piece, length);
  // One slot per peer, left uninitialised: every byte is received before it is read, and
  // zeroing a large scratch per call cost a tenth of a 16 MiB allreduce over TCP.
  const auto scratch =
      std::make_unique_for_overwrite<std::byte[]>(slot * es * static_cast<size_t>(size - 1));
  std::vector<const void*> inputs(static_cast<size_t>(size));
  for (size_t offset = 0; offset < longest; offset += piece) {
    const size_t here = detail::piece_length(length, offset, piece);
    inputs[rank] = at(input, mine + offset, es);
    for (int k = 1; k < size; ++k) {
      const int dst = (rank + k) % size;
      const int src = (rank - k + size) % size;
      std::byte* from_src = scratch.get() + static_cast<size_t>(k - 1) * slot * es;
      const auto [their, their_length] = part(dst);
      exchange(transport, at(input, their + offset, es),
               detail::piece_length(their_length, offset, piece) * es, dst, from_src, here * es,
               src, deadline);
      inputs[src] = from_src;
    }
    if (here > 0) {
      kernels::cpu::reduce_inputs(type, kind, at(output, offset, es), inputs.data(),
                                  static_cast<size_t>(size), here, scale_for(op, size));
    }
    after_piece(offset, piece);
  }
}

template <typename Part>
void reduce_parts(Transport& transport, const void* input, void* output, DType type, ReduceOp op,
                  const Part& part, Deadline deadline) {
  reduce_parts(transport, input, output, type, op, part, deadline, [](size_t, size_t) {});
}

}  // namespace

void rank_ordered_allreduce(Transport& transport, const void* input, void* output, size_t count,
                            DType type, ReduceOp op, Deadline deadline) {
  detail::check_args(transport, count, input, output, "rank_ordered_allreduce");
  (void)detail::reduce_kind(op, type, "rank_ordered_allreduce");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0) return;
  const size_t es = dtype_size(type);
  if (size == 1) {
    if (output != input) std::memcpy(output, input, count * es);
    return;
  }
  if (count * es * static_cast<size_t>(size - 1) <= kOneShotBudget) {
    // One shot: every rank's part is the whole buffer, so each rank sends its buffer to every
    // other and reduces all of them itself, in rank order: one exchange per peer instead of a
    // reduce-scatter followed by an all-gather, with the same bits.
    auto whole = [&](int) { return std::pair<size_t, size_t>{0, count}; };
    reduce_parts(transport, input, output, type, op, whole, deadline);
    return;
  }
  const Chunks chunks(count, size);
  auto part = [&](int r) { return std::pair<size_t, size_t>{chunks.begin(r), chunks.size(r)}; };
  // Each reduced piece goes to every other rank at once, and theirs arrive in their chunks.
  // A piece of `input` is sent before this rank's piece of `output` at the same place is
  // written (reduce_inputs may write over one of its inputs), and the pieces received here
  // land where this rank's input was sent already, so output may be input.
  auto all_gather_piece = [&](size_t offset, size_t piece) {
    for (int k = 1; k < size; ++k) {
      const int dst = (rank + k) % size;
      const int src = (rank - k + size) % size;
      exchange(transport, at(output, chunks.begin(rank) + offset, es),
               detail::piece_length(chunks.size(rank), offset, piece) * es, dst,
               at(output, chunks.begin(src) + offset, es),
               detail::piece_length(chunks.size(src), offset, piece) * es, src, deadline);
    }
  };
  reduce_parts(transport, input, at(output, chunks.begin(rank), es), type, op, part, deadline,
               all_gather_piece);
}

void rank_ordered_allreduce(Transport& transport, void* data, size_t count, DType type, ReduceOp op,
                            Deadline deadline) {
  rank_ordered_allreduce(transport, data, data, count, type, op, deadline);
}

void rank_ordered_reduce(Transport& transport, void* data, size_t count, DType type,
                         ReduceOp op, int root, Deadline deadline) {
  detail::check_args(transport, count, data, data, "rank_ordered_reduce");
  detail::check_root(transport, root, "rank_ordered_reduce");
  (void)detail::reduce_kind(op, type, "rank_ordered_reduce");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0) return;
  const Chunks chunks(count, size);
  auto part = [&](int r) { return std::pair<size_t, size_t>{chunks.begin(r), chunks.size(r)}; };
  const size_t es = dtype_size(type);
  // Reduced beside the data: only root's data may change.
  std::vector<std::byte> reduced(chunks.size(rank) * es);
  reduce_parts(transport, data, reduced.data(), type, op, part, deadline);
  if (rank != root) {
    if (!reduced.empty()) transport.send(reduced.data(), reduced.size(), root, deadline);
    return;
  }
  std::copy(reduced.begin(), reduced.end(), at(data, chunks.begin(rank), es));
  for (int r = 0; r < size; ++r) {
    if (r != rank && chunks.size(r) > 0) {
      transport.recv(at(data, chunks.begin(r), es), chunks.size(r) * es, r, deadline);
    }
  }
}

void rank_ordered_reduce_scatter(Transport& transport, const void* input, void* output,
                                 size_t count, DType type, ReduceOp op, Deadline deadline) {
  detail::check_args(transport, count, input, output, "rank_ordered_reduce_scatter");
  (void)detail::reduce_kind(op, type, "rank_ordered_reduce_scatter");
  if (count == 0) return;
  auto part = [&](int r) { return std::pair<size_t, size_t>{static_cast<size_t>(r) * count, count}; };
  reduce_parts(transport, input, output, type, op, part, deadline);
}

void set_rank_ordered_piece_bytes_for_testing(size_t bytes) {
  if (bytes % 8 != 0) {
    tag::kCommAlgorithms.fail(
        "set_rank_ordered_piece_bytes_for_testing: ", bytes,
        " bytes is not a multiple of 8 (every element size); 0 restores the default");
  }
  g_piece_bytes.store(bytes == 0 ? kPieceBytes : bytes, std::memory_order_relaxed);
}

}  // namespace loom::comm::algorithms
