#include "tools/train_gpt/progress.h"

#include <string>

namespace loom::train_gpt {

Progress::Progress(std::FILE* out, bool terminal, int64_t total_steps, int64_t interval)
    : out_(out), terminal_(terminal), total_(total_steps), interval_(interval > 0 ? interval : 1) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, double lr) {
  int64_t done = step + 1;
  if (terminal_) {
    constexpr int kWidth = 30;
    int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    // \r returns to the line start, \033[K clears what a longer previous line left.
    std::fprintf(out_, "\r[%s] step %lld/%lld  loss %.4f  %.0f tok/s  lr %.2e\033[K", bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), loss, tokens_per_s,
                 lr);
  } else if (step % interval_ == 0 || done == total_) {
    std::fprintf(out_, "step %lld/%lld loss %.4f tokens/s %.0f lr %.3e\n",
                 static_cast<long long>(done), static_cast<long long>(total_), loss, tokens_per_s,
                 lr);
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (terminal_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace loom::train_gpt
