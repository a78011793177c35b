// Byte helpers, PrefixStore, and the helpers every store implementation shares.

#include "comm/store/store.h"

#include <charconv>
#include <cstdio>
#include <utility>

#include "comm/store/store_impl.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::comm {

Bytes to_bytes(const std::string& text) {
  return Bytes(text.begin(), text.end());
}

std::string to_string(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) tag::kCommStore.fail("PrefixStore '", prefix_, "': expected a base store, got null");
}

std::vector<std::string> PrefixStore::keys_of(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys)
    out.push_back(key_of(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(key_of(key), value);
}

Bytes PrefixStore::get(const std::string& key, Duration timeout) {
  return base_->get(key_of(key), timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(key_of(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(key_of(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base_->wait(keys_of(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(keys_of(keys));
}

bool PrefixStore::remove(const std::string& key) {
  return base_->remove(key_of(key));
}

namespace detail {

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string out = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  return out;
}

std::string printable(const Bytes& value) {
  constexpr size_t kMaxShown = 64;
  std::string out;
  for (size_t i = 0; i < value.size() && i < kMaxShown; ++i) {
    const uint8_t c = value[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    }
  }
  if (value.size() > kMaxShown) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

int64_t add_to_counter(const std::string& key, const Bytes* current, int64_t delta) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* begin = reinterpret_cast<const char*>(current->data());
    const char* end = begin + current->size();
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (current->empty() || ec != std::errc() || ptr != end) {
      tag::kCommStore.fail("add on key '", key, "': expected a decimal integer value, got '",
                           printable(*current), "'");
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    tag::kCommStore.fail("add on key '", key, "': ", value, " + ", delta, " overflows int64");
  }
  return sum;
}

Deadline deadline_in(Duration timeout) {
  const Deadline now = Clock::now();
  if (timeout <= Duration::zero()) return now;
  if (std::chrono::duration_cast<Duration>(Deadline::max() - now) <= timeout) {
    return Deadline::max();
  }
  return now + timeout;
}

void throw_wait_timeout(const std::string& where, const std::vector<std::string>& missing,
                        Duration timeout) {
  throw CommError(tag::kCommStore.prefix() + where + ": " + describe_keys(missing) +
                  " did not appear within " + duration_str(timeout));
}

}  // namespace detail
}  // namespace loom::comm
