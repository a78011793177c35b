// Binomial-tree broadcast, rooted anywhere (the tree reduce is a reference algorithm of the
// tests: tests/comm/reference_algorithms/): ranks are renumbered relative to the
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

}  // namespace loom::comm::algorithms
