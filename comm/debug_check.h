#pragma once
// LOOM_DEBUG=detail: before each collective every rank publishes what it is about to run and
// compares it with every other rank's, so a mismatch (a different op, count, dtype, reduce
// op or root) is reported with both views instead of hanging or corrupting memory.

#include <cstdint>
#include <string>

#include "comm/store/store.h"

namespace loom::comm {

// Throws loom::CommError naming this rank's signature and the first differing rank's.
void check_same_collective(Store& store, const std::string& group, int rank, int size, uint64_t seq,
                           const std::string& signature, Duration timeout);

}  // namespace loom::comm
