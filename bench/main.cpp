// loom_bench's entry point: Google Benchmark's, with reporters that put each kernel's rate
// beside this core's limit (Note [Roofline] in roofline.cpp).

#include <string_view>

#include "bench/roofline.h"

int main(int argc, char** argv) {
  // Google Benchmark opens --benchmark_out itself; a file reporter of our own may be given
  // only when that flag is there. JSON is its default format; other formats stay plain.
  // --benchmark_format chooses the display's format in the same way.
  bool json_file = false, other_file_format = false, json_display = false, other_display = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--benchmark_out=")) json_file = true;
    if (arg.starts_with("--benchmark_out_format=") && arg != "--benchmark_out_format=json")
      other_file_format = true;
    if (arg == "--benchmark_format=json") json_display = true;
    if (arg.starts_with("--benchmark_format=") && !json_display && arg != "--benchmark_format=console")
      other_display = true;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto display = other_display  ? nullptr
                 : json_display ? loom::bench::make_json_reporter()
                                : loom::bench::make_console_reporter();
  auto file = json_file && !other_file_format ? loom::bench::make_json_reporter() : nullptr;
  benchmark::RunSpecifiedBenchmarks(display.get(), file.get());
  benchmark::Shutdown();
  return 0;
}
