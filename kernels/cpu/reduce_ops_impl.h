#pragma once
// Internal to kernels/cpu/reduce_ops.cpp, its test and its benchmark: choosing the instruction
// set by hand. Not for use from other modules.

#include <cstddef>

namespace loom::kernels::cpu {

// Whether `isa` ("avx512", "avx2" or "scalar") can run on this machine.
bool reduce_isa_available(const char* isa);

// Makes every later reduction use `isa` ("avx512", "avx2" or "scalar"); nullptr restores the
// one detected at start-up. Throws loom::Error for an unknown name or an instruction
// set this machine lacks. Not synchronised with reductions running on other threads: call it
// between them.
void set_reduce_isa_for_testing(const char* isa);

// Makes reductions whose inputs and output together reach `bytes` use non-temporal stores
// (see Note [Streaming stores] in reduce_ops.cpp); 0 restores the default (32 MiB). Same
// threading rule as above.
void set_reduce_streaming_threshold_for_testing(size_t bytes);

}  // namespace loom::kernels::cpu
