#pragma once
// Note [Offloaded shards on the copy stream]
// Under parameter offload on a GPU (stage 3 with offload_params, FSDP's CPU offload, the NVMe
// offload of parameters), a unit's shard lives in pinned host memory and is uploaded for each
// all-gather. Prefetching issues a gather a unit or two ahead, while the compute stream still
// runs the previous unit and before the current one's kernels are queued: uploaded on the
// compute stream, the bytes of a later unit would sit between them, and the current unit's
// kernels would wait for them to cross. As ZeRO-3 and FSDP prefetch on a side stream, the
// upload and the all-gather after it go on the device's copy stream (tensor/cuda/stream.h)
// instead: the copy stream first waits (on the device) for the work queued so far on the
// current stream, since the gathered buffer is memory that stream's allocator handed out and
// its earlier kernels may still use it; then the upload is queued there, and the collective
// issued from there (Note [Issue streams]: it starts after the issuing stream's work). The
// compute stream reads the gathered buffer only after the gather's wait, which returns once
// the device has finished the collective. The stream-order check of the emulated device
// (tests/cuda_emulation/runtime/stream_order.h) follows every access of these steps.

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::strategies::sharded {

// All-gathers `shard` (host memory, one rank's part) into `full` (the unit's flat buffer, on
// the compute device): on the copy stream when `full` is on a GPU, otherwise as
// group.all_gather(full, shard.to(full.device())) does.
comm::WorkPtr all_gather_from_host(comm::ProcessGroup& group, Tensor& full, const Tensor& shard);

}  // namespace loom::strategies::sharded
