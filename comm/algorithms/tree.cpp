// Binomial-tree broadcast and reduce, rooted anywhere: ranks are renumbered relative to the
// root (v = rank - root mod size), and v's parent is v with its lowest set bit cleared.
// log2(size) rounds; suited to small messages (each rank moves the whole buffer).

#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/algorithms_impl.h"

namespace loom::comm::algorithms {

using kernels::cpu::ReduceKind;

void tree_broadcast(Transport& transport, void* data, size_t count, DType type, int root,
                    Deadline deadline) {
  detail::check_args(transport, count, data, data, "tree_broadcast");
  detail::check_root(transport, root, "tree_broadcast");
  const int size = transport.size();
  if (count == 0 || size == 1) return;

  const size_t bytes = count * dtype_size(type);
  const int v = (transport.rank() - root + size) % size;
  const auto real = [&](int relative) { return (relative + root) % size; };

  // Receive once from the parent; afterwards `mask` is v's lowest set bit (or >= size on
  // the root), and the children are v + m for every power of two m below it.
  int mask = 1;
  while (mask < size) {
    if (v & mask) {
      transport.recv(data, bytes, real(v - mask), deadline);
      break;
    }
    mask <<= 1;
  }
  // Largest subtree first: it has the most forwarding left to do.
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < size) transport.send(data, bytes, real(v + mask), deadline);
  }
}

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
