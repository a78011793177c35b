#pragma once
// Spinning on a memory location: cpu_relax() is the hint to the core (x86 `pause`: it saves
// power and lets the sibling hyperthread run; a no-op elsewhere), and kSpinBeforeYielding how
// long a backend's wait spins before it starts yielding the core.

#include <chrono>

namespace loom::comm {

// A wait between ranks on cores of their own ends well under a microsecond; where ranks
// outnumber cores, the peer awaited may need this core, and every microsecond spun is one it
// does not get. Spun by the clock, not by a count: a `pause` lasts 24 ns on this machine's
// Zen 4 and a few on other cores (the shm backend's 4000 of them spun 95 us here). 2 ms in
// the ucx backend made a 16 MiB allreduce of 2 ranks on each of two namespace hosts (4 ranks
// on 2 cores) take 4x as long (docs/performance_comm.md, 2026-11-28 "yielding" and
// 2026-11-29 "spinning by time"). Used by comm/shm/peer_wait.h, comm/ucx/ucx_backend.cpp and
// comm/tcp/tcp_backend.cpp.
inline constexpr auto kSpinBeforeYielding = std::chrono::microseconds(20);

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace loom::comm
