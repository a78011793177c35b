// Recursive halving-doubling allreduce (Rabenseifner; Thakur, Rabenseifner & Gropp 2005).
//
// With p = the largest power of two <= size and extra = size - p:
//  1. Fold: of the first 2*extra ranks, each even rank sends its whole buffer to the odd
//     rank above it, which adds it in; the even ranks then wait. p ranks remain, numbered
//     v = 0..p-1 (odd rank r < 2*extra is v = r/2, rank r >= 2*extra is v = r - extra).
//  2. Reduce-scatter by recursive halving over p blocks: at distance d = p/2, ..., 1, v and
//     v^d split their common window of 2d blocks; each keeps the half holding block v and
//     adds the partner's copy of it. v ends owning the full reduction of block v.
//  3. All-gather by recursive doubling: d = 1, ..., p/2, swap windows with v^d.
//  4. Unfold: the odd ranks send the result to the even rank below them.
// 2 log2(p) steps (+2 with a non-power-of-two size), each rank sends about twice its
// buffer in total (+1 buffer for the folded pairs).

#include <algorithm>
#include <vector>

#include "comm/algorithms/algorithms_impl.h"
#include "reference_algorithms/reference_algorithms.h"

namespace loom::comm::algorithms {

using detail::at;
using detail::Chunks;
using detail::exchange;
using kernels::cpu::ReduceKind;

void halving_doubling_allreduce(Transport& transport, void* data, size_t count, DType type,
                                ReduceOp op, Deadline deadline) {
  const ReduceKind kind = detail::reduce_kind(op, type, "halving_doubling_allreduce");
  detail::check_args(transport, count, data, data, "halving_doubling_allreduce");
  const int size = transport.size();
  const int rank = transport.rank();
  if (count == 0 || size == 1) return;

  const size_t es = dtype_size(type);
  const size_t bytes = count * es;
  int p = 1;
  while (p * 2 <= size)
    p *= 2;
  const int extra = size - p;
  const bool folded_pair = rank < 2 * extra;
  std::vector<std::byte> incoming;

  // 1. Fold.
  int v = rank - extra;
  if (folded_pair) {
    if (rank % 2 == 0) {
      transport.send(data, bytes, rank + 1, deadline);
      v = -1;
    } else {
      incoming.resize(bytes);
      transport.recv(incoming.data(), bytes, rank - 1, deadline);
      kernels::cpu::reduce_into(type, kind, data, incoming.data(), count);
      v = rank / 2;
    }
  }

  if (v >= 0) {
    const auto real = [extra](int w) { return w < extra ? 2 * w + 1 : w + extra; };
    const Chunks blocks(count, p);
    const auto span_bytes = [&](int lo, int hi) {
      return (blocks.begin(hi) - blocks.begin(lo)) * es;
    };
    // The first half of the blocks is the largest window ever received.
    incoming.resize(std::max(incoming.size(), span_bytes(0, p / 2)));

    // 2. Reduce-scatter; [lo, lo + 2d) is the window shared with v^d.
    int lo = 0;
    for (int d = p / 2; d >= 1; d /= 2) {
      const int partner = v ^ d;
      const int keep = (v & d) ? lo + d : lo;
      const int give = (v & d) ? lo : lo + d;
      exchange(transport, at(data, blocks.begin(give), es), span_bytes(give, give + d),
               real(partner), incoming.data(), span_bytes(keep, keep + d), real(partner), deadline);
      kernels::cpu::reduce_into(type, kind, at(data, blocks.begin(keep), es), incoming.data(),
                                blocks.begin(keep + d) - blocks.begin(keep));
      lo = keep;
    }

    // lo == v: this rank owns block v and alone finishes Avg, so all ranks get the same bits.
    detail::finish_avg(op, type, at(data, blocks.begin(v), es), blocks.size(v), size);

    // 3. All-gather; this rank holds [lo, lo + d), the partner the aligned window next to it.
    for (int d = 1; d < p; d *= 2) {
      const int partner = v ^ d;
      const int other = lo ^ d;
      exchange(transport, at(data, blocks.begin(lo), es), span_bytes(lo, lo + d), real(partner),
               at(data, blocks.begin(other), es), span_bytes(other, other + d), real(partner),
               deadline);
      lo = std::min(lo, other);
    }
  }

  // 4. Unfold.
  if (folded_pair) {
    if (rank % 2 == 0) {
      transport.recv(data, bytes, rank + 1, deadline);
    } else {
      transport.send(data, bytes, rank - 1, deadline);
    }
  }
}

}  // namespace loom::comm::algorithms
