// Fuzzes what the TCP store's server decodes from a client (comm/store/tcp_request.h), with
// the input as the bytes a client sends on one connection: frames (u32 length + payload) cut
// as the server cuts them (frame_state, with the Hello's limit for the first frame and the
// request limit after it). The first payload goes through the authentication the server runs
// (decode_hello, then hello_proof and proofs_equal of tcp_auth.h against a fixed secret and
// nonce); every later one through decode_request, and the requests are served the way the
// server serves them where that reads client bytes again: Check walks its keys in the
// payload, Add runs the counter arithmetic on the value an earlier Set stored.
//
// The requests are decoded whatever the Hello's outcome (the server would have dropped the
// connection), so that a mutated Hello does not hide them from the fuzzer.
//
// Contract: the decoders never throw (malformed input is nullopt or -1, on which the server
// drops the connection); hello_proof throws loom::Error only when OpenSSL fails, which it
// must not do here; add_to_counter throws loom::Error for a value that is not a decimal
// integer or a sum that overflows int64 (the server replies Error). So add_to_counter's
// loom::Error is the only exception caught: any other, and any sanitizer report, is a finding.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>

#include "comm/store/store_impl.h"
#include "comm/store/tcp_auth.h"
#include "comm/store/tcp_protocol.h"
#include "comm/store/tcp_request.h"
#include "core/error.h"

namespace {

using namespace loom::comm;
using namespace loom::comm::tcp;

// The fixed challenge of the harness; corpus/tcp_store/ holds Hellos with the right proof.
constexpr std::string_view kSecret = "loom-fuzz-secret";
constexpr std::string_view kNonce = "0123456789abcdef0123456789abcdef";
static_assert(kNonce.size() == kNonceBytes);

void serve(std::map<std::string, Bytes>& values, Request& request) {
  if (auto* set = std::get_if<SetRequest>(&request)) {
    values[set->key] = std::move(set->value);
  } else if (auto* add = std::get_if<AddRequest>(&request)) {
    auto found = values.find(add->key);
    try {
      const int64_t sum = detail::add_to_counter(
          add->key, found == values.end() ? nullptr : &found->second, add->delta);
      values[add->key] = to_bytes(std::to_string(sum));
    } catch (const loom::Error&) {
    }
  } else if (auto* check = std::get_if<CheckRequest>(&request)) {
    while (!check->keys.at_end()) {
      const std::string_view key = *check->keys.field();  // as the server reads them
      (void)values.contains(std::string(key));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, Bytes> values;
  bool first = true;
  while (true) {
    const size_t limit = first ? kMaxHelloMessage : kMaxMessage;
    if (frame_state(data, size, limit) <= 0) break;  // dropped, or waiting for more bytes
    const size_t length = load_u32(data);
    const uint8_t* payload = data + kFrameHeader;
    if (first) {
      const auto hello = decode_hello(payload, length);  // as TCPStoreServer checks it
      (void)(hello && hello->version == kProtocolVersion &&
             proofs_equal(hello_proof(kSecret, kNonce), hello->proof));
      first = false;
    } else if (auto request = decode_request(payload, length)) {
      serve(values, *request);
    }
    data += kFrameHeader + length;
    size -= kFrameHeader + length;
  }
  return 0;
}
