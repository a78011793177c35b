#pragma once
// Generic collectives written once against the point-to-point Transport (Gloo's
// allreduce.cc idea): a backend that can send and receive bytes gets all of them
// (comm/transport_backend.h). The tests keep further reference algorithms (ring and
// halving-doubling allreduce, ring reduce-scatter, tree reduce, an in-process transport) in
// tests/comm/reference_algorithms/.
//
// Common contract of every function here:
//  - Collective: every rank of `transport` calls it with the same count, type, op and root,
//    and the same sequence of collectives. Blocks until this rank's part is done.
//  - Buffers are host memory owned by the caller; nothing is kept after return. `count` is
//    in elements of `type`. count 0 is a no-op that sends nothing.
//  - Misuse (Avg on an integer type, root out of range, null buffer with count > 0) throws
//    loom::Error before anything is sent. A peer that fails or does not answer before
//    `deadline` surfaces as the transport's loom::CommError naming that peer; the buffers
//    are then unspecified and the transport must be rebuilt.
//  - Avg is Sum followed by a multiplication by 1/size (floating types only).
//
// Note [Rounding of bf16/f16 reductions]
// The algorithms combine two buffers at a time with kernels::cpu::reduce_into, which rounds
// bf16/f16 to the storage type after every step. A sum over W ranks is therefore rounded
// W-1 times (reduce_inputs rounds once), so it can differ from a single-rounding reference
// by a few ulps, and the order of combination differs between algorithms. Every rank still
// gets bitwise the same allreduce result: each element is reduced on one rank and then
// copied. f32/f64 are rounded per step by IEEE arithmetic anyway; integers are exact
// (wrapping on overflow).

#include <cstddef>

#include "comm/algorithms/transport.h"
#include "comm/error.h"
#include "comm/reduce_op.h"
#include "kernels/cpu/reduce_ops.h"

namespace loom::comm::algorithms {

// output[size * count] = every rank's input[count], concatenated in rank order. In place
// when input == output + rank * count; otherwise the two must not overlap.
void ring_all_gather(Transport& transport, const void* input, void* output, size_t count,
                     DType type, Deadline deadline);

// Rank-ordered reductions (Note [Rank-ordered reductions] in rank_ordered.cpp): every
// element is reduced by one rank from all ranks' values in rank order 0, 1, ..., size-1, with
// reduce_inputs (f32 accumulation for bf16/f16, Avg as a scale before the one rounding), so
// the result is bitwise the shm backend's, whatever the count or how a buffer is split into
// calls. Direct exchanges: each rank sends every other rank its part at once (size-1 steps
// of send_recv), which suits the few ranks of a host or a small group of hosts.

// data[0, count) on every rank becomes the reduction of every rank's data. Small buffers
// ((size - 1) x the buffer at most 256 KiB) in one shot: every rank sends its buffer to every
// other and reduces all of them (one exchange per peer; scratch: size-1 buffers). Larger
// ones: rank-ordered reduce-scatter of `size` chunks (sizes differ by at most one), then
// each rank sends its reduced chunk to every other (scratch: size-1 chunks). Same bits.
void rank_ordered_allreduce(Transport& transport, void* data, size_t count, DType type,
                            ReduceOp op, Deadline deadline);
// The same out of place: output[0, count) becomes the reduction of every rank's
// input[0, count), bitwise the in-place result; input is left unchanged. output may be input
// (in place); otherwise the two must not overlap. No copy of input is made first.
void rank_ordered_allreduce(Transport& transport, const void* input, void* output, size_t count,
                            DType type, ReduceOp op, Deadline deadline);

// output[count] = slice `rank` of the reduction of every rank's input[size * count], in rank
// order; input is left unchanged. In place when output == input + rank * count; otherwise
// the two must not overlap. Scratch: size-1 slices.
void rank_ordered_reduce_scatter(Transport& transport, const void* input, void* output,
                                 size_t count, DType type, ReduceOp op, Deadline deadline);

// data[0, count) on root becomes the rank-ordered reduction of every rank's data
// (reduce-scatter as above, then every rank sends its reduced chunk to root); other ranks'
// data is left unchanged. Scratch: size chunks.
void rank_ordered_reduce(Transport& transport, void* data, size_t count, DType type,
                         ReduceOp op, int root, Deadline deadline);

// The piece the rank-ordered reductions cut long parts into (Note [Pieces of a rank-ordered
// reduction]; 512 KiB), for this process; 0 restores it. Tests use a small piece to walk
// parts of several pieces without megabytes per rank. A multiple of 8 bytes.
void set_rank_ordered_piece_bytes_for_testing(size_t bytes);

// Slice j of this rank's input[size * count] goes to rank j, which stores it as slice `rank`
// of its output[size * count]; size-1 direct exchanges. input and output must not overlap.
void pairwise_all_to_all(Transport& transport, const void* input, void* output, size_t count,
                         DType type, Deadline deadline);

// Returns once every rank has entered it: ceil(log2(size)) rounds of one-byte exchanges with
// the ranks 1, 2, 4, ... away.
void dissemination_barrier(Transport& transport, Deadline deadline);

// data[0, count) on every rank becomes root's data, along a binomial tree (log2(size)
// rounds; each rank receives once).
void tree_broadcast(Transport& transport, void* data, size_t count, DType type, int root,
                    Deadline deadline);

}  // namespace loom::comm::algorithms
