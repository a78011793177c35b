// The ring allreduce (reduce-scatter + all-gather) and reduce-scatter: reference algorithms
// for the tests (no backend uses them; the library's reductions are rank-ordered). Rank r
// sends to r+1 and receives from r-1 at every step.

#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms_impl.h"
#include "reference_algorithms/reference_algorithms.h"

namespace loom::comm::algorithms {

using detail::at;
using detail::Chunks;
using detail::exchange;
using detail::wrap;
using kernels::cpu::ReduceKind;

void ring_allreduce(Transport& transport, void* data, size_t count, DType type, ReduceOp op,
                    Deadline deadline) {
  const ReduceKind kind = detail::reduce_kind(op, type, "ring_allreduce");
  detail::check_args(transport, count, data, data, "ring_allreduce");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0 || size == 1) return;

  const size_t es = dtype_size(type);
  const Chunks chunks(count, size);
  const int right = wrap(rank + 1, size);
  const int left = wrap(rank - 1, size);
  std::vector<std::byte> incoming(chunks.size(0) * es);  // chunk 0 is a longest one

  // Reduce-scatter: at step s pass on the partial reduction of chunk rank-s and fold this
  // rank's contribution into chunk rank-s-1 arriving from the left.
  for (int s = 0; s < size - 1; ++s) {
    const int send_chunk = wrap(rank - s, size);
    const int recv_chunk = wrap(rank - s - 1, size);
    exchange(transport, at(data, chunks.begin(send_chunk), es), chunks.size(send_chunk) * es, right,
             incoming.data(), chunks.size(recv_chunk) * es, left, deadline);
    kernels::cpu::reduce_into(type, kind, at(data, chunks.begin(recv_chunk), es), incoming.data(),
                              chunks.size(recv_chunk));
  }

  // This rank now holds the complete reduction of chunk rank+1; it alone finishes Avg, so
  // every rank receives the same bits.
  const int own = wrap(rank + 1, size);
  detail::finish_avg(op, type, at(data, chunks.begin(own), es), chunks.size(own), size);

  // All-gather: pass on the chunk completed last, receive the next one in place.
  for (int s = 0; s < size - 1; ++s) {
    const int send_chunk = wrap(rank + 1 - s, size);
    const int recv_chunk = wrap(rank - s, size);
    exchange(transport, at(data, chunks.begin(send_chunk), es), chunks.size(send_chunk) * es, right,
             at(data, chunks.begin(recv_chunk), es), chunks.size(recv_chunk) * es, left, deadline);
  }
}

void ring_reduce_scatter(Transport& transport, const void* input, void* output, size_t count,
                         DType type, ReduceOp op, Deadline deadline) {
  const ReduceKind kind = detail::reduce_kind(op, type, "ring_reduce_scatter");
  detail::check_args(transport, count, input, output, "ring_reduce_scatter");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0) return;

  const size_t es = dtype_size(type);
  const size_t bytes = count * es;
  if (size == 1) {
    if (output != input) std::memcpy(output, input, bytes);
    return;
  }

  const int right = wrap(rank + 1, size);
  const int left = wrap(rank - 1, size);
  // Partial reductions ping-pong between two scratch slices: the one received last is sent
  // on while the next one arrives. `input` is only read, so in-place output is safe.
  std::vector<std::byte> scratch(2 * bytes);
  const void* outgoing = at(input, static_cast<size_t>(wrap(rank - 1, size)) * count, es);
  std::byte* incoming = nullptr;
  // At step s send the partial of block rank-s-1, receive the partial of block rank-s-2
  // and add this rank's slice of it; the last step completes block rank.
  for (int s = 0; s < size - 1; ++s) {
    const auto recv_block = static_cast<size_t>(wrap(rank - s - 2, size));
    incoming = scratch.data() + (s % 2) * bytes;
    transport.send_recv(outgoing, bytes, right, incoming, bytes, left, deadline);
    kernels::cpu::reduce_into(type, kind, incoming, at(input, recv_block * count, es), count);
    outgoing = incoming;
  }
  std::memcpy(output, incoming, bytes);
  detail::finish_avg(op, type, output, count, size);
}

}  // namespace loom::comm::algorithms
