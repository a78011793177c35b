#pragma once
// loom-perf --np N: a minimal built-in launcher, so that a benchmark needs no loomrun.
// The launching process serves the TCP store (on 127.0.0.1, a free port, a fresh secret),
// then starts N copies of this program (/proc/self/exe, same arguments minus --np) with
// the torchrun-style variables loomrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, LOOM_STORE_SECRET,
// LOOM_STORE_SERVED_BY_LAUNCHER=1), and waits for them. When one rank fails, the others
// are stopped (SIGTERM, then SIGKILL after 5 s). Single host only; use loomrun for more.
// With `bind_cores`, rank r is pinned to the (r mod n)-th of the n CPUs this process may
// use, as Open MPI binds ranks to cores by default for up to 2 ranks.

#include <string>

namespace loom::perf {

// Blocks until every rank exited. Returns 0 when all succeeded, else the first failing
// rank's exit code (128 + signal for a signal). `command` is reported by the ranks.
int launch_ranks(int np, bool bind_cores, int argc, char** argv, const std::string& command);

}  // namespace loom::perf
