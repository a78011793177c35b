#pragma once
// Included before anything else in every emulated kernel source and emulation test
// (-include), so that the CUDA headers keep these definitions (crt/host_defines.h defines a
// qualifier only where it is not defined yet). Kernel sources have their __shared__
// declarations rewritten (rewrite_kernel_source.cmake); a test's own kernels get a static
// array and call shared_memory_in_use() themselves.
#define __shared__ static
#define __launch_bounds__(...)
// A constant that only a __launch_bounds__ reads is unused here (clang says so).
#ifdef __clang__
#pragma clang diagnostic ignored "-Wunused-const-variable"
#endif
