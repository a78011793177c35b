#pragma once
// Helpers shared by the algorithm files of comm/algorithms/ (not included from elsewhere).

#include <algorithm>
#include <cstddef>
#include <string>

#include "comm/algorithms/transport.h"
#include "comm/reduce_op.h"
#include "core/error.h"
#include "core/tags.h"
#include "kernels/cpu/reduce_ops.h"

namespace loom::comm::algorithms::detail {

using kernels::cpu::ReduceKind;

// The kernel that combines two buffers for `op`; rejects Avg on integer types.
inline ReduceKind reduce_kind(ReduceOp op, DType type, const char* algorithm) {
  if (op == ReduceOp::Avg && !is_floating(type)) {
    tag::kCommAlgorithms.fail(algorithm,
                              ": ReduceOp::Avg needs a floating type (f32, f64, bf16, f16), got ",
                              dtype_name(type));
  }
  return reduce_kind_of(op);
}

// Checks shared by every algorithm (see algorithms.h: misuse throws before anything is sent).
inline void check_args(const Transport& transport, size_t count, const void* a, const void* b,
                       const char* algorithm) {
  check(transport.size() >= 1 && transport.rank() >= 0 && transport.rank() < transport.size(),
        tag::kCommAlgorithms.prefix() + algorithm + ": transport has rank " +
            std::to_string(transport.rank()) + " of size " + std::to_string(transport.size()));
  check(count == 0 || (a != nullptr && b != nullptr), tag::kCommAlgorithms.prefix() + algorithm +
                                                          ": null buffer with count " +
                                                          std::to_string(count));
}

inline void check_root(const Transport& transport, int root, const char* algorithm) {
  check(root >= 0 && root < transport.size(),
        tag::kCommAlgorithms.prefix() + algorithm + ": root " + std::to_string(root) +
            " is not a rank of a group of size " + std::to_string(transport.size()));
}

// Avg = Sum, then every element times 1/size by the rank that owns the reduced result.
inline void finish_avg(ReduceOp op, DType type, void* data, size_t count, int size) {
  if (op == ReduceOp::Avg && size > 1 && count > 0) {
    kernels::cpu::scale_inplace(type, data, count, 1.0 / size);
  }
}

// Splits `count` elements into `parts` chunks whose sizes differ by at most one (the first
// count % parts chunks are one longer). Every rank computes the same split.
class Chunks {
 public:
  Chunks(size_t count, int parts)
      : base_(count / static_cast<size_t>(parts)), extra_(count % static_cast<size_t>(parts)) {}
  // First element of chunk k; begin(parts) == count, so [begin(a), begin(b)) covers a..b-1.
  size_t begin(int k) const {
    const auto i = static_cast<size_t>(k);
    return i * base_ + std::min(i, extra_);
  }
  size_t size(int k) const { return begin(k + 1) - begin(k); }

 private:
  size_t base_;
  size_t extra_;
};

// Elements of a span of `length` that fall in the piece starting at `offset` (zero past its
// end): the pieces of spans of different lengths line up, so peers agree on every piece.
// Index of a chunk or block on a ring of `size` (k may be negative).
inline int wrap(int k, int size) {
  return ((k % size) + size) % size;
}

inline size_t piece_length(size_t length, size_t offset, size_t piece) {
  return offset < length ? std::min(piece, length - offset) : 0;
}

inline std::byte* at(void* data, size_t element, size_t element_size) {
  return static_cast<std::byte*>(data) + element * element_size;
}
inline const std::byte* at(const void* data, size_t element, size_t element_size) {
  return static_cast<const std::byte*>(data) + element * element_size;
}

// Sends and receives at once, skipping empty directions. The sizes come from a split every
// rank computes alike, so the peer skips the matching direction too; transports never see
// zero-byte messages.
inline void exchange(Transport& transport, const void* send_data, size_t send_bytes, int dst,
                     void* recv_data, size_t recv_bytes, int src, Deadline deadline) {
  if (send_bytes > 0 && recv_bytes > 0) {
    transport.send_recv(send_data, send_bytes, dst, recv_data, recv_bytes, src, deadline);
  } else if (send_bytes > 0) {
    transport.send(send_data, send_bytes, dst, deadline);
  } else if (recv_bytes > 0) {
    transport.recv(recv_data, recv_bytes, src, deadline);
  }
}

}  // namespace loom::comm::algorithms::detail
