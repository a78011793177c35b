// The blocked reduction loops of reduce_ops.cpp, written once over a vector-traits type and
// compiled once per instruction set. Deliberately no include guard: reduce_ops.cpp includes
// this file three times, each time inside its own namespace and target region
// (see Note [One kernel, three instruction sets] there). Include it from nowhere else.
//
// A traits type V (one per element type and instruction set) provides: `F` (a register's
// worth of accumulators, or one accumulator), `Acc` (the accumulator's scalar type), `kWidth`
// (elements per F), `kUnroll` (F values per loop iteration; vector traits only), `Scalar` (the
// one-element traits with the same arithmetic, for loop tails), `set1`, `load_acc`/`store_acc` (the
// accumulator buffer, in F's own element order), `load(const E*)` (widen kWidth elements),
// `store(E*, F)` (canonicalise NaN, round to E), and `add`, `mul`, `min`, `max` (see Note
// [Reduction semantics] in reduce_ops.cpp). The enclosing namespace provides `Ops<E>`, the traits
// of the f32 family for its instruction set.

template <class V, ReduceKind K>
[[gnu::always_inline]] inline typename V::F combine(typename V::F a, typename V::F b) {
  if constexpr (K == ReduceKind::Sum) {
    return V::add(a, b);
  } else if constexpr (K == ReduceKind::Prod) {
    return V::mul(a, b);
  } else if constexpr (K == ReduceKind::Min) {
    return V::min(a, b);
  } else {
    return V::max(a, b);
  }
}

// Elements [i, i + U * kWidth) of one pass: x = (acc or p[0]) op p[..] op ... op p[A - 1], then
// either back into acc, or scaled and rounded into out (with non-temporal stores if Stream).
// Every load of the step comes before its first store, so `out` may be one of the inputs.
template <class T, class E, ReduceKind K, int A, bool FromAcc, bool ToOut, bool Scaled, bool Stream,
          int U>
[[gnu::always_inline]] inline void step(typename T::Acc* acc, const E* const* p, E* out, size_t i,
                                        typename T::F scale) {
  using F = typename T::F;
  constexpr size_t W = T::kWidth;
  F x[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    if constexpr (FromAcc) {
      x[u] = T::load_acc(acc + i + u * W);
    } else {
      x[u] = T::load(p[0] + i + u * W);
    }
  }
#pragma GCC unroll 4
  for (int j = FromAcc ? 0 : 1; j < A; ++j) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u)
      x[u] = combine<T, K>(x[u], T::load(p[j] + i + u * W));
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    if constexpr (ToOut) {
      if constexpr (Scaled) x[u] = T::mul(x[u], scale);
      if constexpr (Stream) {
        T::stream(out + i + u * W, x[u]);
      } else {
        T::store(out + i + u * W, x[u]);
      }
    } else {
      T::store_acc(acc + i + u * W, x[u]);
    }
  }
}

// Elements before out's next 64-byte boundary, which a streaming pass does one by one since
// non-temporal stores need aligned addresses (the caller checks out is aligned to sizeof(E)).
template <class E>
size_t unaligned_head(const E* out, size_t m) {
  size_t misaligned = reinterpret_cast<uintptr_t>(out) % 64;
  size_t head = misaligned == 0 ? 0 : (64 - misaligned) / sizeof(E);
  return head < m ? head : m;
}

// One pass over m elements: `head` elements one by one, then kUnroll registers per iteration,
// then one, then a scalar tail. Every pass over an accumulator block must use the same head, since
// the vector traits may keep the accumulator in their own element order.
template <class V, class E, ReduceKind K, int A, bool FromAcc, bool ToOut, bool Scaled,
          bool Stream = false>
[[gnu::noinline]] void pass(typename V::Acc* acc, const E* const* in, E* out, size_t m, size_t head,
                            typename V::Acc scale) {
  using S = typename V::Scalar;
  constexpr size_t W = V::kWidth;
  static_assert(W <= 64, "one_by_one covers at most 64 elements (heads are shorter too)");
  const E* p[A];
  for (int j = 0; j < A; ++j)
    p[j] = in[j];
  // One element at a time over [i, end). In the vector variants that is a head or a tail of
  // fewer than 64 elements; the early exit keeps GCC from vectorising these loops a second
  // time (code size and compile time). The scalar variant's main loop is left to vectorise.
  auto one_by_one = [&](size_t i, size_t end) {
    if constexpr (W > 1) {
#pragma GCC unroll 1
      for (int r = 0; r < 64; ++r, ++i) {
        if (i >= end) break;
        step<S, E, K, A, FromAcc, ToOut, Scaled, false, 1>(acc, p, out, i, scale);
      }
    } else {
      for (; i < end; ++i)
        step<S, E, K, A, FromAcc, ToOut, Scaled, false, 1>(acc, p, out, i, scale);
    }
  };
  one_by_one(0, head);
  size_t i = head;
  if constexpr (W > 1) {
    typename V::F vscale = V::set1(scale);
    constexpr int U = V::kUnroll;
    for (; i + U * W <= m; i += U * W)
      step<V, E, K, A, FromAcc, ToOut, Scaled, Stream, U>(acc, p, out, i, vscale);
    for (; i + W <= m; i += W)
      step<V, E, K, A, FromAcc, ToOut, Scaled, Stream, 1>(acc, p, out, i, vscale);
  }
  one_by_one(i, m);
}

