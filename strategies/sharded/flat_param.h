#pragma once
// One unit's parameters of one dtype, flattened (strategies/sharded/engine.h). The flat
// buffer is padded to a multiple of the shard group's size and split evenly: rank r owns
// elements [r * shard_numel, (r + 1) * shard_numel). The unit's parameters are views into
// `full`, so a module reads them unchanged; when parameters are sharded (stage 3) `full`'s
// storage is released between uses (Note [Releasing storage] in tensor/storage.h).

#include <cstdint>
#include <vector>

#include "comm/work.h"
#include "tensor/tensor.h"

namespace loom::strategies::sharded {

struct FlatParam {
  DType dtype = DType::F32;
  std::vector<size_t> params;    // indices into the engine's parameter list
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  int64_t numel = 0;             // the parameters' elements, without padding
  int64_t shard_numel = 0;       // elements per rank
  int64_t shard_begin = 0;       // this rank's first element

  Tensor full;         // [padded] on the compute device
  Tensor shard;        // [shard_numel]: a view of full (stages 0-2) or its own storage (3)
  Tensor master;       // what the optimizer updates: shard, its host copy (offload) or, with
                       // 16-bit weights, its f32 copy (on the host under offload)
  Tensor full_grad;    // [padded]: the parameters' .grad are views into it during backward
  Tensor grad_shard;   // [shard_numel]: the reduced gradient, a view of full_grad (0-1)
  Tensor master_grad;  // grad_shard, its host copy (offload) or f32 copy (16-bit weights)
  // Mixed precision (ShardingOptions::param_dtype / reduce_dtype), undefined without it: the
  // shard in param_dtype and the buffer it is all-gathered into (released between uses), and
  // the gradients cast to reduce_dtype for their reduction (released after it).
  Tensor shard_lp, full_lp;
  Tensor full_grad_lp, grad_shard_lp;
  std::vector<size_t> nvme_segments;  // NVMe offload: the engine's segments of this shard
  int64_t shard_file_offset = -1;     // nvme_params: where `shard` lives between uses
  comm::WorkPtr gather;  // in-flight all-gather into full
  comm::WorkPtr reduce;  // in-flight reduction of full_grad
  comm::WorkPtr replicate;  // HYBRID_SHARD: in-flight allreduce of grad_shard across groups
  // When each was issued, for the trace (microseconds of the current Trace; -1 untraced).
  int64_t gather_issued_us = -1;
  int64_t reduce_issued_us = -1;

  bool gathered() const { return full.storage()->materialized(); }
  // 16-bit weights (ShardingOptions::weights_dtype): the optimizer updates an f32 master
  // that is not the 16-bit shard, and reads an f32 copy of the gradient shard.
  bool wide_master() const { return master.dtype() != dtype; }
};

}  // namespace loom::strategies::sharded
