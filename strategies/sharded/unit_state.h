#pragma once
// What the sharding engine keeps per unit (engine.h), shared by its two source files:
// engine.cpp (units, gathers, reductions, whole-model I/O) and engine_step.cpp (the shard the
// optimizer steps: adoption, NVMe sub-groups, norms, the update's aftermath).

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "strategies/sharded/flat_param.h"

namespace loom::strategies::sharded {

struct UnitState {
  std::vector<FlatParam> flats;  // one per dtype, in order of first appearance
  size_t pending = 0;            // parameters whose gradient is not ready in this backward
  size_t param_count = 0;
  bool grads_stale = false;      // stages 0-1: full_grad holds the previous step's values
};

// Elements [begin, begin + length) of a 1-D tensor, as a view.
inline Tensor slice(const Tensor& flat, int64_t begin, int64_t length) {
  return Tensor::make_view(flat, {length}, {1}, flat.offset() + begin);
}

// The part of parameter `position` (of `numel` elements) of `flat` inside this rank's
// shard: elements [begin, end) of the flat buffer (begin >= end: none of it).
inline std::pair<int64_t, int64_t> shard_part(const FlatParam& flat, size_t position,
                                              int64_t numel) {
  return {std::max(flat.offsets[position], flat.shard_begin),
          std::min(flat.offsets[position] + numel, flat.shard_begin + flat.shard_numel)};
}

}  // namespace loom::strategies::sharded
