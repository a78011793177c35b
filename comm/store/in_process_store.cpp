// InProcessStore: a map under one mutex; waiters sleep on a condition variable that every
// mutation notifies.

#include "comm/store/in_process_store.h"

#include "comm/store/store_impl.h"

namespace loom::comm {

namespace {
constexpr const char* kWhere = "in-process";
}  // namespace

void InProcessStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

Bytes InProcessStore::get(const std::string& key, Duration timeout) {
  std::unique_lock lock(mutex_);
  auto found = values_.end();
  const bool appeared = changed_.wait_until(lock, detail::deadline_in(timeout), [&] {
    found = values_.find(key);
    return found != values_.end();
  });
  if (!appeared) detail::throw_wait_timeout(kWhere, {key}, timeout);
  return found->second;
}

int64_t InProcessStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    auto found = values_.find(key);
    result = detail::add_to_counter(key, found == values_.end() ? nullptr : &found->second, delta);
    values_[key] = to_bytes(std::to_string(result));
  }
  changed_.notify_all();
  return result;
}

Bytes InProcessStore::compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard lock(mutex_);
    auto found = values_.find(key);
    const bool matches = found == values_.end() ? expected.empty() : found->second == expected;
    if (!matches) return found == values_.end() ? Bytes{} : found->second;
    values_[key] = desired;
    result = desired;
  }
  changed_.notify_all();
  return result;
}

void InProcessStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (!values_.contains(key)) return false;
    }
    return true;
  };
  if (changed_.wait_until(lock, detail::deadline_in(timeout), all_present)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!values_.contains(key)) missing.push_back(key);
  }
  detail::throw_wait_timeout(kWhere, missing, timeout);
}

bool InProcessStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const auto& key : keys) {
    if (!values_.contains(key)) return false;
  }
  return true;
}

bool InProcessStore::remove(const std::string& key) {
  std::lock_guard lock(mutex_);
  return values_.erase(key) > 0;
}

}  // namespace loom::comm
