#pragma once
// Stream capture and CUDA Graphs on the emulated device (cuda_graphs.cpp), so that Loom's
// capture logic (tensor/cuda/graph.h) is tested where there is no GPU.
//
// Note [Emulated graphs]
// Work issued to a capturing stream is recorded, not run: the kernel with its arguments as
// converted at the launch, a copy or fill with its pointers, a cuBLASLt stand-in matmul with
// its layouts. cudaGraphLaunch runs the recorded work in the order it was issued, which is a
// valid order for a one-stream capture, each entry counted in the WorkLog as it runs.
// The capture rules CUDA states for cudaThreadExchangeStreamCaptureMode hold: while a capture
// that is not relaxed is under way, the potentially unsafe calls (device and host
// allocation and release, synchronising copies, stream, event and device synchronisation,
// event and stream queries) fail with cudaErrorStreamCaptureUnsupported on the threads the
// modes name, and the capture is invalidated, so cudaStreamEndCapture then fails with
// cudaErrorStreamCaptureInvalidated, as on a GPU.
// Not emulated: a capture that spans streams (waiting on an event recorded in a capture is
// refused with cudaErrorStreamCaptureIsolation), graphs launched inside captures, and
// updating an instantiated graph.

#include <cuda_runtime_api.h>

#include <functional>

#include "work_log.h"

namespace loom::cuda_emulation {

// Issues `work` to `stream`: runs it now and records (kind, name, words) in the WorkLog, or,
// when the stream is capturing, adds it to the capture to run at each launch of its graph.
// `words` are a launch's argument words (Note [The bytes a launch's arguments name]).
// Returns the error a capture refuses the work with, else cudaSuccess.
cudaError_t submit(cudaStream_t stream, WorkKind kind, const char* name,
                   std::function<void()> work, ArgumentWords words = {});

// As submit, for a copy between device memory and page-locked host memory: outside a capture
// it runs when something orders it after (Note [Copies to and from pinned memory land late]).
cudaError_t submit_landing_late(cudaStream_t stream, const char* name, std::function<void()> copy,
                                ArgumentWords words);

// For the runtime's potentially unsafe calls: cudaErrorStreamCaptureUnsupported, with the
// captures concerned invalidated, when the calling thread may not make one now; otherwise
// cudaSuccess.
cudaError_t check_unsafe_call_allowed();

// cudaErrorStreamCaptureUnsupported when `stream` is capturing (a synchronisation or query
// of a capturing stream), else what check_unsafe_call_allowed() says.
cudaError_t check_stream_not_capturing(cudaStream_t stream);

// Marks `event` as recorded by the capture of `stream`, or as recorded outside any capture.
void note_event_record(cudaEvent_t event, cudaStream_t stream);
// What cudaStreamWaitEvent(stream, event) may do: cudaErrorStreamCaptureIsolation when the
// event was recorded in a capture (a multi-stream capture, not emulated), else cudaSuccess.
cudaError_t check_event_wait(cudaStream_t stream, cudaEvent_t event);
void forget_event(cudaEvent_t event);

}  // namespace loom::cuda_emulation
