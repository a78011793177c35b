#pragma once
// Note [Copies to and from pinned memory land late]
// On a GPU, cudaMemcpyAsync (or cudaMemcpy2DAsync) between device memory and page-locked host
// memory returns at once and the bytes cross when the stream reaches the copy: the host may
// read the destination, or write the source again, only after it has waited for the copy (an
// event's or the stream's synchronisation). The emulated runtime makes that visible: such a copy,
// issued to a stream (not the legacy default stream) outside a capture, runs only when something
// orders it after: the next work issued to the same stream (stream order), or any host
// synchronisation, any event or stream query, any stream's wait on an event, a graph launch, or the
// release of memory. So a host that reads an offloaded gradient before waiting for its download
// reads the bytes that were there before, and a test comparing values fails, where the copy used to
// land when issued. Every host synchronisation lands every pending copy, which can hide a missing
// wait that another wait happens to cover but never invents one.

#include <cuda_runtime_api.h>

#include <functional>

namespace loom::cuda_emulation {

// Keeps `copy` until something orders it (above).
void defer_copy(cudaStream_t stream, std::function<void()> copy);
// Runs the copies deferred on `stream`, in issue order: work issued to it comes after them.
void land_copies(cudaStream_t stream);
// Runs every deferred copy, in issue order: the host waited, or memory is released.
void land_all_copies();

}  // namespace loom::cuda_emulation
