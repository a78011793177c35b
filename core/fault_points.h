#pragma once
// Named points where a test can make the code under test crash or see an I/O error, so that
// crash safety is proven at every step of a write instead of left to a randomly timed kill
// (Note [Fault points]).
//
// Note [Fault points]
// Code that writes what must survive a crash (atomic files, checkpoint directories, the NVMe
// swap) calls fault::at("name") at each step that matters: after the data is written, before
// an fsync, between a rename and the marker that commits it. In an ordinary run no hook is
// installed and at() returns 0 at the cost of one relaxed atomic load (and nothing at all in a
// build with LOOM_FAULT_POINTS=OFF, the default of builds without tests). A test installs a
// hook (tests/fault/inject.cpp, linked into test programs only; no variable of the
// library's reads it): the hook may end the process at once, as SIGKILL would, or return an
// errno that the code at the point then treats exactly as the failing system call's. The
// points are listed in kFaultPoints so that a test can walk every one (tests/fault/).

#include <string_view>

namespace loom::fault {

// Every point's name, in the order a save reaches them (docs/reliability.md, "Fault points").
inline constexpr std::string_view kFaultPoints[] = {
    "file.write",            // an atomic file's data: an error here is the write's
    "file.before_fsync",     // the data written, not yet durable
    "file.before_rename",    // durable under its temporary name
    "file.after_rename",     // in place, its directory not yet fsynced
    "checkpoint.staged",     // a step's staging directory made, nothing written
    "checkpoint.before_rename",     // every file of the step fsynced, not yet renamed
    "checkpoint.before_committed",  // renamed to step-N, no COMMITTED marker yet
    "checkpoint.committed",  // COMMITTED written and fsynced, older steps not yet pruned
    "nvme.ring",             // the swap file's io_uring being set up (an error: pread/pwrite)
    "nvme.write",            // a sub-group's optimizer state going out to the swap file
    "nvme.read",             // a sub-group's optimizer state coming back
};

// What a hook returns: 0 to go on, or an errno the code at the point fails with.
using Hook = int (*)(std::string_view point);

#if LOOM_FAULT_POINTS
// The installed hook's answer for `point` (0 without a hook). Thread-safe.
int at(std::string_view point) noexcept;
// Installs `hook` (nullptr removes it). For tests only.
void set_hook(Hook hook) noexcept;
#else
inline int at(std::string_view) noexcept { return 0; }
inline void set_hook(Hook) noexcept {}
#endif

}  // namespace loom::fault
