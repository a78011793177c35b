#include "core/registry.h"

#include <algorithm>
#include <cstdint>

namespace loom {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

void fail_unknown_name(const Tag& component, const std::string& kind, const std::string& name,
                       const std::vector<std::string>& known) {
  std::string list;
  for (const std::string& n : known)
    list += (list.empty() ? "" : ", ") + n;
  component.fail("unknown ", kind, " '", name, "'; did you mean '", closest_name(name, known),
                 "'? Available: ", list);
}

}  // namespace loom
