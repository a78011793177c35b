// Binomial-tree reduce, rooted anywhere: a reference algorithm for the tests (reduce on every
// backend is rank-ordered). Ranks are renumbered relative to the root (v = rank - root mod
// size), and v's parent is v with its lowest set bit cleared.

#include <vector>

#include "comm/algorithms/algorithms_impl.h"
#include "reference_algorithms/reference_algorithms.h"

namespace loom::comm::algorithms {

using kernels::cpu::ReduceKind;

void tree_reduce(Transport& transport, void* data, size_t count, DType type, ReduceOp op,
                 int root, Deadline deadline) {
  const ReduceKind kind = detail::reduce_kind(op, type, "tree_reduce");
  detail::check_args(transport, count, data, data, "tree_reduce");
  detail::check_root(transport, root, "tree_reduce");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0 || size == 1) return;

  const size_t bytes = count * dtype_size(type);
  const int v = (rank - root + size) % size;
  const auto real = [&](int relative) { return (relative + root) % size; };

  // The root reduces in place; an inner rank into a copy, so that its data stays unchanged;
  // a leaf sends its data as it is.
  void* accumulator = data;
  std::vector<std::byte> copy;
  std::vector<std::byte> incoming;
  // Children v + 1, v + 2, v + 4, ... below v's lowest set bit (smallest subtree first: it
  // finishes first), then send the partial result to the parent.
  for (int mask = 1; mask < size; mask <<= 1) {
    if (v & mask) {
      transport.send(accumulator, bytes, real(v - mask), deadline);
      break;
    }
    if (v + mask >= size) continue;
    if (incoming.empty()) {
      incoming.resize(bytes);
      if (rank != root) {
        copy.assign(static_cast<const std::byte*>(data),
                    static_cast<const std::byte*>(data) + bytes);
        accumulator = copy.data();
      }
    }
    transport.recv(incoming.data(), bytes, real(v + mask), deadline);
    kernels::cpu::reduce_into(type, kind, accumulator, incoming.data(), count);
  }
  if (rank == root) detail::finish_avg(op, type, data, count, size);
}

}  // namespace loom::comm::algorithms
