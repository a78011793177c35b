#pragma once
// Reference collectives over the point-to-point Transport that no backend uses (the library's
// reductions are rank-ordered: comm/algorithms/algorithms.h, whose common contract these keep
// too): the tests compare them with the backends and with each other.

#include <cstddef>

#include "comm/algorithms/algorithms.h"

namespace loom::comm::algorithms {

// data[0, count) on every rank becomes the reduction of every rank's data. Reduce-scatter
// then all-gather around the ring, in `size` chunks (sizes differ by at most one element);
// bandwidth-optimal, 2(size-1) steps. Scratch: one chunk.
void ring_allreduce(Transport& transport, void* data, size_t count, DType type, ReduceOp op,
                    Deadline deadline);

// Same result as ring_allreduce, by recursive halving (reduce-scatter) then recursive
// doubling (all-gather): 2 log2(p) steps for p = largest power of two <= size. With a
// non-power-of-two size the first 2(size-p) ranks fold in pairs before and after.
// Scratch: half the buffer.
void halving_doubling_allreduce(Transport& transport, void* data, size_t count, DType type,
                                ReduceOp op, Deadline deadline);

// output[count] = slice `rank` of the reduction of every rank's input[size * count]; input
// is left unchanged. In place when output == input + rank * count; otherwise the two must
// not overlap. Scratch: two slices.
void ring_reduce_scatter(Transport& transport, const void* input, void* output, size_t count,
                         DType type, ReduceOp op, Deadline deadline);

// data[0, count) on root becomes the reduction of every rank's data, along a binomial tree;
// other ranks' data is left unchanged. Scratch: up to two buffers on inner ranks.
void tree_reduce(Transport& transport, void* data, size_t count, DType type, ReduceOp op,
                 int root, Deadline deadline);

}  // namespace loom::comm::algorithms
