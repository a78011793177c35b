#pragma once
// NamedRegistry: things made by name, each with a factory and a one-line description. Loom's
// strategies, communication backends and DDP communication hooks are each one, so they share
// one verb set and one message for an unknown name:
//   [strategy] unknown strategy 'ddpp'; did you mean 'ddp'? Available: ddp, dp, fsdp, ...
// Thread-safe: every verb takes the registry's lock, and `at` returns a copy of the entry, so
// a factory runs without the lock (it may itself use the registry).
//
// Entry is a struct with a `factory` (testable as bool: empty is refused) and a
// `description`; it may carry more (a strategy's option defaults).

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace loom {

// The candidate closest to `name` by edit distance (ties: the first), for "did you mean".
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);

// Throws loom::Error: "[component] unknown kind 'name'; did you mean 'x'? Available: a, b".
// `known` is listed in the order given.
[[noreturn]] void fail_unknown_name(const Tag& component, const std::string& kind,
                                    const std::string& name, const std::vector<std::string>& known);

template <typename Entry>
class NamedRegistry {
 public:
  // `component` tags messages (tag::kComm), `kind` names what is registered ("backend");
  // `reserved` names are accepted elsewhere (a backend's "auto"): they cannot be registered
  // and are listed, after the registered names, when a name is unknown.
  NamedRegistry(Tag component, std::string kind, std::vector<std::string> reserved = {})
      : component_(component), kind_(std::move(kind)), reserved_(std::move(reserved)) {}

  // Throws loom::Error for an empty or reserved name, an empty factory, or a name taken.
  void add(const std::string& name, Entry entry) {
    if (name.empty()) component_.fail("cannot register a ", kind_, " with an empty name");
    for (const std::string& r : reserved_) {
      if (name == r) component_.fail("'", name, "' is reserved and cannot name a ", kind_);
    }
    if (!entry.factory) component_.fail("the factory of ", kind_, " '", name, "' is empty");
    std::lock_guard lock(mutex_);
    if (!entries_.emplace(name, std::move(entry)).second) {
      component_.fail("a ", kind_, " named '", name, "' is already registered");
    }
  }

  bool remove(const std::string& name) {
    std::lock_guard lock(mutex_);
    return entries_.erase(name) > 0;
  }

  bool contains(const std::string& name) const {
    std::lock_guard lock(mutex_);
    return entries_.count(name) > 0;
  }

  // A copy of the entry `name`; an unknown name is fail_unknown_name's error.
  Entry at(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      std::vector<std::string> known;
      for (const auto& [n, e] : entries_)
        known.push_back(n);
      known.insert(known.end(), reserved_.begin(), reserved_.end());
      fail_unknown_name(component_, kind_, name, known);
    }
    return it->second;
  }

  // (name, description) of every entry, sorted by name.
  std::vector<std::pair<std::string, std::string>> list() const {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [name, entry] : entries_)
      out.emplace_back(name, entry.description);
    return out;
  }

 private:
  const Tag component_;
  const std::string kind_;
  const std::vector<std::string> reserved_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
};

}  // namespace loom
