// Direct exchanges between every pair of ranks: all-to-all and the dissemination barrier.

#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/algorithms_impl.h"

namespace loom::comm::algorithms {

using detail::at;
using detail::exchange;

void pairwise_all_to_all(Transport& transport, const void* input, void* output, size_t count,
                         DType type, Deadline deadline) {
  detail::check_args(transport, count, input, output, "pairwise_all_to_all");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0) return;
  const size_t es = dtype_size(type);
  const size_t slice = count * es;
  std::memcpy(at(output, static_cast<size_t>(rank) * count, es),
              at(input, static_cast<size_t>(rank) * count, es), slice);
  // Step k: send to the rank k ahead, receive from the rank k behind, so that every step
  // pairs each sender with a receiver that is sending too.
  for (int k = 1; k < size; ++k) {
    const int dst = (rank + k) % size;
    const int src = (rank - k + size) % size;
    exchange(transport, at(input, static_cast<size_t>(dst) * count, es), slice, dst,
             at(output, static_cast<size_t>(src) * count, es), slice, src, deadline);
  }
}

void dissemination_barrier(Transport& transport, Deadline deadline) {
  const int size = transport.size();
  const int rank = transport.rank();
  const char token = 1;
  char received = 0;
  for (int distance = 1; distance < size; distance *= 2) {
    exchange(transport, &token, 1, (rank + distance) % size, &received, 1,
             (rank - distance % size + size) % size, deadline);
  }
}

}  // namespace loom::comm::algorithms
