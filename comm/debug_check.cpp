#include "comm/debug_check.h"

#include <vector>

#include "core/tags.h"

namespace loom::comm {

void check_same_collective(Store& store, const std::string& group, int rank, int size, uint64_t seq,
                           const std::string& signature, Duration timeout) {
  const std::string prefix = "debug/" + group + "/" + std::to_string(seq) + "/";
  store.set(prefix + std::to_string(rank), to_bytes(signature));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const CommError& e) {
    throw CommError(tag::kComm.prefix() + "rank " + std::to_string(rank) +
                        ": debug check of operation #" + std::to_string(seq) + " ('" + signature +
                        "'): not every rank issued an operation #" + std::to_string(seq) + ": " +
                        e.what(),
                    rank);
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::string theirs = to_string(store.get(keys[r], timeout));
    if (theirs != signature) {
      throw CommError(tag::kComm.prefix() + "rank " + std::to_string(rank) +
                          ": collective mismatch at operation #" + std::to_string(seq) +
                          " of group '" + group + "': this rank called '" + signature + "', rank " +
                          std::to_string(r) + " called '" + theirs + "'",
                      rank, r);
    }
  }
  if (store.add(prefix + "done", 1) == size) {
    for (const std::string& key : keys)
      store.remove(key);
    store.remove(prefix + "done");
  }
}

}  // namespace loom::comm
