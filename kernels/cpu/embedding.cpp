#include "kernels/cpu/embedding.h"

#include <cstring>

namespace loom::kernels::cpu {

template <typename T>
void embedding_forward(const int64_t* indices, const T* weight, T* out, int64_t count,
                       int64_t width) {
  for (int64_t n = 0; n < count; ++n) {
    std::memcpy(out + n * width, weight + indices[n] * width, sizeof(T) * width);
  }
}

template <typename T>
void embedding_backward(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                        int64_t width) {
  for (int64_t n = 0; n < count; ++n) {
    T* dst = dweight + indices[n] * width;
    const T* src = dout + n * width;
    for (int64_t i = 0; i < width; ++i)
      dst[i] += src[i];
  }
}

template void embedding_forward<float>(const int64_t*, const float*, float*, int64_t, int64_t);
template void embedding_forward<double>(const int64_t*, const double*, double*, int64_t, int64_t);
template void embedding_backward<float>(const int64_t*, const float*, float*, int64_t, int64_t);
template void embedding_backward<double>(const int64_t*, const double*, double*, int64_t, int64_t);

}  // namespace loom::kernels::cpu
