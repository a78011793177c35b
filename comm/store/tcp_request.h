#pragma once
// How the TCP store's server reads what a client sends (wire format: tcp_protocol.h), apart
// from its sockets and its map, so that the decoding runs on bytes alone (tests/fuzz).
// comm/store internals; not part of the API.
//
// Nothing here throws or allocates more than the fields it copies: malformed input is
// std::nullopt (or -1 from frame_state), on which the server drops the connection.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/tcp_protocol.h"

namespace loom::comm::tcp {

// 1: `buffered` starts with a whole frame (length prefix + payload); 0: not yet; -1: the
// length prefix is invalid (0, or over `limit`).
int frame_state(const uint8_t* buffered, size_t size, size_t limit);

// A connection's first payload: Hello {version, proof}. The proof points into the payload.
struct Hello {
  int64_t version;
  std::string_view proof;
};
// nullopt unless the payload is a Hello with exactly these two fields; the caller checks the
// version and the proof (tcp_auth.h).
std::optional<Hello> decode_hello(const uint8_t* payload, size_t size);

// The requests of an authenticated connection, as the table in tcp_protocol.h lists them.
struct SetRequest {
  std::string key;
  Bytes value;
};
struct GetRequest {
  std::string key;
  int64_t timeout_ms;
};
struct AddRequest {
  std::string key;
  int64_t delta;
};
struct CompareSetRequest {
  std::string key;
  Bytes expected, desired;
};
struct WaitRequest {
  int64_t timeout_ms;
  std::vector<std::string> keys;
};
// The keys are left in the payload (a Check may carry millions): every keys.field() until
// keys.at_end() returns one, without copying it.
struct CheckRequest {
  MessageReader keys;
};
struct RemoveRequest {
  std::string key;
};
using Request = std::variant<SetRequest, GetRequest, AddRequest, CompareSetRequest, WaitRequest,
                             CheckRequest, RemoveRequest>;

// nullopt for an unknown command or malformed fields (one missing, mistyped, or left over).
std::optional<Request> decode_request(const uint8_t* payload, size_t size);

}  // namespace loom::comm::tcp
