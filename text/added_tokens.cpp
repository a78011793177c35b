#include "text/added_tokens.h"

#include <algorithm>

namespace loom::text {

AddedTokens::AddedTokens(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  raw_.nodes.emplace_back();
  normalized_.nodes.emplace_back();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    Trie& trie = tokens_[i].normalized ? normalized_ : raw_;
    insert(trie, tokens_[i].content, static_cast<int32_t>(i));
  }
}

void AddedTokens::insert(Trie& trie, const std::string& content, int32_t token) {
  uint32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    auto& children = trie.nodes[node].children;
    const auto it =
        std::lower_bound(children.begin(), children.end(), byte,
                         [](const auto& child, unsigned char b) { return child.first < b; });
    if (it != children.end() && it->first == byte) {
      node = it->second;
    } else {
      const auto child = static_cast<uint32_t>(trie.nodes.size());
      children.insert(it, {byte, child});
      trie.nodes.emplace_back();  // after the insert: it invalidates `children`
      node = child;
    }
  }
  trie.nodes[node].token = token;
  trie.starts[static_cast<unsigned char>(content[0])] = true;
}

void AddedTokens::split_pass(const Trie& trie, std::string_view text, bool match_special,
                             std::vector<Segment>& out) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t text_begin = 0;  // where the current text segment began
  size_t i = 0;
  while (i < n) {
    if (!trie.starts[bytes[i]]) {
      ++i;
      continue;
    }
    // The longest token that starts at i.
    uint32_t node = 0;
    int32_t found = -1;
    size_t found_end = 0;
    for (size_t j = i; j < n; ++j) {
      const auto& children = trie.nodes[node].children;
      const auto it =
          std::lower_bound(children.begin(), children.end(), bytes[j],
                           [](const auto& child, unsigned char b) { return child.first < b; });
      if (it == children.end() || it->first != bytes[j]) break;
      node = it->second;
      if (trie.nodes[node].token >= 0) {
        found = trie.nodes[node].token;
        found_end = j + 1;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(found)];
    if (token.special && !match_special) {
      i = found_end;  // stays text, and is not searched again
      continue;
    }
    if (text_begin < i) out.push_back({text.substr(text_begin, i - text_begin)});
    out.push_back({text.substr(i, found_end - i), token.id});
    i = text_begin = found_end;
  }
  if (text_begin < n) out.push_back({text.substr(text_begin)});
}

void AddedTokens::split(std::string_view text, bool match_special,
                        std::vector<Segment>& out) const {
  out.clear();
  if (raw_.nodes.size() > 1) {
    split_pass(raw_, text, match_special, out);
  } else if (!text.empty()) {
    out.push_back({text});
  }
  if (normalized_.nodes.size() == 1) return;
  std::vector<Segment> first;
  first.swap(out);
  for (const Segment& segment : first) {
    if (segment.token == Segment::kText) {
      split_pass(normalized_, segment.text, match_special, out);
    } else {
      out.push_back(segment);
    }
  }
}

}  // namespace loom::text
