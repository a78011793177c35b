#pragma once
// Loom's environment variables (LOOM_*), each declared once here with its default and its doc
// line, exactly as README's table shows them (tests/test_tunables.cpp holds the table to
// all_tunables(), row for row). Code names a variable only through its declaration:
// tunable_value(tunables::kDebug) to read it, tunables::kJobId.name to write it for a rank or
// to name it in a message. tests/docs/tunables_documented.sh refuses a "LOOM_..." string
// literal anywhere else, so a new variable cannot bypass the table.
//
// What a value means and how a bad one is refused stay with the code that reads it. The
// variables launchers write for their ranks (loomrun, ddp_spawn, loom-perf --np) are declared
// here too, since ranks read them.
//
// A new tunable: declare it below, list it in all_tunables() (core/tunables.cpp) and give it
// README's row at the same place.

#include <span>
#include <string_view>

namespace loom {

struct Tunable {
  const char* name;               // "LOOM_DEBUG"; a C string, as getenv and setenv take one
  std::string_view default_text;  // README's default column: "unset", "set by loomrun", ...
  std::string_view doc;           // README's meaning column (Markdown, one line)
};

namespace tunables {

inline constexpr Tunable kDebug{
    "LOOM_DEBUG", "unset",
    "`detail`: before each collective, also check through the store that every rank issued the "
    "same operation (count, dtype, op, root), on every backend; the shm backend checks this "
    "always (docs/reliability.md). Any other value is refused"};
inline constexpr Tunable kStoreSecret{"LOOM_STORE_SECRET", "set by loomrun",
                                      "shared secret of the TCP store"};
inline constexpr Tunable kStorePort{
    "LOOM_STORE_PORT", "`MASTER_PORT` (`MASTER_PORT` + 1 under torchrun)",
    "port of Loom's store (1 to 65535), e.g. when another launcher's store holds `MASTER_PORT`; "
    "loomrun and `ddp_spawn` set it to the port of the store they serve"};
inline constexpr Tunable kHierarchicalNetwork{
    "LOOM_HIERARCHICAL_NETWORK", "`auto`",
    "the hierarchical backend's network between hosts: `tcp`, `ucx`, or `auto` (ucx where an "
    "RDMA device exists and the build has UCX, else tcp; docs/multihost.md)"};
inline constexpr Tunable kHostId{
    "LOOM_HOST_ID", "host name and network namespace",
    "which host a rank is on, for the hierarchical backend (ranks with the same value share a "
    "host); set it where host names do not tell hosts apart"};
inline constexpr Tunable kClusterEnv{
    "LOOM_CLUSTER_ENV", "auto",
    "force one environment source: `torchrun`, `slurm`, `openmpi`, `pmi`, `single`"};
inline constexpr Tunable kShmSliceBytes{
    "LOOM_SHM_SLICE_BYTES", "262144",
    "shm backend: per-rank share of one pipelined round (bytes, 1 to 1073741824; rounded up to "
    "64)"};
inline constexpr Tunable kShmOneShotBytes{
    "LOOM_SHM_ONE_SHOT_BYTES", "32768",
    "shm backend: largest allreduce done in one round by every rank (bytes, 1 to 1073741824; at "
    "most one staging buffer)"};
inline constexpr Tunable kShmChannelBytes{
    "LOOM_SHM_CHANNEL_BYTES", "262144",
    "shm backend: ring size of each point-to-point channel (bytes, 1 to 1073741824; rounded up "
    "to 64)"};
inline constexpr Tunable kRestartCount{
    "LOOM_RESTART_COUNT", "set by loomrun",
    "restart attempt, 0 for the first (when unset: `TORCHELASTIC_RESTART_COUNT`, else 0); each "
    "attempt's process groups use store keys of their own"};
inline constexpr Tunable kStoreServedByLauncher{
    "LOOM_STORE_SERVED_BY_LAUNCHER", "set by loomrun, `ddp_spawn` and `loom-perf --np`",
    "`1`: the launcher serves the TCP store, so rank 0 does not start one"};
inline constexpr Tunable kJobId{
    "LOOM_JOB_ID", "set by loomrun and `loom-perf --np`",
    "names the job's shared-memory segments (`/dev/shm/loom-<id>-...`), which the launcher "
    "removes after its ranks exit (a rank killed while setting up its group cannot)"};
inline constexpr Tunable kFlightRecorderDir{
    "LOOM_FLIGHT_RECORDER_DIR", "unset",
    "where ranks dump their flight recorder on a failure or SIGUSR1 (docs/checkpoints.md)"};
inline constexpr Tunable kFlightRecorder{
    "LOOM_FLIGHT_RECORDER", "1",
    "0 switches the flight recorder off (1 or 0; any other value is refused)"};
inline constexpr Tunable kCommTiming{
    "LOOM_COMM_TIMING", "unset",
    "`1`: time every communication operation with the precise clock (about 20 ns a read) for the "
    "flight recorder and `Work::started_at`/`completed_at`; unset or `0`: the coarse one (one "
    "timer tick, 1 to 4 ms). DDP's trace turns it on for its group (docs/checkpoints.md). Any "
    "other value is refused"};
inline constexpr Tunable kPerfCommand{"LOOM_PERF_COMMAND", "set by `loom-perf --np`",
                                      "the command line its ranks write into their reports"};
inline constexpr Tunable kBf16Gemm{
    "LOOM_BF16_GEMM", "unset",
    "`f32`: the CPU's bf16 matrix products widen their operands to f32 even where the CPU has "
    "AMX or AVX512_BF16 (the same numbers up to the order of the sums; for tests and "
    "comparisons). Any other value is refused"};
inline constexpr Tunable kCudaAttention{
    "LOOM_CUDA_ATTENTION", "`v3`",
    "the CUDA attention kernels for bf16 operands: `v1` (CUDA cores), `v2` (WMMA tensor cores) "
    "or `v3` (mma.sync, scores in registers); f32 always runs v1 (docs/cuda.md, \"Attention "
    "v3\"). Any other value is refused"};

}  // namespace tunables

// Every tunable above, in README order. Static storage; any thread may call it.
std::span<const Tunable> all_tunables();

// The variable's value in the process environment, nullptr when unset ("" when set empty:
// what that means is the reader's rule). Reads the environment at each call, as getenv does,
// so it must not race with a setenv on another thread.
const char* tunable_value(const Tunable& tunable);

}  // namespace loom
