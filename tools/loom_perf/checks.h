#pragma once
// Closed-form inputs and expected outputs of every collective, for -c 1.
//
// Element j of rank r's input is g((3 j + 5 r + seed) mod 7) with g(m) = m + 1 (prod:
// 2 when m == 0, else 1): small integers, exact in every dtype, different on every rank
// and shifted by the seed so that a stale result from an earlier iteration does not pass.
// Every expected value is then one of 7 per output slice, so checking costs one table
// lookup per element, whatever the number of ranks.

#include <cstddef>
#include <cstdint>

#include "comm/reduce_op.h"
#include "tensor/tensor.h"
#include "tools/loom_perf/collective.h"

namespace loom::perf {

// The buffers of one measured case. In place, `input` is `output` or a slice of it.
struct CaseBuffers {
  Tensor input;
  Tensor output;
};

struct CheckSpec {
  Collective collective;
  comm::ReduceOp op;
  DType dtype;
  int rank, nranks, root;
  size_t count;     // elements of the largest buffer (nccl-tests' count column)
  size_t per_rank;  // elements of one rank's part (split collectives), else count
};

// Poisons the output, then writes this rank's input for `seed`. Only the root's input
// matters for broadcast.
void fill_case(const CheckSpec& spec, CaseBuffers& buffers, uint32_t seed);

// The number of this rank's output elements that differ from the expected values for
// `seed` (floating dtypes within a few ulps, for avg). Non-roots of reduce check nothing.
int64_t count_wrong(const CheckSpec& spec, const CaseBuffers& buffers, uint32_t seed);

}  // namespace loom::perf
