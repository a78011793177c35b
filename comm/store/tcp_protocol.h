#pragma once
// The TCP store's wire format (comm/store internals; not part of the API).
//
// Every message is a frame: u32 payload length (little-endian), then the payload.
// A payload is one code byte followed by fields; a field is a u32 length and that many
// bytes; integers travel as 8-byte little-endian fields. Nothing else is ever sent, and the
// server only ever copies these byte strings into its map: it runs no code and decodes no
// objects from them.
//
// A connection starts with the client's Hello {version, secret}. The server compares the
// secret in constant time; on a mismatch (or any other first message) it closes the
// connection without a reply. On success it replies Ok and serves requests one at a time:
//
//   request                               reply (status code)
//   Set        key, value                 Ok
//   Get        key, timeout ms            Ok value            | Timeout missing-key
//   Add        key, delta                 Ok result           | Error message
//   CompareSet key, expected, desired     Ok stored-value
//   Wait       timeout ms, key...         Ok                  | Timeout missing-key...
//   Check      key...                     Ok 0/1
//   Remove     key                        Ok 0/1
//
// Get and Wait park on the server until their keys exist or their timeout passes, then get
// their reply; the client waits a grace period longer before it gives up on the connection.
// Frames over kMaxMessage (kMaxHelloMessage before authentication) or malformed payloads
// make the server drop the connection.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "comm/store/store.h"

namespace loom::comm::tcp {

inline constexpr uint32_t kProtocolVersion = 2;  // 2: challenge and HMAC (tcp_auth.h)
inline constexpr size_t kFrameHeader = 4;
inline constexpr size_t kMaxMessage = size_t(64) << 20;  // 64 MiB payload
inline constexpr size_t kMaxHelloMessage = 4096;         // payload before authentication

enum Command : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kRemove = 8,
  kChallenge = 9,  // server -> client, first on every connection: the nonce (tcp_auth.h)
};

enum Status : uint8_t {
  kOk = 0,
  kTimeout = 1,
  kError = 2,
};

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Builds one frame: the length prefix is filled in by frame().
class MessageWriter {
 public:
  explicit MessageWriter(uint8_t code) : data_(kFrameHeader, 0) { data_.push_back(code); }

  MessageWriter& field(std::string_view bytes) {
    put_u32(uint32_t(bytes.size()));
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  MessageWriter& field(const Bytes& bytes) {
    put_u32(uint32_t(bytes.size()));
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  MessageWriter& integer(int64_t value) {
    put_u32(8);
    for (int i = 0; i < 8; ++i)
      data_.push_back(uint8_t(uint64_t(value) >> (8 * i)));
    return *this;
  }
  size_t payload_size() const { return data_.size() - kFrameHeader; }
  // The finished frame (length prefix + payload). Callers check payload_size() against the
  // limit first; field lengths over 4 GiB are excluded by that check.
  Bytes frame() && {
    const uint32_t size = uint32_t(payload_size());
    for (int i = 0; i < 4; ++i)
      data_[i] = uint8_t(size >> (8 * i));
    return std::move(data_);
  }

 private:
  void put_u32(uint32_t v) {
    for (int i = 0; i < 4; ++i)
      data_.push_back(uint8_t(v >> (8 * i)));
  }
  Bytes data_;
};

// Reads the fields of one payload; every accessor returns nullopt on malformed input
// (a field running past the end, an integer that is not 8 bytes).
class MessageReader {
 public:
  MessageReader(const uint8_t* payload, size_t size) : data_(payload), size_(size) {
    if (size_ > 0) pos_ = 1;
  }

  // The code byte; nullopt for an empty payload.
  std::optional<uint8_t> code() const {
    if (size_ == 0) return std::nullopt;
    return data_[0];
  }
  std::optional<std::string_view> field() {
    if (size_ - pos_ < 4) return std::nullopt;
    const size_t n = load_u32(data_ + pos_);
    if (size_ - pos_ - 4 < n) return std::nullopt;
    std::string_view out(reinterpret_cast<const char*>(data_ + pos_ + 4), n);
    pos_ += 4 + n;
    return out;
  }
  std::optional<std::string> string() {
    auto f = field();
    if (!f) return std::nullopt;
    return std::string(*f);
  }
  std::optional<Bytes> bytes() {
    auto f = field();
    if (!f) return std::nullopt;
    return Bytes(f->begin(), f->end());
  }
  std::optional<int64_t> integer() {
    auto f = field();
    if (!f || f->size() != 8) return std::nullopt;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= uint64_t(uint8_t((*f)[i])) << (8 * i);
    return int64_t(v);
  }
  bool at_end() const { return pos_ == size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace loom::comm::tcp