// Final pass from the accumulator with the last 1 to 4 inputs, or the whole reduction of
// 1 to 4 inputs in one pass (FromAcc = false, acc unused).
template <class V, class E, ReduceKind K, bool FromAcc, bool Scaled, bool Stream>
void last_pass(typename V::Acc* acc, const E* const* p, size_t inputs, E* out, size_t m,
               size_t head, typename V::Acc scale) {
  switch (inputs) {
    case 1: return pass<V, E, K, 1, FromAcc, true, Scaled, Stream>(acc, p, out, m, head, scale);
    case 2: return pass<V, E, K, 2, FromAcc, true, Scaled, Stream>(acc, p, out, m, head, scale);
    case 3: return pass<V, E, K, 3, FromAcc, true, Scaled, Stream>(acc, p, out, m, head, scale);
    default: return pass<V, E, K, 4, FromAcc, true, Scaled, Stream>(acc, p, out, m, head, scale);
  }
}

// Note [Blocked reduction]. Up to four inputs go straight into `out` in one pass. More
// inputs are reduced block by block: an accumulator block that stays in L1/L2 takes inputs
// 0-3, then 4-7, ..., and the pass with the last inputs rounds into out. Each input and out
// cross memory once, at most five streams are live at a time, and out is written only after
// every input of the block was read, which is what makes aliasing an input safe.
template <class V, class E, ReduceKind K, bool Scaled, bool Stream>
void reduce_blocks(E* out, const void* const* inputs, size_t count, size_t n,
                   typename V::Acc scale) {
  constexpr size_t kBlock = 8192;
  alignas(64) typename V::Acc acc[kBlock];
  const E* p[4];
  auto gather = [&](size_t first, size_t k, size_t offset) {
    for (size_t j = 0; j < k; ++j)
      p[j] = static_cast<const E*>(inputs[first + j]) + offset;
  };
  for (size_t b = 0; b < n; b += kBlock) {
    size_t m = n - b < kBlock ? n - b : kBlock;
    size_t head = Stream ? unaligned_head(out + b, m) : 0;
    gather(0, 4, b);
    pass<V, E, K, 4, false, false, false>(acc, p, nullptr, m, head, scale);
    size_t k = 4;
    for (; count - k > 4; k += 4) {
      gather(k, 4, b);
      pass<V, E, K, 4, true, false, false>(acc, p, nullptr, m, head, scale);
    }
    gather(k, count - k, b);
    last_pass<V, E, K, true, Scaled, Stream>(acc, p, count - k, out + b, m, head, scale);
  }
}

template <class V, class E, ReduceKind K, bool Scaled, bool Stream>
void reduce_all(E* out, const void* const* inputs, size_t count, size_t n, typename V::Acc scale) {
  if (count <= 4) {
    const E* p[4];
    for (size_t j = 0; j < count; ++j)
      p[j] = static_cast<const E*>(inputs[j]);
    size_t head = Stream ? unaligned_head(out, n) : 0;
    last_pass<V, E, K, false, Scaled, Stream>(nullptr, p, count, out, n, head, scale);
  } else {
    reduce_blocks<V, E, K, Scaled, Stream>(out, inputs, count, n, scale);
  }
  // Non-temporal stores are weakly ordered: fence them before whatever signals completion.
  if constexpr (Stream) _mm_sfence();
}

// `stream` selects non-temporal stores (vector variants only; see Note [Streaming stores]).
// Streaming reductions are bound by memory, so they always multiply, by 1 when unscaled
// (exact for every number; NaN is made canonical afterwards either way): one variant less.
template <class V, class E, ReduceKind K>
void reduce_kind(E* out, const void* const* inputs, size_t count, size_t n, typename V::Acc scale,
                 bool scaled, bool stream) {
  if constexpr (V::kWidth > 1) {
    if (stream) {
      return reduce_all<V, E, K, true, true>(out, inputs, count, n,
                                             scaled ? scale : typename V::Acc{1});
    }
  }
  if constexpr (V::kFloating) {
    if (scaled) return reduce_all<V, E, K, true, false>(out, inputs, count, n, scale);
  }
  reduce_all<V, E, K, false, false>(out, inputs, count, n, scale);
}

template <class V, class E>
void reduce_typed(ReduceKind kind, void* out, const void* const* inputs, size_t count, size_t n,
                  typename V::Acc scale, bool scaled, bool stream) {
  E* o = static_cast<E*>(out);
  switch (kind) {
    case ReduceKind::Sum:
      return reduce_kind<V, E, ReduceKind::Sum>(o, inputs, count, n, scale, scaled, stream);
    case ReduceKind::Prod:
      return reduce_kind<V, E, ReduceKind::Prod>(o, inputs, count, n, scale, scaled, stream);
    case ReduceKind::Min:
      return reduce_kind<V, E, ReduceKind::Min>(o, inputs, count, n, scale, scaled, stream);
    case ReduceKind::Max:
      return reduce_kind<V, E, ReduceKind::Max>(o, inputs, count, n, scale, scaled, stream);
  }
}

// f32, bf16 and f16 (all accumulate in f32) with this instruction set's traits `Ops<E>`.
void reduce_f32_family(DType type, ReduceKind kind, void* out, const void* const* inputs,
                       size_t count, size_t n, float scale, bool scaled, bool stream) {
  switch (type) {
    case DType::F32:
      return reduce_typed<Ops<float>, float>(kind, out, inputs, count, n, scale, scaled, stream);
    case DType::BF16:
      return reduce_typed<Ops<Bf16>, Bf16>(kind, out, inputs, count, n, scale, scaled, stream);
    default:
      return reduce_typed<Ops<Half>, Half>(kind, out, inputs, count, n, scale, scaled, stream);
  }
}
