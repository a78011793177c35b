#pragma once
// Helpers shared by the store implementations (comm/store/*.cpp only; not part of the API).

#include <cstdint>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace loom::comm::detail {

// "key 'a'" or "keys 'a', 'b'" for messages.
std::string describe_keys(const std::vector<std::string>& keys);

// A value for an error message: printable ASCII kept, other bytes as \xNN, cut after 64
// characters so a large binary value does not flood the message.
std::string printable(const Bytes& value);

// The counter arithmetic behind Store::add: `current` (nullptr when the key is absent, which
// counts as 0) must hold decimal text. Returns current + delta.
// Throws loom::Error naming the key and value when the value is not an integer or the sum
// overflows int64.
int64_t add_to_counter(const std::string& key, const Bytes* current, int64_t delta);

// Now + timeout, saturating so that Duration::max() (wait forever) does not overflow.
Deadline deadline_in(Duration timeout);

// Throws loom::CommError "[comm/store] <where>: key 'k' did not appear within 30 s".
[[noreturn]] void throw_wait_timeout(const std::string& where,
                                     const std::vector<std::string>& missing, Duration timeout);

}  // namespace loom::comm::detail
