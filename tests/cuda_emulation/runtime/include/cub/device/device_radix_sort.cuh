#pragma once
// cub::DeviceRadixSort::SortPairs for emulated kernels: the same contract (a size query with
// a null temp pointer; a stable sort of the keys' bits [begin_bit, end_bit), values moved
// with their keys), done on the host when the stream runs it: at once, or at each launch of a
// graph that captured it. Logged as one kernel (a GPU runs several for it).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

#include "loom_emulation/device.h"
#include "stream_capture.h"

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value, typename NumItems>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const Key* keys_in, Key* keys_out,
                               const Value* values_in, Value* values_out, NumItems count,
                               int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_unsigned_v<Key>, "the emulated SortPairs takes unsigned keys");
    // Ask for as much as a real sort would (one extra copy of keys and values), so that a
    // caller that reserves too little is caught here too.
    const size_t needed = static_cast<size_t>(count) * (sizeof(Key) + sizeof(Value)) + 256;
    if (temp == nullptr) {
      temp_bytes = needed;
      return cudaSuccess;
    }
    if (temp_bytes < needed || count < 0 || begin_bit < 0 || end_bit > int(sizeof(Key) * 8) ||
        begin_bit > end_bit)
      return cudaErrorInvalidValue;
    const Key bits = end_bit - begin_bit >= int(sizeof(Key) * 8)
                         ? static_cast<Key>(~Key{0})
                         : static_cast<Key>(((Key{1} << (end_bit - begin_bit)) - 1) << begin_bit);
    auto sort = [=] {
      std::vector<size_t> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return (keys_in[a] & bits) < (keys_in[b] & bits);
      });
      std::vector<Key> keys(order.size());
      std::vector<Value> values(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    };
    // Its argument words (Note [The bytes a launch's arguments name]): the buffers it reads
    // and writes, and its temporary storage, as a real sort's kernels use it.
    const cudaError_t refused = ::loom::cuda_emulation::submit(
        stream, ::loom::cuda_emulation::WorkKind::kKernel, "cub::DeviceRadixSort::SortPairs", sort,
        {{keys_in, true},
         {keys_out, false},
         {values_in, true},
         {values_out, false},
         {temp, false}});
    return refused != cudaSuccess ? refused : ::loom::cuda_emulation::device_error();
  }
};

}  // namespace cub
