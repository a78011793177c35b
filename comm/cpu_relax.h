#pragma once
// A hint to the core that the thread is spinning on a memory location (x86 `pause`): it
// saves power and lets the sibling hyperthread run. A no-op elsewhere.

namespace loom::comm {

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace loom::comm
