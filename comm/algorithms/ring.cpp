// Ring all-gather (the ring allreduce and reduce-scatter, which no backend uses, are the
// tests' reference algorithms: tests/comm/reference_algorithms/). Rank r sends to r+1 and
// receives from r-1 at every step, so each link carries 1/size of the data per step and all
// links are busy at once.

#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/algorithms_impl.h"

namespace loom::comm::algorithms {

using detail::at;
using detail::Chunks;
using detail::exchange;
using detail::wrap;
using kernels::cpu::ReduceKind;

void ring_all_gather(Transport& transport, const void* input, void* output, size_t count,
                     DType type, Deadline deadline) {
  detail::check_args(transport, count, input, output, "ring_all_gather");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0) return;

  const size_t es = dtype_size(type);
  const size_t bytes = count * es;
  std::byte* mine = at(output, static_cast<size_t>(rank) * count, es);
  if (mine != input) std::memcpy(mine, input, bytes);

  const int right = wrap(rank + 1, size);
  const int left = wrap(rank - 1, size);
  // At step s pass on block rank-s (own block first), receive block rank-s-1.
  for (int s = 0; s < size - 1; ++s) {
    const auto send_block = static_cast<size_t>(wrap(rank - s, size));
    const auto recv_block = static_cast<size_t>(wrap(rank - s - 1, size));
    transport.send_recv(at(output, send_block * count, es), bytes, right,
                        at(output, recv_block * count, es), bytes, left, deadline);
  }
}


}  // namespace loom::comm::algorithms
