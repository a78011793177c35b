#pragma once
// Progress output of train_gpt: a one-line bar redrawn in place on a terminal, plain lines
// (every `interval` steps and the last) when the output is a file or a pipe.

#include <cstdint>
#include <cstdio>

namespace loom::train_gpt {

class Progress {
 public:
  // `out` is written to; `terminal` selects the bar (usually isatty(fileno(out))).
  Progress(std::FILE* out, bool terminal, int64_t total_steps, int64_t interval);
  void update(int64_t step, double loss, double tokens_per_s, double lr);
  // Ends the bar's line.
  void finish();

 private:
  std::FILE* out_;
  bool terminal_;
  int64_t total_, interval_;
};

}  // namespace loom::train_gpt
