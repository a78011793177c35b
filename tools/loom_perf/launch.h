#pragma once
// loom-perf --np N: a minimal built-in launcher, so that a benchmark needs no loomrun.
// The launching process serves the TCP store (on 127.0.0.1, a free port, a fresh secret),
// then starts N copies of this program (/proc/self/exe, same arguments minus --np) with
// the torchrun-style variables loomrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, LOOM_STORE_SECRET,
// LOOM_STORE_SERVED_BY_LAUNCHER=1, LOOM_JOB_ID), and waits for them. When one rank fails,
// the others are stopped (SIGTERM, then SIGKILL after 5 s); a rank then found killed by a
// signal the launcher did not send is named too (it is most likely the cause), and the
// job's shared-memory segments that killed ranks left are removed. Single host only; use
// loomrun for more.
// With `bind_cores`, rank r is pinned to the (r mod n)-th of the n CPUs this process may
// use, as Open MPI binds ranks to cores by default for up to 2 ranks.

#include <exception>
#include <string>

namespace loom::perf {

// Blocks until every rank exited. Returns 0 when all succeeded, else the first failing
// rank's exit code (128 + signal for a signal; a signal death reaped later wins over an
// error exit). `command` is reported by the ranks.
int launch_ranks(int np, bool bind_cores, int argc, char** argv, const std::string& command);

// "<tool>: rank <RANK or 0>: <what>" on stderr in one write, so that the lines of ranks
// sharing the terminal do not interleave.
void report_rank_error(const char* tool, const std::exception& error);

}  // namespace loom::perf
