#include "comm/store/tcp_request.h"

#include <utility>

namespace loom::comm::tcp {

int frame_state(const uint8_t* buffered, size_t size, size_t limit) {
  if (size < kFrameHeader) return 0;
  const size_t length = load_u32(buffered);
  if (length == 0 || length > limit) return -1;
  return size - kFrameHeader >= length ? 1 : 0;
}

std::optional<Hello> decode_hello(const uint8_t* payload, size_t size) {
  MessageReader in(payload, size);
  const auto code = in.code();
  const auto version = in.integer();
  const auto proof = in.field();
  if (code != kHello || !version || !proof || !in.at_end()) return std::nullopt;
  return Hello{*version, *proof};
}

std::optional<Request> decode_request(const uint8_t* payload, size_t size) {
  MessageReader in(payload, size);
  switch (in.code().value_or(0)) {
    case kSet: {
      auto key = in.string();
      auto value = in.bytes();
      if (!key || !value || !in.at_end()) break;
      return SetRequest{std::move(*key), std::move(*value)};
    }
    case kGet: {
      auto key = in.string();
      auto timeout_ms = in.integer();
      if (!key || !timeout_ms || !in.at_end()) break;
      return GetRequest{std::move(*key), *timeout_ms};
    }
    case kAdd: {
      auto key = in.string();
      auto delta = in.integer();
      if (!key || !delta || !in.at_end()) break;
      return AddRequest{std::move(*key), *delta};
    }
    case kCompareSet: {
      auto key = in.string();
      auto expected = in.bytes();
      auto desired = in.bytes();
      if (!key || !expected || !desired || !in.at_end()) break;
      return CompareSetRequest{std::move(*key), std::move(*expected), std::move(*desired)};
    }
    case kWait: {
      auto timeout_ms = in.integer();
      if (!timeout_ms) break;
      std::vector<std::string> keys;
      while (!in.at_end()) {
        auto key = in.string();
        if (!key) break;
        keys.push_back(std::move(*key));
      }
      if (!in.at_end()) break;
      return WaitRequest{*timeout_ms, std::move(keys)};
    }
    case kCheck: {
      const MessageReader keys = in;
      while (!in.at_end()) {
        if (!in.field()) break;
      }
      if (!in.at_end()) break;
      return CheckRequest{keys};
    }
    case kRemove: {
      auto key = in.string();
      if (!key || !in.at_end()) break;
      return RemoveRequest{std::move(*key)};
    }
    default: break;
  }
  return std::nullopt;
}

}  // namespace loom::comm::tcp
