#pragma once
// Softmax over rows and the fused softmax + cross-entropy.

#include <cstdint>

#include "kernels/cpu/widen.h"
#include "kernels/part.h"

namespace loom::kernels::cpu {

// y = softmax(x) per row of `width`. With causal_t > 0, rows are rows of [.., T, T] blocks
// (T = causal_t = width): row r may attend to columns 0..(r mod T); the rest get 0.
template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t width, int64_t causal_t);
// dx = y * (dy - sum(dy * y)) per row.
template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t width);

// Per-row loss = logsumexp(row) - row[target]; returns the mean over rows (accumulated in
// double) and stores each row's logsumexp for backward. Also for BFloat16 and Half logits,
// computed in f32 with an f32 logsumexp (kernels/cpu/widen.h).
template <typename S>
double cross_entropy_forward(const S* logits, const int64_t* targets, compute_of<S>* logsumexp,
                             int64_t rows, int64_t vocab);
// Per row of a part: the logsumexp of its logits, and the target's logit where the target falls
// in the part, else 0 (picked). Summed over the parts as logsumexps and logits, they give the
// whole row's loss (nn::parallel_cross_entropy).
template <typename S>
void cross_entropy_part_forward(const S* logits, const int64_t* targets, int64_t first,
                                compute_of<S>* logsumexp, compute_of<S>* picked, int64_t rows,
                                int64_t vocab);
// dlogits = scale * (softmax(logits) - onehot(target)), scale = dloss / rows, each rounded
// once to S, with `logsumexp` the whole row's (of a part of the classes, [first, first + vocab)
// of each row: no onehot for a target outside it).
// dlogits may be logits.
template <typename S>
void cross_entropy_backward(const S* logits, const int64_t* targets,
                            const compute_of<S>* logsumexp, compute_of<S> scale, S* dlogits,
                            int64_t rows, int64_t vocab, Part part = {});

}  // namespace loom::kernels::cpu
