#pragma once
#pragma GCC system_header  // for #include_next
// The CUDA runtime header as an emulated kernel source sees it: NVIDIA's own (types, the
// host API, the bf16/f16 conversions, which are written for the host too), followed by the
// device built-ins the emulator provides.
#include_next <cuda_runtime.h>

#include "loom_emulation/device.h"
